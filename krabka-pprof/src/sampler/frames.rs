//! A recorded stack as profile frames, off the signal path: the seam between what the
//! handler writes (`buffer.rs`: addresses and flags) and what `profile.rs` builds. Shared by
//! CPU windows and thread dumps.

use super::buffer::{FLAG_BLOCKLISTED, FLAG_NO_SCRATCH, FLAG_NO_STACK_READ, FLAG_TRUNCATED};
use crate::objects::Objects;
use crate::profile::Frame;

/// A stack the sampler recorded (leaf first) as profile frames: return addresses minus
/// one, so that each lands inside its call, then a marker for each of `flags` (`FLAG_*`)
/// saying why the stack is shorter than the thread's. A return address of zero ends the
/// stack: code without unwind tables (musl's libc, in a static binary) leaves the unwinder
/// guessing its caller from a stack word, and a zero there is no caller.
pub(crate) fn stack_frames(addresses: &[u64], flags: u8, objects: &Objects) -> Vec<Frame> {
    let mut frames: Vec<Frame> = addresses
        .iter()
        .enumerate()
        .take_while(|&(i, &address)| i == 0 || address != 0)
        // Return addresses point after the call; minus one lands inside it.
        .map(|(i, &address)| Frame::Code(if i == 0 { address } else { address - 1 }))
        .collect();
    if flags & FLAG_BLOCKLISTED != 0 {
        let library = addresses
            .first()
            .and_then(|pc| objects.find(*pc))
            .map_or("a blocklisted library", |(_, o)| o.short_name());
        frames.push(Frame::Marker(format!(
            "[{library}: blocklisted, not unwound]"
        )));
    }
    if flags & FLAG_NO_SCRATCH != 0 {
        frames.push(Frame::Marker(
            "[not unwound: sampler busy on other threads]".into(),
        ));
    }
    if flags & FLAG_NO_STACK_READ != 0 {
        frames.push(Frame::Marker(
            "[not unwound: the stack cannot be read here]".into(),
        ));
    }
    if flags & FLAG_TRUNCATED != 0 {
        frames.push(Frame::Marker("[truncated]".into()));
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_return_address_ends_the_stack() {
        let objects = Objects::current();
        assert_eq!(
            stack_frames(&[0x1234, 0x2001, 0, 0x3001], 0, &objects),
            [Frame::Code(0x1234), Frame::Code(0x2000)],
        );
        assert_eq!(stack_frames(&[0], 0, &objects), [Frame::Code(0)]);
    }
}
