//! Sleeping threads read for wall-clock profiles (`crate::wall`): the thread dump's reader
//! (`asleep.rs`), which sends no signal, with an unwinder of its own, for one window. A
//! thread that runs, or ran during the read, is not read: its time on the CPU is the CPU
//! sampler's to show. Where a sleeping thread's stack cannot be read without a signal
//! (aarch64), its system call is still known, and it is never signalled for the rest.
//!
//! A thread doing work moves between a few places again and again (a worker blocked in
//! the same call at every request). For such a thread ([`SleeperReader::keep`]) the
//! reader keeps its `syscall` and `schedstat` files open (a read each, no open and close)
//! and remembers its last stack with the stack words the unwind read to find it (return
//! addresses, saved frame pointers): found asleep again with the same system call,
//! program counter and stack pointer, and the same words at the same addresses (the
//! stack copied again, and compared), it is in the same place, which an unwind would
//! give again (the rest it reads is code, which does not change): the unwind is skipped,
//! never the reading.

#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(
        dead_code,
        unused_imports,
        reason = "on aarch64 no sleeping thread's stack is read: nothing is remembered"
    )
)]

use std::collections::HashMap;
use std::time::Duration;

use super::asleep::{Asleep, Read};
use super::dump::Stack;
use super::memory::Memory;
use super::unwind::Unwinding;
use crate::objects::Objects;
use crate::process::{InKernel, ThreadFile};

/// Threads whose files are kept open and whose last stack is remembered, at most: two
/// descriptors each, 128 in all while a window lasts. Fewer where the process is near its
/// limit of open files (`kept_at_most`).
const MAX_KEPT: usize = 64;

/// The most stack words a remembered stack keeps beside it (a deeper stack is unwound at
/// each read), and the most bytes above the stack pointer they may span (copied again to
/// compare them): with [`MAX_KEPT`], a memory bound of 256 KiB, and a copy of at most
/// 16 pages.
const MAX_REMEMBERED_WORDS: usize = 256;
const MAX_REMEMBERED_SPAN: u64 = 64 * 1024;

/// What one look at a thread found.
#[derive(Clone)]
pub(crate) enum Slept {
    /// Asleep in system call `syscall` (-1: in the kernel without one, a page fault), with
    /// its stack: `whole` when read to the outermost frame or as far as a signal would
    /// read it, else the exact part read, up to a frame that needs the frame pointer.
    Read {
        stack: Stack,
        syscall: i64,
        whole: bool,
    },
    /// Asleep in `syscall`, where its stack cannot be read without a signal (aarch64):
    /// the stack is not read.
    #[cfg_attr(
        target_arch = "x86_64",
        allow(dead_code, reason = "x86_64 reads every sleeping thread's stack")
    )]
    Unread { syscall: i64 },
    /// Running, ready to run, or gone.
    NotAsleep,
    /// It ran since the caller read its CPU clock (now `clock`): what was read may be of
    /// another place, or mix two.
    Ran { clock: Duration },
}

/// A thread doing work: its files, and where it was last read.
struct Kept {
    syscall: Option<ThreadFile>,
    schedstat: Option<ThreadFile>,
    last: Option<Remembered>,
}

/// A stack read, with what it was read from: the words at their addresses.
struct Remembered {
    syscall: i64,
    sp: u64,
    pc: u64,
    words: Vec<(u64, u64)>,
    slept: Slept,
}

/// The reader of one wall window: the objects loaded when it began, their unwind tables.
pub(crate) struct SleeperReader {
    objects: Objects,
    unwinding: Unwinding,
    asleep: Asleep,
    kept: HashMap<u32, Kept>,
    /// The stack a remembered stack's words are compared with, copied again.
    again: Vec<u8>,
    /// Reads that found a thread where it was last read, and skipped the unwind.
    pub(crate) same_again: u64,
    /// The thread that reads (whose own `syscall` file shows it in that read).
    own: u32,
    /// [`MAX_KEPT`], or fewer: the process's limit of open files, less what it had open
    /// when the window began, leaves room for four times the descriptors kept.
    kept_at_most: usize,
}

