//! A recorded stack as profile frames, off the signal path: the seam between what the
//! handler writes (`buffer.rs`: addresses and flags) and what `profile.rs` builds. Shared by
//! CPU windows and thread dumps. Also where a stack loses the callers the unwinder guessed
//! ([`trusted_len`]), before a drain files it and before a dump answers with it.

use std::collections::HashMap;

use super::buffer::{
    FLAG_BLOCKLISTED, FLAG_CALLERS_UNKNOWN, FLAG_FILTERED, FLAG_NO_SCRATCH, FLAG_NO_STACK_READ,
    FLAG_STACK_UNREAD, FLAG_TRUNCATED, StackKey, Tally,
};
use super::dump::Stack;
use super::unwind::Unwinding;
use crate::objects::Objects;
use crate::profile::Frame;

/// How many of `frames` (a stack as unwound, leaf first) are known, not guessed, and
/// whether the last of those lies in code no unwind table covers, so that its callers
/// are unknown. All of them are known unless one lies in the code of a loaded object
/// whose unwind tables do not cover it ([`Unwinding::covers`]): framehop unwinds out of
/// such a frame by the frame pointer (or, in the leaf, takes the word at the stack
/// pointer for the return address), and code without unwind tables (musl's libc in a
/// static binary, hand-written assembly) seldom keeps one, so its callers would be
/// whatever the stack held, shown as if they had called it. The stack ends with that
/// frame. On x86_64 a leaf's caller read at the stack pointer is kept when it is a return
/// address (just after a call instruction in loaded code): a leaf that pushed nothing, as
/// a system call wrapper, returns there. Code in no loaded object at all (a JIT's, a
/// trampoline in anonymous memory) is cut the same way; code of an object whose tables
/// cannot be searched is left as unwound. A return address of zero ends the stack, as in
/// [`stack_frames`].
pub(crate) fn trusted_len(
    frames: &[u64],
    unwinding: &Unwinding,
    objects: &Objects,
) -> (usize, bool) {
    for (i, &address) in frames.iter().enumerate() {
        if i > 0 && address == 0 {
            return (i, false);
        }
        // Return addresses point after the call; minus one lands inside it.
        let code = if i == 0 {
            address
        } else {
            address.wrapping_sub(1)
        };
        // Code in no loaded object (a JIT's, a trampoline in anonymous memory) has no
        // tables either: its callers were guessed as well.
        if unwinding.covers(code) != Some(false) && objects.find(code).is_some() {
            continue;
        }
        let caller = frames.get(i + 1).copied().filter(|&caller| caller != 0);
        if i == 0 && caller.is_some_and(|caller| leaf_returns_to(unwinding, objects, caller)) {
            continue;
        }
        return (i + 1, true);
    }
    (frames.len(), false)
}

/// Whether a leaf without unwind tables returns to `caller`, the word at its stack pointer.
#[cfg(target_arch = "x86_64")]
fn leaf_returns_to(unwinding: &Unwinding, objects: &Objects, caller: u64) -> bool {
    super::asleep::is_return_address(unwinding, objects, caller)
}

/// Whether a leaf without unwind tables returns to `caller`: not known here (on aarch64
/// framehop takes the link register, which a function that has called since holds stale).
#[cfg(not(target_arch = "x86_64"))]
fn leaf_returns_to(_unwinding: &Unwinding, _objects: &Objects, _caller: u64) -> bool {
    false
}

/// The flags of a stack that was never unwound (its PC alone, and why): nothing to cut,
/// and its marker already says why its callers are missing.
const NOT_UNWOUND: u8 = FLAG_BLOCKLISTED | FLAG_NO_SCRATCH | FLAG_NO_STACK_READ;

/// The flags of where a stack ends above a frame no unwind table covers: a cut there
/// replaces them.
const CUT_HIGHER: u8 = FLAG_TRUNCATED | FLAG_STACK_UNREAD;

/// `stack` without the callers the unwinder guessed ([`trusted_len`]), marked
/// [`FLAG_CALLERS_UNKNOWN`] and not whole if it ends in code no unwind table covers.
pub(crate) fn drop_guessed_callers(stack: &mut Stack, unwinding: &Unwinding, objects: &Objects) {
    if stack.flags & NOT_UNWOUND != 0 {
        return;
    }
    let (keep, unknown) = trusted_len(&stack.frames, unwinding, objects);
    if unknown {
        stack.frames.truncate(keep);
        // What was cut includes where a stack too deep was cut.
        stack.flags = stack.flags & !CUT_HIGHER | FLAG_CALLERS_UNKNOWN;
        stack.complete = false;
    }
}

