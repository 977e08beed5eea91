//! A sleeping thread's frame pointer, computed exactly where its stack read asleep stops
//! (`asleep.rs`): the kernel's `syscall` file gives the stack and program counters, not
//! the frame pointer, and a function built with frame pointers (Rust's standard library,
//! C built with `-fno-omit-frame-pointer`) finds its caller through it.
//!
//! At a call, such a function's stack pointer is where its prologue left it: `push rbp;
//! mov rbp, rsp`, then `k` pushes of callee-saved registers and `sub rsp, N`, so that
//! `rbp = rsp + 8k + N`; `rsp` at the call is the callee's canonical frame address, which
//! the callee's unwind table gives from the stack pointer the file gives. That holds
//! exactly for a function whose stack pointer does not move in its body, which is how
//! LLVM and GCC build every function without variable-sized stack allocations (Rust has
//! none). Nothing is found by searching: the prologue is decoded from the function's first
//! bytes, as its unwind table names them, and any other prologue (a stack probe, a
//! realigned stack, an unknown instruction) is refused, leaving the read where it stopped.
//! The result is checked too: the function's unwind table must find its caller at
//! `rbp + 16`, the unwind must go on from there to the stack's outermost frame, and every
//! return address on the way must follow a call (`asleep.rs`).

#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "sleeping threads are read on x86_64 alone")
)]

use super::unwind::Unwinding;
use crate::objects::Objects;

/// DWARF's numbers for x86_64's `rsp` and `rbp`.
const RSP: u16 = 7;
const RBP: u16 = 6;

/// The frame pointer of the function that `return_address` returns into, at that call,
/// given `callee_sp`, the callee's stack pointer at `callee_pc` (the leaf's: where its
/// thread entered the kernel); `None` where it cannot be computed exactly.
pub(crate) fn frame_pointer_at_call(
    unwinding: &Unwinding,
    objects: &Objects,
    callee_pc: u64,
    callee_sp: u64,
    return_address: u64,
) -> Option<u64> {
    // The callee's frame address, from its stack pointer: the caller's stack pointer at
    // the call.
    let (register, offset, _) = unwinding.cfa_rule(callee_pc)?;
    if register != RSP {
        return None;
    }
    let caller_sp = callee_sp.checked_add_signed(offset)?;
    // The caller finds its own caller through the frame pointer, at rbp + 16.
    let (register, offset, start) = unwinding.cfa_rule(return_address - 1)?;
    if register != RBP || offset != 16 {
        return None;
    }
    let mut code = [0u8; 32];
    if !super::asleep::read_code(unwinding, objects, start, &mut code) {
        return None;
    }
    let (pushes, reserved) = decode(&code)?;
    let rbp = caller_sp.checked_add(8 * pushes + reserved)?;
    Some(rbp)
}

/// The callee-saved registers pushed after `mov rbp, rsp`, and the bytes reserved after
/// them, of a function whose code begins with `code`; `None` for any prologue but
/// `[endbr64] push rbp; mov rbp, rsp; push r15..r12, rbx (each at most once); [sub rsp,
/// imm below a page | push rax]`, ended by an instruction of the body.
fn decode(code: &[u8]) -> Option<(u64, u64)> {
    let mut at = 0;
    if code.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        at += 4;
    }
    if code.get(at..at + 4)? != [0x55, 0x48, 0x89, 0xe5] {
        return None;
    }
    at += 4;
    let mut pushed = 0u16;
    loop {
        let register = match code.get(at..)? {
            [0x41, op @ 0x54..=0x57, ..] => {
                at += 2;
                u16::from(8 + (op - 0x50))
            }
            [0x53, ..] => {
                at += 1;
                3
            }
            _ => break,
        };
        if pushed & (1 << register) != 0 {
            return None;
        }
        pushed |= 1 << register;
    }
    let reserved = match code.get(at..)? {
        // LLVM reserves a single slot with `push rax`.
        [0x50, ..] => 8,
        [0x48, 0x83, 0xec, imm, ..] => u64::from(*imm),
        [0x48, 0x81, 0xec, a, b, c, d, ..] => u64::from(u32::from_le_bytes([*a, *b, *c, *d])),
        // A stack probe (`mov eax, N; call __rust_probestack`, or a probing loop) or a
        // realignment (`and rsp, -N`) moves the stack pointer other ways.
        [0x48, 0x81 | 0x83, 0xe4, ..] | [0xb8, ..] | [0x49, 0x89, 0xe3, ..] => return None,
        _ => 0,
    };
    // An imm8 is sign-extended: a negative one would lower the reserve.
    if matches!(code.get(at..at + 3), Some([0x48, 0x83, 0xec])) && reserved >= 0x80 {
        return None;
    }
    // A frame of a page or more is probed page by page (rustc's inline probes, GCC's
    // `-fstack-clash-protection`: `sub rsp, 0x1000`, a store to `[rsp]`, again): the
    // first `sub` is not the whole reserve.
    if reserved >= 4096 {
        return None;
    }
    Some((u64::from(pushed.count_ones()), reserved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_prologues_give_their_pushes_and_reserve_and_others_none() {
        let push_rbp_mov = [0x55, 0x48, 0x89, 0xe5];
        let with = |rest: &[u8]| {
            let mut code = push_rbp_mov.to_vec();
            code.extend_from_slice(rest);
            code.resize(32, 0x90);
            decode(&code)
        };
        assert_eq!(with(&[0x48, 0x83, 0xec, 0x20]), Some((0, 0x20)));
        assert_eq!(
            with(&[
                0x41, 0x57, 0x41, 0x56, 0x53, 0x48, 0x81, 0xec, 0x00, 0x01, 0, 0
            ]),
            Some((3, 0x100))
        );
        assert_eq!(
            with(&[0x53, 0x50]),
            Some((1, 8)),
            "push rax: LLVM's reserve of one slot"
        );
        assert_eq!(with(&[0x53, 0x31, 0xc0]), Some((1, 0)), "no reserve");
        assert_eq!(
            with(&[
                0x48, 0x81, 0xec, 0x00, 0x10, 0, 0, 0x48, 0xc7, 0x04, 0x24, 0, 0, 0, 0
            ]),
            None,
            "an inline stack probe: sub rsp, 0x1000, then a store to [rsp]"
        );
        assert_eq!(with(&[0x53, 0x53]), None, "a register pushed twice");
        assert_eq!(with(&[0x48, 0x83, 0xec, 0x90]), None, "a negative imm8");
        assert_eq!(with(&[0x48, 0x83, 0xe4, 0xc0]), None, "a realigned stack");
        assert_eq!(with(&[0xb8, 0, 0x20, 0, 0]), None, "a stack probe");
        let mut endbr = vec![0xf3, 0x0f, 0x1e, 0xfa];
        endbr.extend_from_slice(&push_rbp_mov);
        endbr.extend_from_slice(&[0x48, 0x83, 0xec, 0x10]);
        endbr.resize(32, 0x90);
        assert_eq!(decode(&endbr), Some((0, 0x10)), "after endbr64");
        let mut without = vec![0x48, 0x83, 0xec, 0x10];
        without.resize(32, 0x90);
        assert_eq!(decode(&without), None, "no frame pointer set up");
    }
}