impl SleeperReader {
    /// For the objects loaded now, with the app's blocklist (a blocklisted library is not
    /// unwound here either); used by the thread that makes it.
    pub(crate) fn new(blocklist: &[&str]) -> SleeperReader {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, blocklist, Memory::choose().memory);
        SleeperReader {
            objects,
            unwinding,
            asleep: Asleep::new(),
            kept: HashMap::new(),
            again: Vec::new(),
            same_again: 0,
            own: crate::process::current_tid(),
            kept_at_most: kept_at_most(),
        }
    }

    /// Thread `tid` is doing work: its files are kept open and its last stack remembered
    /// from now on (up to [`MAX_KEPT`] threads).
    pub(crate) fn keep(&mut self, tid: u32) {
        if self.kept.len() < self.kept_at_most && !self.kept.contains_key(&tid) {
            self.kept.insert(
                tid,
                Kept {
                    syscall: ThreadFile::open(tid, "syscall"),
                    schedstat: ThreadFile::open(tid, "schedstat"),
                    last: None,
                },
            );
        }
    }

    /// Thread `tid` is quiet, or gone (or its id is another thread's now): its files are
    /// closed and its stack forgotten.
    pub(crate) fn forget(&mut self, tid: u32) {
        self.kept.remove(&tid);
    }

    /// How long thread `tid` has waited for a CPU so far (its `schedstat`).
    pub(crate) fn run_delay(&mut self, tid: u32) -> Option<Duration> {
        if let Some(file) = self.kept.get(&tid).and_then(|kept| kept.schedstat.as_ref()) {
            match file.run_delay() {
                Some(delay) => return Some(delay),
                // The thread it was opened for is gone, and its id may be another's now:
                // read by the path, and kept afresh if the new thread moves.
                None => self.forget(tid),
            }
        }
        crate::process::thread_run_delay(tid)
    }

    /// Where thread `tid` is, as its `syscall` file says.
    fn in_kernel(&mut self, tid: u32) -> Option<InKernel> {
        if let Some(file) = self.kept.get(&tid).and_then(|kept| kept.syscall.as_ref()) {
            match file.in_kernel() {
                Some(in_kernel) => return Some(in_kernel),
                None => self.forget(tid),
            }
        }
        crate::process::ProcThread::in_kernel(tid)
    }

    /// Looks at thread `tid` once, without a signal; `clock` is its CPU clock, read by
    /// the caller before anything else it reads of the thread with this look (its
    /// labels): unchanged at the end, none of it was read across a run of the thread.
    pub(crate) fn look(&mut self, tid: u32, clock: Duration) -> Slept {
        if tid == self.own {
            return Slept::NotAsleep;
        }
        let (slept, remembered) = match self.in_kernel(tid) {
            Some(InKernel::Asleep { nr, sp, pc }) => self.where_asleep(tid, nr, sp, pc),
            _ => return Slept::NotAsleep,
        };
        // A thread that did not run in the meantime did not change its registers or its
        // stack: its CPU clock would have moved (to the nanosecond).
        match crate::process::thread_cpu_time(tid) {
            Ok(now) if now == clock => {
                self.same_again += u64::from(remembered);
                slept
            }
            Ok(now) => Slept::Ran { clock: now },
            Err(_) => Slept::NotAsleep,
        }
    }

    /// The stack of a thread asleep in `syscall` at `pc`, `sp` (its clock checked after),
    /// and whether it was the one remembered.
    #[cfg(target_arch = "x86_64")]
    fn where_asleep(&mut self, tid: u32, syscall: i64, sp: u64, pc: u64) -> (Slept, bool) {
        if let Some(same) = self.same_as_last(tid, syscall, sp, pc) {
            return (same, true);
        }
        let stack = self
            .asleep
            .unwind_asleep(&self.unwinding, &self.objects, pc, sp);
        let slept = match self.asleep.answer(stack, syscall) {
            Read::Whole { stack, syscall } => Slept::Read {
                stack,
                syscall,
                whole: true,
            },
            Read::Part { stack, syscall } => Slept::Read {
                stack,
                syscall,
                whole: false,
            },
            Read::NotAsleep => Slept::NotAsleep,
        };
        if let Some(kept) = self.kept.get_mut(&tid) {
            kept.last = self
                .asleep
                .last_words()
                .filter(|words| {
                    words.len() <= MAX_REMEMBERED_WORDS
                        && words
                            .iter()
                            .all(|&(address, _)| address - sp < MAX_REMEMBERED_SPAN)
                })
                .map(|words| Remembered {
                    syscall,
                    sp,
                    pc,
                    words: words.to_vec(),
                    slept: slept.clone(),
                });
        }
        (slept, false)
    }

    /// On aarch64 the `syscall` file's two registers do not unwind a leaf: the stack is not
    /// read, and the thread is never signalled for it.
    #[cfg(not(target_arch = "x86_64"))]
    fn where_asleep(&mut self, _tid: u32, syscall: i64, _sp: u64, _pc: u64) -> (Slept, bool) {
        (Slept::Unread { syscall }, false)
    }

    /// The stack last read of thread `tid`, if it is asleep at the same place with the
    /// same stack words as then.
    #[cfg(target_arch = "x86_64")]
    fn same_as_last(&mut self, tid: u32, syscall: i64, sp: u64, pc: u64) -> Option<Slept> {
        let last = self.kept.get(&tid)?.last.as_ref()?;
        if (last.syscall, last.sp, last.pc) != (syscall, sp, pc) {
            return None;
        }
        // Every address is at least `sp` and within the span (see `where_asleep`).
        let span = last
            .words
            .iter()
            .map(|&(address, _)| address - sp + 8)
            .max()
            .unwrap_or(0);
        self.again.resize(span as usize, 0);
        let mut copied = 0;
        while copied < self.again.len() {
            let got = self
                .unwinding
                .memory
                .read(sp + copied as u64, &mut self.again[copied..]);
            if got == 0 {
                return None;
            }
            copied += got;
        }
        let again = &self.again;
        let same = last.words.iter().all(|&(address, word)| {
            let at = (address - sp) as usize;
            again[at..at + 8] == word.to_ne_bytes()
        });
        same.then(|| last.slept.clone())
    }
}

