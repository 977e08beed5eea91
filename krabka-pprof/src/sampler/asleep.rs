//! A sleeping thread's stack, read by the dump's collector without a signal (off the
//! signal path): a thread asleep in the kernel left the user stack pointer and program
//! counter it entered with in `/proc/self/task/TID/syscall` (`crate::process`), and its
//! stack does not change while it sleeps, so the collector unwinds it from there with the
//! dump's unwinder, reading the stack through the dump's reader (`pread` of
//! `/proc/self/mem`, or `process_vm_readv`: system calls that report unreadable memory,
//! never a plain load). The thread is never interrupted: its `poll`, `epoll_wait`,
//! `nanosleep` or read with a timeout is not cut short with `EINTR`, as a signal cuts it
//! (`SA_RESTART` restarts none of those), and a thread with a seccomp filter of its own
//! makes no system call for it.
//!
//! The thread may wake meanwhile and write over what is being read, so a read counts only
//! if the thread did not run from before its `syscall` file was read to after the unwind:
//! its CPU clock unchanged (a thread that ran, even to fall asleep again at the same place
//! with the same registers, used CPU time). Otherwise it is read again, and after a few
//! tries left to the signal.
//!
//! x86_64 only. The file gives the program counter and the stack pointer, not the frame
//! pointer, and only ptrace gives the other registers. The unwind starts with a frame
//! pointer of 1, a value no frame has: a rule that needs the real one fails, and a frame
//! that saved it on the stack gives it back (0 would be wrong: framehop takes a frame
//! pointer of 0 for the outermost frame, and would call a stack whole that it stopped
//! reading). glibc's system call wrappers keep their frames by the stack pointer, so the
//! leaf always unwinds; a frame above it often needs the frame pointer, since Rust's
//! standard library is built with frame pointers (`futex_wait` above `syscall`,
//! `thread::sleep` above `nanosleep`, a thread's start above frames that never touch the
//! frame pointer). The frame that stopped the unwind then has its frame record looked for
//! on the stack, above where its return address was read: a 16-byte-aligned pair of a saved
//! frame pointer and a return address just after a call instruction in a loaded object, a
//! call of the stopped frame's function where the call's bytes tell (a direct call, through
//! a PLT stub or not, or through a RIP-relative slot, as Rust calls other objects). Memory
//! a frame has not written may still hold a record an exited thread's calls left (glibc
//! hands its stack to a new thread), whose stack unwinds just as whole, to the zeros above:
//! its call is of another function. The lowest record with which the whole stack unwinds to
//! its outermost frame, through return addresses that each follow a call, gives the frame
//! pointer the unwind starts with (the frames below the stopped one never changed it). A
//! function reached by a tail call, whose record's call is of the function that jumped to
//! it, is refused so too, and left to the signal. Every stack read so is held to that: it
//! ends at the first address no call returns to (a leaf in code without unwind tables is
//! unwound by the rule of the function before it, into garbage), and after the first frame
//! no unwind table covers (`frames.rs`), where it counts as whole: a signal would answer
//! the same. A stack that still does not unwind to its outermost frame is asked for with a
//! signal after all, and this part kept in case no answer comes; so are the threads of a
//! glibc built with frame pointers, whose wrappers need it for the leaf itself. On aarch64
//! a leaf function's return address is in the link register and its frame in x29, neither
//! of which the file gives: there every thread is asked with a signal.

#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "on aarch64 every thread is signalled")
)]

use super::dump::Stack;
use super::scratch::{FreshPages, MAX_STACK_COPY, Scratch};
use super::unwind::{Cache, MAX_DEPTH, Unwinding};
use crate::objects::Objects;

/// How often a thread that woke during the read is read again before it is left to the
/// signal.
#[cfg(target_arch = "x86_64")]
const TRIES: usize = 3;
/// How far above the stopped frame's stack pointer its frame record is looked for.
#[cfg(target_arch = "x86_64")]
const RECORD_SCAN: usize = 4096;
/// How many frame records found are tried at most.
#[cfg(target_arch = "x86_64")]
const RECORD_TRIES: usize = 8;

/// What reading a thread without a signal gave.
pub(crate) enum Read {
    /// Its stack, read while it slept: to its outermost frame, or as far as a signal's
    /// answer would go too (a blocklisted leaf, a stack that cannot be read here).
    Whole(Stack),
    /// Read while it slept, but not to its outermost frame.
    Part(Stack),
    /// It runs, woke during every try, or cannot be read so (another architecture, a
    /// `syscall` file that a process that is not dumpable cannot read).
    NotAsleep,
}

/// The collector's working memory for reading threads without a signal: an unwind cache
/// and a stack copy of its own, so that it never takes a scratch slot a handler may need.
pub(crate) struct Asleep {
    scratch: Box<Scratch>,
    /// Threads read whole without a signal so far.
    pub(crate) read: usize,
}

impl Asleep {
    pub(crate) fn new() -> Asleep {
        Asleep {
            scratch: Box::new(Scratch {
                cache: Cache::new_in(),
                stack: FreshPages::new(MAX_STACK_COPY),
                frames: [0; MAX_DEPTH],
            }),
            read: 0,
        }
    }