/// [`drop_guessed_callers`] for every stack of a drain: a cut stack is filed under its
/// known frames, with whatever else was cut to the same. Each address is looked up once
/// per unwinder ([`Unwinding::covers`]), so a drain of stacks seen before costs a map
/// lookup per frame.
pub(crate) fn drop_guessed_callers_of_all(
    stacks: &mut HashMap<StackKey, Tally>,
    unwinding: &Unwinding,
    objects: &Objects,
) {
    let cut: Vec<(StackKey, usize)> = stacks
        .keys()
        .filter(|key| key.flags & NOT_UNWOUND == 0)
        .filter_map(|key| {
            let (keep, unknown) = trusted_len(&key.frames, unwinding, objects);
            unknown.then(|| (key.clone(), keep))
        })
        .collect();
    for (key, keep) in cut {
        let Some(tally) = stacks.remove(&key) else {
            continue;
        };
        let known = StackKey {
            flags: key.flags & !CUT_HIGHER | FLAG_CALLERS_UNKNOWN,
            frames: key.frames[..keep].into(),
            ..key
        };
        let sum = stacks.entry(known).or_default();
        sum.samples += tally.samples;
        sum.periods += tally.periods;
    }
}

/// A stack the sampler recorded (leaf first) as profile frames: return addresses minus
/// one, so that each lands inside its call, then a marker for each of `flags` (`FLAG_*`)
/// saying why the stack is shorter than the thread's. A return address of zero ends the
/// stack: code in no object's unwind tables leaves the unwinder guessing its caller from
/// a stack word, and a zero there is no caller (code in an object's, but not covered by
/// them, was cut before: [`trusted_len`]).
pub(crate) fn stack_frames(addresses: &[u64], flags: u8, objects: &Objects) -> Vec<Frame> {
    let mut frames: Vec<Frame> = addresses
        .iter()
        .enumerate()
        .take_while(|&(i, &address)| i == 0 || address != 0)
        // Return addresses point after the call; minus one lands inside it.
        .map(|(i, &address)| Frame::Code(if i == 0 { address } else { address - 1 }))
        .collect();
    if flags & FLAG_CALLERS_UNKNOWN != 0 {
        let object = match frames.last() {
            Some(Frame::Code(address)) => objects.find(*address),
            _ => None,
        };
        let object = object.map_or("this code", |(_, o)| o.short_name());
        frames.push(Frame::Marker(format!(
            "[callers unknown: no unwind table covers {object} here]"
        )));
    }
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
    if flags & FLAG_FILTERED != 0 {
        frames.push(Frame::Marker(
            "[callers not read: this thread has a seccomp filter of its own]".into(),
        ));
    }
    if flags & FLAG_STACK_UNREAD != 0 {
        frames.push(Frame::Marker(
            "[stack ends here: a switch of stacks, or a next frame that cannot be read]".into(),
        ));
    }
    if flags & FLAG_TRUNCATED != 0 {
        frames.push(Frame::Marker("[truncated]".into()));
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::super::memory::Memory;
    use super::*;

    // Code no unwind table covers: assembly without CFI directives, a call whose return
    // address follows it; just before it, a function with unwind tables whose last
    // instruction is a call, so that its return address is the uncovered one's first byte.
    #[cfg(target_arch = "x86_64")]
    std::arch::global_asm!(
        ".text",
        "krabka_frames_test_tabled:",
        ".cfi_startproc",
        "nop",
        "call krabka_frames_test_untabled",
        ".cfi_endproc",
        ".globl krabka_frames_test_untabled",
        "krabka_frames_test_untabled:",
        "nop",
        "call krabka_frames_test_untabled",
        ".globl krabka_frames_test_untabled_return",
        "krabka_frames_test_untabled_return:",
        "ret",
    );

    #[cfg(target_arch = "x86_64")]
    unsafe extern "C" {
        fn krabka_frames_test_untabled();
        fn krabka_frames_test_untabled_return();
    }

    /// Addresses of this test binary: inside a Rust function (covered), as a PC and as a
    /// return address; inside the assembly (not covered), as a PC, and its return address
    /// (just after a call).
    #[cfg(target_arch = "x86_64")]
    fn addresses() -> (u64, u64, u64, u64) {
        let rust = trusted_len as *const () as u64;
        let untabled = krabka_frames_test_untabled as *const () as u64;
        let returns = krabka_frames_test_untabled_return as *const () as u64;
        (rust + 4, rust + 5, untabled + 1, returns)
    }

    /// The first byte of the uncovered code: a PC there is uncovered, and a return address
    /// there returns from the covered function's last call.
    #[cfg(target_arch = "x86_64")]
    fn untabled_start() -> u64 {
        krabka_frames_test_untabled as *const () as u64
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn unwind_tables_cover_rust_code_and_not_assembly_without_cfi() {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let (rust, _, untabled, returns) = addresses();
        assert_eq!(unwinding.covers(rust), Some(true));
        assert_eq!(unwinding.covers(untabled), Some(false));
        assert_eq!(unwinding.covers(returns - 1), Some(false));
        assert_eq!(unwinding.covers(untabled_start()), Some(false));
        assert_eq!(
            unwinding.covers(untabled_start() - 1),
            Some(true),
            "the call before"
        );
        assert_eq!(unwinding.covers(8), None, "no object there");
        assert_eq!(
            unwinding.covers(untabled),
            Some(false),
            "remembered, the same"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_stack_ends_at_the_first_frame_no_unwind_table_covers() {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let (rust, rust_return, untabled, returns) = addresses();
        let len = |frames: &[u64]| trusted_len(frames, &unwinding, &objects);
        assert_eq!(
            len(&[rust, rust_return, rust_return]),
            (3, false),
            "all covered"
        );
        assert_eq!(
            len(&[rust, returns, rust_return, 7]),
            (2, true),
            "cut after it"
        );
        assert_eq!(
            len(&[rust, rust_return, returns]),
            (3, true),
            "uncovered, the last"
        );
        assert_eq!(
            len(&[rust, returns, 0, 7]),
            (2, true),
            "uncovered before a zero"
        );
        assert_eq!(
            len(&[rust, rust_return, 0, 7]),
            (2, false),
            "a zero ends it"
        );
        // A leaf in uncovered code: its caller was read at the stack pointer, kept when
        // it follows a call.
        assert_eq!(
            len(&[untabled, rust_return, rust_return]),
            (1, true),
            "not a return"
        );
        assert_eq!(
            len(&[untabled, returns, rust_return]),
            (2, true),
            "a return, uncovered"
        );
        assert_eq!(
            len(&[untabled, rust_return - 1]),
            (1, true),
            "not a return, last"
        );
        assert_eq!(len(&[untabled]), (1, true), "alone");
        assert_eq!(
            len(&[8, 16, 24]),
            (1, true),
            "code in no object (a JIT's): its callers were guessed, cut"
        );
        assert_eq!(
            len(&[rust, 16, rust_return]),
            (2, true),
            "a caller in no object: cut after it"
        );
        assert_eq!(
            len(&[0, rust_return]),
            (1, true),
            "a leaf at zero is a frame, in no object: a caller that follows no call is cut"
        );
        // A PC is looked up where it is, a return address one byte before: in the call.
        let start = untabled_start();
        assert_eq!(
            len(&[rust, start, rust_return]),
            (3, false),
            "returns after a call"
        );
        assert_eq!(
            len(&[start, rust_return]),
            (1, true),
            "a PC at the first byte"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_drain_files_cut_stacks_under_their_known_frames_marked() {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let (rust, rust_return, _, returns) = addresses();
        let key = |flags, frames: &[u64]| StackKey {
            tid: 3,
            flags,
            labels: Default::default(),
            frames: frames.into(),
        };
        let tally = |samples, periods| Tally { samples, periods };
        let mut stacks = HashMap::from([
            (key(0, &[rust, returns, 100]), tally(1, 2)),
            (key(FLAG_TRUNCATED, &[rust, returns, 200]), tally(3, 4)),
            (key(0, &[rust, rust_return]), tally(5, 6)),
            (key(FLAG_NO_SCRATCH, &[returns - 1]), tally(7, 8)),
        ]);
        let mut stack = Stack {
            frames: vec![rust, returns, 100],
            flags: FLAG_TRUNCATED,
            complete: true,
        };
        drop_guessed_callers(&mut stack, &unwinding, &objects);
        assert_eq!(
            stack,
            Stack {
                frames: vec![rust, returns],
                flags: FLAG_CALLERS_UNKNOWN,
                complete: false,
            }
        );
        let mut refused = Stack {
            frames: vec![returns - 1],
            flags: FLAG_BLOCKLISTED,
            complete: true,
        };
        let before = refused.clone();
        drop_guessed_callers(&mut refused, &unwinding, &objects);
        assert_eq!(refused, before, "a stack never unwound is left as it is");
        let once = stack.clone();
        drop_guessed_callers(&mut stack, &unwinding, &objects);
        assert_eq!(stack, once, "cut twice is cut once");
        drop_guessed_callers_of_all(&mut stacks, &unwinding, &objects);
        let expected = HashMap::from([
            (key(FLAG_CALLERS_UNKNOWN, &[rust, returns]), tally(4, 6)),
            (key(0, &[rust, rust_return]), tally(5, 6)),
            (key(FLAG_NO_SCRATCH, &[returns - 1]), tally(7, 8)),
        ]);
        assert_eq!(stacks, expected);
        drop_guessed_callers_of_all(&mut stacks, &unwinding, &objects);
        assert_eq!(stacks, expected, "cut twice is cut once");
        let frames = stack_frames(&[rust, returns], FLAG_CALLERS_UNKNOWN, &objects);
        let name = objects
            .find(returns - 1)
            .map(|(_, o)| o.short_name())
            .unwrap();
        assert_eq!(
            frames,
            [
                Frame::Code(rust),
                Frame::Code(returns - 1),
                Frame::Marker(format!(
                    "[callers unknown: no unwind table covers {name} here]"
                )),
            ]
        );
    }

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
