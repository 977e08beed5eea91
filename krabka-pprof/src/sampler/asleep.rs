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
//! frame pointer). For the leaf's caller it is computed exactly from that function's
//! prologue (`prologue.rs`), and the read goes on. Where it cannot be, the read stops:
//! the frame pointer is in no file, and a frame
//! record found by searching the stack is not proven to be the frame's own (a stale one,
//! left in memory the frame has not written by an earlier call of the same function
//! through another, passes every check a search can make, and gives a caller that is not
//! on the stack). The part read is what the collector keeps (`asking.rs`): a thread
//! waiting on a futex, whose wait a signal does not cut short (the kernel restarts a
//! wait without a timeout; std's and parking_lot's loops retry one with a timeout), is
//! asked with a signal for the rest; any other sleeper keeps the exact part, with a
//! marker saying where and why it stops, and is never signalled: its `poll`, `epoll_wait`
//! or `nanosleep` is not cut short. Every stack read so ends at the first address no call
//! returns to (a leaf in code without unwind tables is unwound by the rule of the function
//! before it, into garbage), and after the first frame no unwind table covers
//! (`frames.rs`), where it counts as whole: a signal would answer the same. So are the
//! threads of a glibc built with frame pointers, whose wrappers need it for the leaf
//! itself. On aarch64 a leaf function's return address is in the link register and its
//! frame in x29, neither of which the file gives: there every thread is asked with a
//! signal.

#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "on aarch64 every thread is signalled")
)]

#[cfg(target_arch = "x86_64")]
use super::buffer::FLAG_STACK_UNREAD;
use super::dump::Stack;
use super::scratch::{FreshPages, MAX_STACK_COPY, Scratch};
use super::unwind::{Cache, MAX_DEPTH, Unwinding};
use crate::objects::Objects;

/// How often a thread that woke during the read is read again before it is left to the
/// signal.
#[cfg(target_arch = "x86_64")]
const TRIES: usize = 3;

/// Return addresses an [`Asleep`] remembers checking, at most (some 100 KiB).
const MAX_RETURNS_KNOWN: usize = 4096;