    /// Reads thread `tid`'s stack, if it sleeps in the kernel, with `unwinding` (over
    /// `objects`).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn read(&mut self, unwinding: &Unwinding, objects: &Objects, tid: u32) -> Read {
        use crate::process::{InKernel, ProcThread, thread_cpu_time};

        // Its own `syscall` file shows the thread that reads it in that `read`.
        if tid == crate::process::current_tid() {
            return Read::NotAsleep;
        }
        for _try in 0..TRIES {
            let Ok(clock) = thread_cpu_time(tid) else {
                return Read::NotAsleep;
            };
            let Some(InKernel::Asleep { sp, pc, .. }) = ProcThread::in_kernel(tid) else {
                return Read::NotAsleep;
            };
            let stack = if let Some(flags) = unwinding.refusal(pc) {
                // What the thread's own handler would answer too.
                Stack {
                    frames: vec![pc],
                    flags,
                    complete: true,
                }
            } else {
                let (first, copied) = self.unwind(unwinding, pc, sp, 1);
                let mut stack = if first.complete || first.flags != 0 || first.frames.len() < 2 {
                    first
                } else {
                    self.with_frame_record(unwinding, objects, (pc, sp), &first, copied)
                        .unwrap_or(first)
                };
                // A leaf in code without unwind tables can be unwound by the rule of the
                // function before it: such a stack goes on from an address no call
                // returns to. It ends there, and is not whole.
                if let Some(bad) = (1..stack.frames.len())
                    .find(|&i| !is_return_address(unwinding, objects, stack.frames[i]))
                {
                    stack.frames.truncate(bad);
                    stack.complete = false;
                }
                super::frames::drop_guessed_callers(&mut stack, unwinding, objects);
                stack
            };
            // A thread that did not run in the meantime did not change its registers or
            // its stack: its CPU clock would have moved (to the nanosecond; the kernel adds
            // a running thread's current stretch when asked). This also catches a thread
            // that woke and fell asleep again at the same place, which its `syscall` file
            // read again would not.
            if thread_cpu_time(tid).ok() != Some(clock) {
                continue;
            }
            return if stack.complete || stack.flags != 0 {
                self.read += 1;
                Read::Whole(stack)
            } else {
                Read::Part(stack)
            };
        }
        Read::NotAsleep
    }

    /// Unwinds from `pc` and `sp` with frame pointer `bp`; also how many bytes of the
    /// stack, from `sp`, it copied into the scratch's stack copy.
    #[cfg(target_arch = "x86_64")]
    fn unwind(&mut self, unwinding: &Unwinding, pc: u64, sp: u64, bp: u64) -> (Stack, usize) {
        let Scratch {
            cache,
            stack,
            frames,
        } = &mut *self.scratch;
        frames[0] = pc;
        let regs = framehop::UnwindRegsNative::new(pc, sp, bp);
        let unwound = unwinding.unwind((pc, regs), 0, None, cache, stack, frames);
        let stack = Stack {
            frames: frames[..unwound.depth.max(1)].to_vec(),
            flags: unwound.flags,
            complete: unwound.complete,
        };
        (stack, unwound.copied)
    }

    /// The stack unwound again with a frame pointer found on it (see the module docs),
    /// if one gives the whole stack, beginning with the frames `first` found (whose
    /// unwind copied `copied` bytes from `sp` into the scratch's stack copy). The frame
    /// that stopped the unwind is `first`'s last: its record lies above the place its
    /// return address was read from.
    #[cfg(target_arch = "x86_64")]
    fn with_frame_record(
        &mut self,
        unwinding: &Unwinding,
        objects: &Objects,
        (pc, sp): (u64, u64),
        first: &Stack,
        copied: usize,
    ) -> Option<Stack> {
        let word = |bytes: &[u8], at: usize| {
            bytes
                .get(at..at + 8)
                .map(|bytes| u64::from_ne_bytes(bytes.try_into().expect("8 bytes")))
        };
        let stopped = *first.frames.last()?;
        let copy = &self.scratch.stack[..copied.min(MAX_STACK_COPY)];
        let read_at = (0..copy.len())
            .step_by(8)
            .find(|&at| word(copy, at) == Some(stopped))?;
        let frame_sp = sp + read_at as u64 + 8;
        // What the first unwind copied above the frame's stack pointer, then the rest of
        // the window only if no record is found in that.
        let mut window = [0u8; RECORD_SCAN];
        let mut got = (copy.len() - (read_at + 8)).min(RECORD_SCAN);
        window[..got].copy_from_slice(&copy[read_at + 8..read_at + 8 + got]);
        let mut fetched = false;
        let mut tried = 0;
        // Where the stopped frame's function begins: a record's return address follows a
        // call of it, where the call tells. None for a stopped "frame" of 0, which an
        // unwind through code without unwind tables can give (musl's system calls).
        let start = (stopped.checked_sub(1)).and_then(|code| unwinding.function_start(code));
        // From the first 16-byte-aligned address at or above the frame's stack pointer.
        let mut at = ((16 - frame_sp % 16) % 16) as usize;
        loop {
            let Some(return_address) = word(&window[..got], at + 8) else {
                if fetched || got == RECORD_SCAN {
                    return None;
                }
                while got < RECORD_SCAN {
                    match unwinding
                        .memory
                        .read(frame_sp + got as u64, &mut window[got..])
                    {
                        0 => break,
                        n => got += n,
                    }
                }
                fetched = true;
                continue;
            };
            let record = frame_sp + at as u64;
            at += 16;
            if !is_return_address(unwinding, objects, return_address) {
                continue;
            }
            // A record left by a call of another function (by an exited thread on the
            // stack glibc gave this one, in memory the frame has not written) is passed
            // over however whole its stack unwinds.
            if let (Some(start), Some(callee)) = (start, callee(unwinding, return_address))
                && callee != start
            {
                continue;
            }
            let (stack, _) = self.unwind(unwinding, pc, sp, record);
            if stack.complete
                && stack.flags == 0
                && stack.frames.len() > first.frames.len()
                && stack.frames.starts_with(&first.frames)
                && (stack.frames[first.frames.len()..].iter())
                    .all(|&r| is_return_address(unwinding, objects, r))
            {
                return Some(stack);
            }
            tried += 1;
            if tried == RECORD_TRIES {
                return None;
            }
        }
    }

    /// On aarch64 the `syscall` file's two registers do not unwind a leaf: every thread is
    /// asked with a signal.
    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) fn read(&mut self, _unwinding: &Unwinding, _objects: &Objects, _tid: u32) -> Read {
        Read::NotAsleep
    }
}