/// How many threads a reader may keep files of: [`MAX_KEPT`], or fewer where the limit of
/// open files (`RLIMIT_NOFILE`'s soft limit) leaves less than four times their two
/// descriptors each above those open now (counted in `/proc/self/fd`), so that a service
/// near its limit is never pushed to `EMFILE` by a window.
fn kept_at_most() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    let open = std::fs::read_dir("/proc/self/fd").map_or(usize::MAX, |dir| dir.count());
    let free = usize::try_from(limit.rlim_cur)
        .unwrap_or(usize::MAX)
        .saturating_sub(open);
    (free / 8).min(MAX_KEPT)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::sync::mpsc::{Receiver, RecvError, channel};
    use std::time::{Duration, Instant};

    use super::{SleeperReader, Slept};
    use crate::process::{InKernel, ProcThread, current_tid, thread_cpu_time};

    #[inline(never)]
    fn krabka_test_wait_in(commands: &Receiver<u8>) -> Result<u8, RecvError> {
        std::hint::black_box(commands.recv())
    }

    /// The same code twice (one function each `WHICH`): the wait below it has the same
    /// stack pointer and program counter from either, and differs only in the return
    /// address into it.
    #[inline(never)]
    fn krabka_test_caller<const WHICH: u8>(commands: &Receiver<u8>) -> Result<u8, RecvError> {
        std::hint::black_box(krabka_test_wait_in(commands))
    }

    /// Where thread `tid` sleeps in the kernel, once it sleeps on its channel.
    fn asleep_at(tid: u32) -> (i64, u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(InKernel::Asleep { nr, sp, pc }) = ProcThread::in_kernel(tid)
                && nr == libc::SYS_futex
            {
                return (nr, sp, pc);
            }
            assert!(Instant::now() < deadline, "{tid} never slept");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn look(reader: &mut SleeperReader, tid: u32) -> Vec<u64> {
        let clock = thread_cpu_time(tid).unwrap();
        match reader.look(tid, clock) {
            Slept::Read { stack, .. } => stack.frames,
            _ => panic!("{tid} read asleep"),
        }
    }

    /// The dangerous case for a remembered stack: asleep at the same place (system call,
    /// program counter, stack pointer), called from elsewhere. It is unwound again, and
    /// only a sleep with the same words is taken as the same stack.
    #[test]
    fn a_remembered_stack_is_taken_again_only_with_the_same_stack_words() {
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tid_tx, tid_rx) = channel();
        let (commands_tx, commands) = channel::<u8>();
        let thread = std::thread::spawn(move || {
            tid_tx.send(current_tid()).unwrap();
            let mut next = krabka_test_caller::<0>(&commands);
            loop {
                next = match next {
                    Ok(0) => krabka_test_caller::<0>(&commands),
                    Ok(_) => krabka_test_caller::<1>(&commands),
                    Err(_) => break,
                };
            }
        });
        let tid = tid_rx.recv().unwrap();
        let mut reader = SleeperReader::new(&[]);
        reader.keep(tid);

        let first_place = asleep_at(tid);
        let first = look(&mut reader, tid);
        // It wakes and sleeps again: wait for its clock to move, then for the sleep.
        let clock = thread_cpu_time(tid).unwrap();
        commands_tx.send(1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while thread_cpu_time(tid).unwrap() == clock {
            assert!(Instant::now() < deadline, "{tid} never woke");
            std::thread::sleep(Duration::from_millis(1));
        }
        let second_place = asleep_at(tid);
        assert_eq!(
            first_place, second_place,
            "the two callers' waits share system call, stack pointer and program counter"
        );
        let second = look(&mut reader, tid);
        assert_ne!(first, second, "the other caller's stack, unwound again");
        assert_eq!(reader.same_again, 0);

        let clock = thread_cpu_time(tid).unwrap();
        commands_tx.send(1).unwrap();
        while thread_cpu_time(tid).unwrap() == clock {
            assert!(Instant::now() < deadline, "{tid} never woke");
            std::thread::sleep(Duration::from_millis(1));
        }
        asleep_at(tid);
        let third = look(&mut reader, tid);
        assert_eq!(third, second, "the same caller: the same stack");
        assert_eq!(reader.same_again, 1, "taken again, not unwound");

        drop(commands_tx);
        thread.join().unwrap();
    }
}