/// What reading a thread without a signal gave.
pub(crate) enum Read {
    /// Its stack, read while it slept in `syscall`: to its outermost frame, or as far as a
    /// signal's answer would (a blocklisted leaf, a stack that cannot be read here).
    Whole { stack: Stack, syscall: i64 },
    /// Read while it slept, but not to its outermost frame: the unwind stopped at a frame
    /// that needs the frame pointer. `syscall`: the system call it sleeps in.
    Part { stack: Stack, syscall: i64 },
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
    /// Addresses found to be return addresses, or not, so far (at most
    /// [`MAX_RETURNS_KNOWN`]).
    returns: std::collections::HashMap<u64, bool>,
    /// The stack words the last [`Asleep::unwind_asleep`] read (of its one or two
    /// unwinds), each with its address; whether one could not be read.
    words: Vec<(u64, u64)>,
    unreadable: bool,
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
            returns: std::collections::HashMap::new(),
            words: Vec::new(),
            unreadable: false,
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
            let Some(InKernel::Asleep { sp, pc, nr }) = ProcThread::in_kernel(tid) else {
                return Read::NotAsleep;
            };
            let stack = self.unwind_asleep(unwinding, objects, pc, sp);
            // A thread that did not run in the meantime did not change its registers or
            // its stack: its CPU clock would have moved (to the nanosecond; the kernel adds
            // a running thread's current stretch when asked). This also catches a thread
            // that woke and fell asleep again at the same place, which its `syscall` file
            // read again would not.
            if thread_cpu_time(tid).ok() != Some(clock) {
                continue;
            }
            return self.answer(stack, nr);
        }
        Read::NotAsleep
    }

    /// Unwinds a sleeping thread from the `pc` and `sp` its `syscall` file gave, as far as
    /// that can be done exactly (see the module's docs); the stack words the unwind read
    /// are [`last_words`](Self::last_words) until the next. The caller checks that the
    /// thread did not run meanwhile (its CPU clock).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn unwind_asleep(
        &mut self,
        unwinding: &Unwinding,
        objects: &Objects,
        pc: u64,
        sp: u64,
    ) -> Stack {
        self.words.clear();
        self.unreadable = false;
        if let Some(flags) = unwinding.refusal(pc) {
            // What the thread's own handler would answer too.
            return Stack {
                frames: vec![pc],
                flags,
                complete: true,
            };
        }
        let mut stack = self.unwind(unwinding, pc, sp, 1);
        // Stopped at the leaf's caller, which needs the frame pointer: computed exactly
        // from its prologue where it can be (`prologue.rs`), and read on.
        if stack.frames.len() == 2
            && stack.flags & FLAG_STACK_UNREAD != 0
            && let Some(rbp) =
                super::prologue::frame_pointer_at_call(unwinding, objects, pc, sp, stack.frames[1])
        {
            // Taken only if it reads on to the outermost frame: a frame pointer the
            // prologue did not give exactly (a function that moved its stack pointer in
            // its body) would not lead there through return addresses.
            let further = self.unwind(unwinding, pc, sp, rbp);
            if further.complete
                && further.frames.len() > 2
                && further.frames[..2] == stack.frames[..]
            {
                stack = further;
            }
        }
        // A leaf in code without unwind tables can be unwound by the rule of the function
        // before it: such a stack goes on from an address no call returns to. It ends
        // there, and is not whole.
        if let Some(bad) = (1..stack.frames.len())
            .find(|&i| !self.is_return_address(unwinding, objects, stack.frames[i]))
        {
            stack.frames.truncate(bad);
            stack.complete = false;
        }
        super::frames::drop_guessed_callers(&mut stack, unwinding, objects);
        stack
    }

    /// What a stack [`unwind_asleep`](Self::unwind_asleep) read of a thread that slept in
    /// `syscall` all along is: an unwind that stopped (where the frame pointer was needed:
    /// the `syscall` file gives none) is a part, which the answer marks itself.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn answer(&mut self, mut stack: Stack, syscall: i64) -> Read {
        if stack.complete || stack.flags & !FLAG_STACK_UNREAD != 0 {
            self.read += 1;
            Read::Whole { stack, syscall }
        } else {
            stack.flags = 0;
            Read::Part { stack, syscall }
        }
    }

    /// [`is_return_address`], remembered: the objects' code does not change while they
    /// are loaded, and threads asleep in the same places share most return addresses (a
    /// pool's threads, all of them).
    #[cfg(target_arch = "x86_64")]
    fn is_return_address(
        &mut self,
        unwinding: &Unwinding,
        objects: &Objects,
        address: u64,
    ) -> bool {
        if let Some(&known) = self.returns.get(&address) {
            return known;
        }
        if self.returns.len() >= MAX_RETURNS_KNOWN {
            self.returns.clear();
        }
        let known = is_return_address(unwinding, objects, address);
        self.returns.insert(address, known);
        known
    }

    /// The stack words the last [`unwind_asleep`](Self::unwind_asleep) read, each with
    /// its address, if each could be read: with the same program counter and stack
    /// pointer, the same words unwind to the same stack (the rest it reads is code, which
    /// does not change while its object is loaded). `None` where a word could not be read
    /// (whether it can next time depends on more than these).
    pub(crate) fn last_words(&self) -> Option<&[(u64, u64)]> {
        (!self.unreadable).then_some(&self.words[..])
    }

    /// Unwinds from `pc` and `sp` with frame pointer `bp`.
    #[cfg(target_arch = "x86_64")]
    fn unwind(&mut self, unwinding: &Unwinding, pc: u64, sp: u64, bp: u64) -> Stack {
        let Scratch {
            cache,
            stack,
            frames,
        } = &mut *self.scratch;
        frames[0] = pc;
        let regs = framehop::UnwindRegsNative::new(pc, sp, bp);
        let (words, unreadable) = (&mut self.words, &mut self.unreadable);
        let unwound = unwinding.unwind_reading(
            (pc, regs),
            0,
            None,
            cache,
            stack,
            frames,
            |address, word| match word {
                Some(word) => words.push((address, word)),
                // Refused as below the stack pointer, or beyond what a copy may hold,
                // whatever the memory holds: the same again from the same stack pointer.
                None if address < sp || address >= sp + MAX_STACK_COPY as u64 => {}
                None => *unreadable = true,
            },
        );
        Stack {
            frames: frames[..unwound.depth.max(1)].to_vec(),
            flags: unwound.flags,
            complete: unwound.complete,
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
    // The 8 bytes before it, and its own (so that it lies in the same text segment).
    let mut around = [0u8; 9];
    address
        .checked_sub(8)
        .is_some_and(|start| read_code(unwinding, objects, start, &mut around))
        && around[..8]
            .try_into()
            .is_ok_and(|before| follows_a_call(&before))
}

/// Reads `code.len()` bytes of code at `start`, all in the text segment of one loaded
/// object; whether it could. The executable's are read where they are mapped; a
/// library's through the dump's reader (it may be unloaded meanwhile).
pub(super) fn read_code(
    unwinding: &Unwinding,
    objects: &Objects,
    start: u64,
    code: &mut [u8],
) -> bool {
    let Some((_, object)) = objects.find(start) else {
        return false;
    };
    let end = start + code.len() as u64;
    if !object
        .text()
        .is_some_and(|text| text.avma.start <= start && end <= text.avma.end)
    {
        return false;
    }
    if object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe")) {
        // SAFETY: the executable's code is mapped, readable, for the process's life (as
        // its unwind tables, read where they are loaded: `unwind.rs`); the bytes lie in
        // its text segment.
        let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, code.len()) };
        code.copy_from_slice(bytes);
        true
    } else {
        unwinding.memory.read(start, code) == code.len()
    }
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
    /// its unwind table finds its caller through the frame pointer.
    #[repr(C, align(64))]
    struct Aligned<const N: usize>([u8; N]);

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
        let waiting = match reader.read(unwinding, objects, tid) {
            Read::Whole { stack, .. } | Read::Part { stack, .. } => stack,
            Read::NotAsleep => panic!("krabka_test_waiting's thread is read without a signal"),
        };
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
            Read::Whole { stack, .. } => stack,
            Read::Part { stack, .. } => panic!("{function}: part {:?}", names(&stack, objects)),
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

    /// A thread asleep in `poll` and one waiting on a channel (a futex), read 20 times
    /// each without a signal: the poller whole (its frames keep no frame pointer), the
    /// waiter up to the standard library's frames, which need it, and exactly so (no
    /// frame guessed past them, the system call named); the poll never interrupted.
    #[test]
    fn a_thread_asleep_in_poll_or_on_a_futex_is_read_without_a_signal_and_never_interrupted() {
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
            let (stack, polling) = read_whole(
                &mut reader,
                &unwinding,
                &objects,
                poller_tid,
                "krabka_test_polling",
            );
            assert!(
                polling.iter().any(|n| n.contains("krabka_test_polling")),
                "krabka_test_polling in {polling:?}"
            );
            assert!(stack.complete, "{polling:?}");
            match reader.read(&unwinding, &objects, waiter_tid) {
                Read::Part { stack, syscall } => {
                    let part = names(&stack, &objects);
                    assert_eq!(syscall, libc::SYS_futex);
                    assert!(!stack.complete);
                    assert!(
                        part.iter().any(|n| n.contains("futex_wait")),
                        "the frames up to the stop: {part:?}"
                    );
                }
                Read::Whole { stack, .. } => {
                    // A standard library built without frame pointers reads whole.
                    let whole = names(&stack, &objects);
                    assert!(
                        whole.iter().any(|n| n.contains("krabka_test_waiting")),
                        "{whole:?}"
                    );
                }
                Read::NotAsleep => panic!("the waiter is read without a signal"),
            }
        }
        assert!(reader.read >= 20, "{}", reader.read);
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

    /// A thread asleep in `poll` below a frame that needs the frame pointer (it realigns
    /// its stack), whose locals hold a frame record that is not its own: a saved frame
    /// pointer and a real return address, in a function of the standard library that a
    /// channel's wait goes through (as an earlier call leaves in memory a frame has not
    /// written).
    /// The stack unwinds whole through that record, to the zeros above it, through
    /// return addresses that each follow a call: every check a search of the stack could
    /// make passes. The read stops at the frame instead, in part, with the system call,
    /// and no frame of the stale record is in it; the poll is not interrupted.
    #[test]
    fn a_stack_read_asleep_stops_where_the_frame_pointer_is_needed_and_takes_no_record() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
        let mut reader = Asleep::new();
        let waiting = waiting_frames(&mut reader, &unwinding, &objects);
        // A real return address, after a call, in a function of the standard library
        // that keeps a frame pointer: the outermost the waiter's read gave.
        let (stale, stale_function) = waiting.last().expect("a return address").clone();
        let stale = &stale;
        for cut in [0, 1] {
            match read_planted(&mut reader, &unwinding, &objects, *stale, cut) {
                Read::Part { stack, syscall } => {
                    let part = names(&stack, &objects);
                    assert!(!stack.complete, "{part:?}");
                    assert!(POLL.contains(&syscall), "{syscall}");
                    assert!(
                        part.iter()
                            .any(|n| n.contains("krabka_test_polling_planted")),
                        "the frames below the stop kept: {part:?}"
                    );
                    assert!(
                        !part.contains(&stale_function),
                        "no frame of the stale record ({stale_function}): {part:?}"
                    );
                }
                Read::Whole { stack, .. } => panic!("read whole: {:?}", names(&stack, &objects)),
                Read::NotAsleep => panic!("read as not asleep"),
            }
        }
    }
}