/// Whether `address` is a return address: in the code of a loaded object, just after a
/// call instruction (read through the dump's reader, so a library unloaded meanwhile is
/// never touched).
#[cfg(target_arch = "x86_64")]
pub(super) fn is_return_address(unwinding: &Unwinding, objects: &Objects, address: u64) -> bool {
    let Some((_, object)) = objects.find(address) else {
        return false;
    };
    if !object
        .text()
        .is_some_and(|text| text.avma.contains(&address) && text.avma.start + 8 <= address)
    {
        return false;
    }
    let mut before = [0u8; 8];
    if object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe")) {
        // SAFETY: the executable's code is mapped, readable, for the process's life (as
        // its unwind tables, read where they are loaded: `unwind.rs`); the 8 bytes lie in
        // its text segment.
        before = unsafe { ((address - 8) as *const [u8; 8]).read_unaligned() };
    } else if unwinding.memory.read(address - 8, &mut before) != 8 {
        // A library's pages are read with a system call: it may be unloaded meanwhile.
        return false;
    }
    follows_a_call(&before)
}

/// Whether the 8 bytes `before` an address end with an x86_64 call instruction: `call
/// rel32` (`e8` and 4 bytes), or `call r/m64` (`ff /2`, 2 to 7 bytes with its ModRM, SIB
/// and displacement, maybe after a REX prefix).
#[cfg(target_arch = "x86_64")]
fn follows_a_call(before: &[u8; 8]) -> bool {
    before[3] == 0xe8 || indirect_calls(before).next().is_some()
}

/// The lengths of the `call r/m64` instructions (`ff /2`) the 8 bytes `before` an address
/// can end with: each length tells where the instruction would begin.
#[cfg(target_arch = "x86_64")]
fn indirect_calls(before: &[u8; 8]) -> impl Iterator<Item = usize> + '_ {
    (2..=7).filter(|&len: &usize| {
        let at = 8 - len;
        let modrm = before[at + 1];
        if before[at] != 0xff || (modrm >> 3) & 7 != 2 {
            return false;
        }
        let (mode, rm) = (modrm >> 6, modrm & 7);
        let mut encoded = 2;
        if mode != 3 && rm == 4 {
            encoded += 1;
            let sib = before.get(at + 2).copied().unwrap_or(0);
            if mode == 0 && sib & 7 == 5 {
                encoded += 4;
            }
        }
        encoded += match (mode, rm) {
            (0, 5) => 4,
            (1, _) => 1,
            (2, _) => 4,
            _ => 0,
        };
        encoded == len
    })
}

/// The function the call just before return address `address` calls, where its bytes
/// tell: `call rel32`'s target, or, where that is a PLT stub (`jmp *disp32(%rip)`, after
/// the `endbr64` and `bnd` a linker may put first), the address in the stub's slot; the
/// address in `call *disp32(%rip)`'s slot (how Rust calls into other objects, without a
/// PLT). `None` for a call through a register or other memory, where the bytes could end
/// more than one call, or where they cannot be read. Read through the dump's reader.
#[cfg(target_arch = "x86_64")]
fn callee(unwinding: &Unwinding, address: u64) -> Option<u64> {
    let read = |at: u64, bytes: &mut [u8]| unwinding.memory.read(at, bytes) == bytes.len();
    let slot = |at: u64| {
        let mut word = [0u8; 8];
        read(at, &mut word).then_some(u64::from_ne_bytes(word))
    };
    let disp =
        |bytes: &[u8]| i64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
    let mut before = [0u8; 8];
    if !read(address - 8, &mut before) {
        return None;
    }
    let mut indirect = indirect_calls(&before);
    let target = match (before[3] == 0xe8, indirect.next(), indirect.next()) {
        (true, None, _) => address.wrapping_add_signed(disp(&before[4..])),
        (false, Some(6), None) if before[3] == 0x15 => {
            return slot(address.wrapping_add_signed(disp(&before[4..])));
        }
        _ => return None,
    };
    let mut stub = [0u8; 11];
    if !read(target, &mut stub) {
        return Some(target);
    }
    let mut at = if stub[..4] == [0xf3, 0x0f, 0x1e, 0xfa] {
        4
    } else {
        0
    };
    if stub[at] == 0xf2 {
        at += 1;
    }
    if stub[at..at + 2] != [0xff, 0x25] {
        return Some(target);
    }
    slot((target + at as u64 + 6).wrapping_add_signed(disp(&stub[at + 2..])))
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
mod tests {
    use std::sync::mpsc::{Receiver, channel};
    use std::time::{Duration, Instant};

    use super::*;

    /// `instruction` as the last bytes before an address, after `nop`s.
    fn ending_with(instruction: &[u8]) -> [u8; 8] {
        let mut before = [0x90; 8];
        before[8 - instruction.len()..].copy_from_slice(instruction);
        before
    }

    #[test]
    fn the_bytes_before_a_return_address_are_a_call_of_one_of_its_encodings() {
        let calls: [&[u8]; 10] = [
            &[0xe8, 0x10, 0x20, 0x30, 0x40],             // call rel32
            &[0xff, 0xd0],                               // call *%rax
            &[0x41, 0xff, 0xd3],                         // call *%r11 (REX.B)
            &[0xff, 0x10],                               // call *(%rax)
            &[0xff, 0x50, 0x08],                         // call *0x8(%rax)
            &[0xff, 0x90, 0x78, 0x56, 0x34, 0x12],       // call *0x12345678(%rax)
            &[0xff, 0x14, 0x24],                         // call *(%rsp)
            &[0xff, 0x54, 0x24, 0x08],                   // call *0x8(%rsp)
            &[0xff, 0x14, 0xc5, 0x00, 0x10, 0x00, 0x00], // call *0x1000(,%rax,8)
            &[0xff, 0x15, 0x34, 0x12, 0x00, 0x00],       // call *0x1234(%rip)
        ];
        for call in calls {
            assert!(follows_a_call(&ending_with(call)), "{call:02x?}");
        }
        let others: [&[u8]; 7] = [
            &[0xff, 0xe0],                         // jmp *%rax
            &[0xff, 0x20],                         // jmp *(%rax)
            &[0xe8, 0x10, 0x20, 0x30],             // a call's first four bytes only
            &[0xff, 0x50],                         // call *disp8(%rax) without its disp8
            &[0xff, 0x14, 0x24, 0x00],             // call *(%rsp) and one byte more
            &[0xff, 0x14, 0xc5, 0x00, 0x10, 0x00], // call *disp32(,%rax,8) cut short
            &[0xc3],                               // ret
        ];
        for other in others {
            assert!(!follows_a_call(&ending_with(other)), "{other:02x?}");
        }
    }

    /// Code bytes laid out in one buffer, read through the dump's reader as a return
    /// address's would be: each case's call ends where its return address is.
    #[test]
    fn a_calls_callee_is_its_target_or_what_the_slot_it_jumps_through_holds() {
        const TARGET: u64 = 0x1234_5678_9abc_def0;
        let unwinding = Unwinding::new(&Objects::current(), &[], Memory::choose().memory);
        let mut code = vec![0x90u8; 512];
        let base = code.as_ptr() as u64;
        // Slot at 0 holds TARGET; the stubs at 64, 96 and 128; the calls' ends from 256.
        code[..8].copy_from_slice(&TARGET.to_ne_bytes());
        let rel = |from: usize, to: usize| (to as i32 - from as i32).to_le_bytes();
        let stubs: [&[u8]; 3] = [
            &[0xff, 0x25],                               // jmp *disp32(%rip)
            &[0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25], // endbr64; bnd jmp
            &[0xf3, 0x0f, 0x1e, 0xfa, 0xff, 0x25],       // endbr64; jmp
        ];
        for (stub, at) in stubs.iter().zip([64, 96, 128]) {
            code[at..at + stub.len()].copy_from_slice(stub);
            let end = at + stub.len() + 4;
            code[end - 4..end].copy_from_slice(&rel(end, 0));
        }
        // A call's `bytes`, ending at `end`: its return address.
        let mut call = |end: usize, bytes: &[u8]| {
            code[end - bytes.len()..end].copy_from_slice(bytes);
            base + end as u64
        };
        // `call rel32` to `to`, ending at `end`.
        let mut direct = |end: usize, to: usize| {
            let mut bytes = vec![0xe8];
            bytes.extend(rel(end, to));
            call(end, &bytes)
        };
        let through = [direct(256, 64), direct(272, 96), direct(288, 128)];
        let plain = direct(304, 160);
        let mut call_rip = vec![0xff, 0x15];
        call_rip.extend(rel(336, 0));
        let cases = [
            (through[0], Some(TARGET), "through a stub"),
            (through[1], Some(TARGET), "through an endbr64; bnd stub"),
            (through[2], Some(TARGET), "through an endbr64 stub"),
            (plain, Some(base + 160), "to code that is no stub"),
            (call(336, &call_rip), Some(TARGET), "call *disp32(%rip)"),
            (call(352, &[0xff, 0xd0]), None, "call *%rax"),
            (
                call(368, &[0xff, 0x90, 0, 1, 0, 0]),
                None,
                "call *0x100(%rax)",
            ),
            // `e8` ending a `mov -0x18(%rbp),%rdi`, then `call *%rax`: either could be.
            (
                call(384, &[0x48, 0x8b, 0x7d, 0xe8, 0x90, 0x90, 0xff, 0xd0]),
                None,
                "call rel32 or call *%rax",
            ),
            (8 + 8, None, "unreadable"),
        ];
        for (address, callee_is, case) in cases {
            assert_eq!(callee(&unwinding, address), callee_is, "{case}");
        }
        std::hint::black_box(&code);
    }

    /// A first unwind that stopped at a "frame" of 0 (as one through musl's system call
    /// wrappers, which have no unwind tables, can) over a stack of zeros: the search
    /// finds no record, and gives up without a panic.
    #[test]
    fn a_search_above_a_frame_of_zero_finds_nothing_and_does_not_panic() {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let mut reader = Asleep::new();
        let zeros = vec![0u8; 2 * RECORD_SCAN];
        let pc = Unwinding::covers as *const () as u64;
        let first = Stack {
            frames: vec![pc, 0],
            flags: 0,
            complete: false,
        };
        // The scratch copy is fresh pages, zeros too: the 0 is found at its start.
        let found = reader.with_frame_record(
            &unwinding,
            &objects,
            (pc, zeros.as_ptr() as u64),
            &first,
            64,
        );
        assert!(found.is_none());
        std::hint::black_box(&zeros);
    }

    /// Bytes that end like a call, in the executable's writable data: the address after
    /// them lies in a loaded object, above the start of its code, but not in its code.
    #[test]
    fn an_address_after_call_bytes_outside_the_code_is_no_return_address() {
        use std::sync::atomic::AtomicU64;
        static CALL_THEN: [AtomicU64; 2] = [
            AtomicU64::new(u64::from_le_bytes([0x90, 0x90, 0x90, 0xe8, 0, 0, 0, 0])),
            AtomicU64::new(0),
        ];
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let after = &raw const CALL_THEN[1] as u64;
        let (_, object) = objects.find(after).expect("the executable's data");
        let text = object.text().expect("the executable's code").avma.clone();
        assert!(
            text.start + 8 <= after && !text.contains(&after),
            "{text:x?}"
        );
        let mut before = [0u8; 8];
        assert_eq!(unwinding.memory.read(after - 8, &mut before), 8);
        assert!(follows_a_call(&before), "{before:02x?}");
        assert!(!is_return_address(&unwinding, &objects, after));
        std::hint::black_box(&CALL_THEN);
    }

    use crate::objects::Objects;
    use crate::process::{InKernel, ProcThread, current_tid};
    use crate::sampler::memory::Memory;
    use crate::symbolize::Resolved;

    /// Polls `fd` until it is readable or hung up; the times `poll` was interrupted.
    #[inline(never)]
    fn krabka_test_polling(fd: i32) -> usize {
        let mut interrupted = 0;
        loop {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                interrupted += 1;
                continue;
            }
            return std::hint::black_box(interrupted);
        }
    }

    #[inline(never)]
    fn krabka_test_waiting(until: &Receiver<()>) {
        let _ = std::hint::black_box(until.recv());
    }

    /// Locals that must lie on a 64-byte boundary: the function realigns its stack, so
    /// its unwind table finds its caller through the frame pointer, and its frame record
    /// lies above the locals, `N` bytes and more above the return address of its callee.
    #[repr(C, align(64))]
    struct Aligned<const N: usize>([u8; N]);

    /// Polls `fd` once, below 3.5 KiB of its own locals.
    #[inline(never)]
    fn krabka_test_polling_far(fd: i32) -> i32 {
        // Zeroed where they lie: an unoptimised build of `Aligned([0; N])` would put a
        // temporary copy in the frame as well, twice the size.
        let mut locals = std::mem::MaybeUninit::<Aligned<3584>>::uninit();
        // SAFETY: writes zeros over the whole of `locals`, memory of that size.
        unsafe { locals.as_mut_ptr().write_bytes(0, 1) };
        std::hint::black_box(&mut locals);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
        std::hint::black_box(&locals);
        n
    }

    /// [`krabka_test_polling_far`], called 2 KiB further down the stack.
    #[inline(never)]
    fn krabka_test_padding(fd: i32) -> i32 {
        // Zeroed where they lie: an unoptimised build of `Aligned([0; N])` would put a
        // temporary copy in the frame as well, twice the size.
        let mut locals = std::mem::MaybeUninit::<Aligned<2048>>::uninit();
        // SAFETY: writes zeros over the whole of `locals`, memory of that size.
        unsafe { locals.as_mut_ptr().write_bytes(0, 1) };
        std::hint::black_box(&mut locals);
        clear_below();
        let n = krabka_test_polling_far(fd);
        std::hint::black_box(&locals);
        n
    }

    /// Zeroes 8 KiB of the stack below its caller, and returns. A new thread's stack may be
    /// one a thread that exited left (glibc keeps them for new threads): frame records
    /// of its calls, in what a new frame has not written yet, would be found first.
    #[inline(never)]
    fn clear_below() {
        let mut below = std::mem::MaybeUninit::<Aligned<8192>>::uninit();
        // SAFETY: writes zeros over the whole of `below`, memory of that size.
        unsafe { below.as_mut_ptr().write_bytes(0, 1) };
        std::hint::black_box(&mut below);
    }

    /// Polls `fd` once, below frame records of its own making, at the bottom of 1 KiB of
    /// zeroed locals, under the frame record its caller's call left: each a saved frame
    /// pointer and `return_address`. The saved frame pointer points into the locals, so
    /// a record's stack goes on through them. With `cut` 0, one record, whose stack ends
    /// whole at their zeros. Otherwise `cut` records (at most 31), whose stacks each go
    /// through a second record in the middle of the locals, an address in no mapping and
    /// `return_address` again, where a frame that keeps its frame pointer stops short of
    /// the outermost frame, every frame a return address: `cut + 1` records that fail.
    #[inline(never)]
    fn krabka_test_polling_planted(fd: i32, return_address: u64, cut: usize) -> i32 {
        let mut locals = std::mem::MaybeUninit::<Aligned<1024>>::uninit();
        // SAFETY: writes zeros over the whole of `locals`, memory of that size.
        unsafe { locals.as_mut_ptr().write_bytes(0, 1) };
        let base = locals.as_mut_ptr().cast::<u64>();
        // SAFETY: words below 64, and 64 and 65, of the 128 of `locals`.
        unsafe {
            for record in 0..cut.clamp(1, 31) {
                base.add(2 * record).write(base.add(64) as u64);
                base.add(2 * record + 1).write(return_address);
            }
            if cut > 0 {
                base.add(64).write(0x10);
                base.add(65).write(return_address);
            }
        }
        std::hint::black_box(&mut locals);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
        std::hint::black_box(&locals);
        n
    }

    /// Calls [`krabka_test_polling_planted`]: the frame its real record returns to.
    #[inline(never)]
    fn krabka_test_planting(fd: i32, return_address: u64, cut: usize) -> i32 {
        std::hint::black_box(krabka_test_polling_planted(fd, return_address, cut))
    }

    /// The return addresses of a thread waiting on a channel in [`krabka_test_waiting`],
    /// read while it waits, each with the function it lies in (the outermost where
    /// calls were inlined).
    fn waiting_frames(
        reader: &mut Asleep,
        unwinding: &Unwinding,
        objects: &Objects,
    ) -> Vec<(u64, String)> {
        let (stop, until) = channel::<()>();
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            krabka_test_waiting(&until);
        });
        let tid = rx.recv().unwrap();
        asleep(tid, FUTEX);
        let (waiting, _) = read_whole(reader, unwinding, objects, tid, "krabka_test_waiting");
        drop(stop);
        waiter.join().unwrap();
        let returns = waiting.frames[1..].to_vec();
        let at: Vec<u64> = returns.iter().map(|r| r - 1).collect();
        let resolved = Resolved::of(objects, at.clone());
        (returns.iter().zip(at))
            .filter_map(|(&r, at)| Some((r, resolved.functions(at)?.last()?.name.clone())))
            .collect()
    }

    /// A thread asleep in [`krabka_test_polling_planted`] (`return_address`, `cut`),
    /// called by [`krabka_test_planting`], read without a signal.
    fn read_planted(
        reader: &mut Asleep,
        unwinding: &Unwinding,
        objects: &Objects,
        return_address: u64,
        cut: usize,
    ) -> Read {
        let (read_end, write_end) = pipe();
        let (tx, rx) = channel();
        let planted = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            clear_below();
            krabka_test_planting(read_end, return_address, cut)
        });
        let tid = rx.recv().unwrap();
        asleep(tid, POLL);
        let read = reader.read(unwinding, objects, tid);
        // SAFETY: closing our end of the pipe ends the poll with POLLHUP.
        unsafe { libc::close(write_end) };
        assert_eq!(planted.join().unwrap(), 1, "the poll ended by the hang-up");
        // SAFETY: the read end, no longer polled.
        unsafe { libc::close(read_end) };
        read
    }

    /// A thread asleep below planted records ([`read_planted`]), which must be read
    /// whole, to its outermost frame, through the real caller
    /// ([`krabka_test_planting`]): its functions.
    fn read_past_planted(
        reader: &mut Asleep,
        unwinding: &Unwinding,
        objects: &Objects,
        return_address: u64,
        cut: usize,
    ) -> Vec<String> {
        let read = read_planted(reader, unwinding, objects, return_address, cut);
        let (stack, names) = whole(read, objects, "krabka_test_polling_planted");
        assert!(stack.complete, "{names:?}");
        assert!(
            names.iter().any(|n| n.contains("krabka_test_planting")),
            "the real caller in {names:?}"
        );
        names
    }

    /// A return address of [`waiting_frames`] after a call whose target its bytes do
    /// not tell (through a register or memory), with its function.
    fn after_an_unknown_call<'a>(
        waiting: &'a [(u64, String)],
        unwinding: &Unwinding,
    ) -> &'a (u64, String) {
        (waiting.iter())
            .find(|(r, _)| callee(unwinding, *r).is_none())
            .expect("a return address after an indirect call")
    }

    /// Waits until `tid` sleeps in the kernel in one of the system calls `calls` (not on
    /// its way there, in a page fault: `nr` -1).
    fn asleep(tid: u32, calls: &[i64]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !matches!(
            ProcThread::in_kernel(tid),
            Some(InKernel::Asleep { nr, .. }) if calls.contains(&nr)
        ) {
            assert!(Instant::now() < deadline, "{tid} never slept");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The system calls `poll` may be made with.
    const POLL: &[i64] = &[libc::SYS_poll, libc::SYS_ppoll];
    /// The one a wait on a futex is.
    const FUTEX: &[i64] = &[libc::SYS_futex];

    /// A new pipe: its read end and its write end.
    fn pipe() -> (i32, i32) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    }

    /// Thread `tid`'s stack, read whole by `reader` without a signal, and its functions
    /// ([`names`]); a panic naming `function` if it is read only in part, or not at all.
    fn read_whole(
        reader: &mut Asleep,
        unwinding: &Unwinding,
        objects: &Objects,
        tid: u32,
        function: &str,
    ) -> (Stack, Vec<String>) {
        whole(reader.read(unwinding, objects, tid), objects, function)
    }

    /// The stack `read` gave whole, and its functions ([`names`]); a panic naming
    /// `function` if it was read only in part, or not at all.
    fn whole(read: Read, objects: &Objects, function: &str) -> (Stack, Vec<String>) {
        let stack = match read {
            Read::Whole(stack) => stack,
            Read::Part(stack) => panic!("{function}: part {:?}", names(&stack, objects)),
            Read::NotAsleep => panic!("{function}'s thread is read without a signal"),
        };
        let names = names(&stack, objects);
        (stack, names)
    }

    /// The functions of `stack`, leaf first, each frame's inlined ones first.
    fn names(stack: &Stack, objects: &Objects) -> Vec<String> {
        let at: Vec<u64> = (stack.frames.iter().enumerate())
            .map(|(i, &address)| if i == 0 { address } else { address - 1 })
            .collect();
        let resolved = Resolved::of(objects, at.clone());
        at.iter()
            .flat_map(|address| match resolved.functions(*address) {
                Some(functions) => functions.iter().map(|f| f.name.clone()).collect(),
                None => vec![format!("{address:#x}")],
            })
            .collect()
    }

    #[test]
    fn a_thread_asleep_in_poll_or_on_a_futex_is_read_whole_and_never_interrupted() {
        // No CPU session meanwhile: the backstop's process-wide SIGPROF may land on any
        // thread that does not block it, a sleeping one too.
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let (read_end, write_end) = pipe();
        let (tx, rx) = channel();
        let poller = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            krabka_test_polling(read_end)
        });
        let poller_tid = rx.recv().unwrap();
        let (stop, until) = channel::<()>();
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            krabka_test_waiting(&until);
        });
        let waiter_tid = rx.recv().unwrap();
        asleep(poller_tid, POLL);
        asleep(waiter_tid, FUTEX);

        let mut reader = Asleep::new();
        for _round in 0..20 {
            for (tid, function) in [
                (poller_tid, "krabka_test_polling"),
                (waiter_tid, "krabka_test_waiting"),
            ] {
                let (stack, names) = read_whole(&mut reader, &unwinding, &objects, tid, function);
                assert!(
                    names.iter().any(|n| n.contains(function)),
                    "{function} in {names:?}"
                );
                assert!(stack.complete, "{names:?}");
            }
        }
        assert_eq!(reader.read, 40);
        assert!(
            matches!(
                reader.read(&unwinding, &objects, current_tid()),
                Read::NotAsleep
            ),
            "a running thread is not read so"
        );

        // SAFETY: closing our end of the pipe ends the poll with POLLHUP.
        unsafe { libc::close(write_end) };
        assert_eq!(
            poller.join().unwrap(),
            0,
            "poll was never interrupted by 20 reads"
        );
        drop(stop);
        waiter.join().unwrap();
        // SAFETY: the read end, no longer polled.
        unsafe { libc::close(read_end) };
    }

    /// A thread asleep below a frame that needs the frame pointer, whose frame record lies
    /// 3.5 KiB above the return address the first unwind stopped at: beyond the page that
    /// unwind copied, unless that address lies in the first eighth of its page. Of two
    /// such threads, 2 KiB apart on their stacks, at least one has it beyond: the record
    /// is fetched, and both stacks are read whole.
    #[test]
    fn a_frame_record_a_page_above_the_first_copy_is_fetched() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let (read_end, write_end) = pipe();
        let mut pollers = Vec::new();
        for (padded, function) in [
            (false, "krabka_test_polling_far"),
            (true, "krabka_test_padding"),
        ] {
            let (tx, rx) = channel();
            let poller = std::thread::spawn(move || {
                tx.send(current_tid()).unwrap();
                if padded {
                    krabka_test_padding(read_end)
                } else {
                    clear_below();
                    krabka_test_polling_far(read_end)
                }
            });
            pollers.push((poller, rx.recv().unwrap(), function));
        }
        let mut reader = Asleep::new();
        for (_, tid, function) in &pollers {
            asleep(*tid, POLL);
            let (stack, names) = read_whole(&mut reader, &unwinding, &objects, *tid, function);
            assert!(stack.complete, "{names:?}");
            for name in ["krabka_test_polling_far", function] {
                assert!(
                    names.iter().any(|n| n.contains(name)),
                    "{name} in {names:?}"
                );
            }
        }
        // SAFETY: closing our end of the pipe ends both polls with POLLHUP.
        unsafe { libc::close(write_end) };
        for (poller, _, function) in pollers {
            assert_eq!(
                poller.join().unwrap(),
                1,
                "{function}'s poll ended by the hang-up"
            );
        }
        // SAFETY: the read end, no longer polled.
        unsafe { libc::close(read_end) };
    }

    /// A thread asleep below a frame whose frame record has, below it in its locals,
    /// another one: a saved frame pointer and a real return address, in the function
    /// that waits on a channel, after its call of `recv` (as an exited thread's calls
    /// leave on the stack glibc hands a new thread). With that one the stack unwinds
    /// whole, to the zeros above it; its call is not of the frame's function, so it is
    /// passed over and the real record, above, gives the real callers.
    #[test]
    fn a_frame_record_left_by_a_call_of_another_function_is_passed_over() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let mut reader = Asleep::new();
        let waiting = waiting_frames(&mut reader, &unwinding, &objects);
        let (stale, _) = (waiting.iter())
            .find(|(_, function)| function.contains("krabka_test_waiting"))
            .expect("a return address in krabka_test_waiting");
        assert!(
            callee(&unwinding, *stale).is_some(),
            "krabka_test_waiting's call of recv is one whose callee is known"
        );
        let names = read_past_planted(&mut reader, &unwinding, &objects, *stale, 0);
        assert!(
            !names.iter().any(|n| n.contains("krabka_test_waiting")),
            "no frame of the planted record in {names:?}"
        );
    }

    /// As above, but the planted record's return address follows a call whose target
    /// its bytes do not tell (through a register or memory), in a function that keeps
    /// its frame pointer (the standard library's), and the record's stack is cut short:
    /// every frame a return address, but not to the outermost. That record, and the
    /// second one it leads to, are each passed over because their stacks are not whole
    /// (two tries), and the real record gives the callers.
    #[test]
    fn a_frame_record_whose_stack_does_not_unwind_whole_is_passed_over() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let mut reader = Asleep::new();
        let waiting = waiting_frames(&mut reader, &unwinding, &objects);
        let (unknown, function) = after_an_unknown_call(&waiting, &unwinding);
        let names = read_past_planted(&mut reader, &unwinding, &objects, *unknown, 1);
        assert!(
            !names.iter().any(|n| n == function),
            "no frame of the planted record ({function}) in {names:?}"
        );
    }

    /// As above, with as many failing records below the real one as the search tries
    /// (`RECORD_TRIES - 1` cut short, and the one they lead to): the search gives up
    /// before it reaches the real one, and the stack is read in part, for the signal to
    /// finish. With one fewer, the real one is still found.
    #[test]
    fn past_as_many_failing_records_as_it_tries_the_search_gives_up() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let mut reader = Asleep::new();
        let waiting = waiting_frames(&mut reader, &unwinding, &objects);
        let (unknown, _) = after_an_unknown_call(&waiting, &unwinding);
        // `cut` records fail and so does the one they lead to: one fewer failing than
        // the search tries, and the real record is still found.
        read_past_planted(
            &mut reader,
            &unwinding,
            &objects,
            *unknown,
            RECORD_TRIES - 2,
        );
        match read_planted(
            &mut reader,
            &unwinding,
            &objects,
            *unknown,
            RECORD_TRIES - 1,
        ) {
            Read::Part(stack) => {
                let part = names(&stack, &objects);
                assert!(!stack.complete, "{part:?}");
                assert!(
                    part.iter()
                        .any(|n| n.contains("krabka_test_polling_planted")),
                    "the frames below the search kept: {part:?}"
                );
            }
            Read::Whole(stack) => panic!("read whole: {:?}", names(&stack, &objects)),
            Read::NotAsleep => panic!("read as not asleep"),
        }
    }
}
