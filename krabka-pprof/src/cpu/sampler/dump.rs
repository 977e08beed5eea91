//! Thread dumps: every thread of the process unwinds itself, now, with the sampler's
//! handler and unwinder, whether or not a CPU profile runs.
//!
//! The collector (on the blocking pool) builds a [`Dump`]: an unwinder over the loaded
//! objects' tables, a reply slot per listed thread, a few scratch slots. It publishes it
//! in [`DUMP`], then sends each thread `SIGPROF` with `rt_tgsigqueueinfo`: `si_code` is
//! `SI_QUEUE` and the signal value carries [`DUMP_TAG`], the dump's number and the
//! thread's reply slot. Timers send `SI_TIMER`, so the handler tells the two apart before
//! a CPU session sees anything: a dump's signal is never a sample, never a foreign signal,
//! and the CPU session's counts and buffers are untouched.
//!
//! In the handler, the thread checks that the slot is its own (`gettid`), claims it with a
//! compare-and-swap (pending → writing), borrows a scratch slot (its unwind cache and
//! stack copy; if all are taken, it sleeps on a futex until one is given back or the
//! deadline passes), unwinds from the interrupted context exactly as a CPU sample does, and
//! marks the reply done; then it wakes the collector with a futex. Nothing in it
//! allocates or takes a lock; it waits only for a scratch slot, never past the deadline.
//!
//! The collector waits on that futex until every thread has answered or the deadline
//! passes, sending the signal again every [`RESEND_EVERY`] to threads that have not
//! answered (a standard signal already pending on a thread, such as a CPU timer's, makes
//! the kernel drop another one sent to it). At the deadline it expires every reply still
//! pending (pending → expired, so a late handler leaves it alone), waits for the ones
//! being written, clears [`DUMP`] and waits until no handler runs before freeing the
//! dump. A thread that blocks `SIGPROF` (its `SigBlk`, seen twice a millisecond apart:
//! a thread's mask also holds it while its own handler runs) is not signalled at all (a
//! signal pending on it would outlive the dump, even an `execve`) and is reported as such;
//! one that exits, or blocks the signal after it was asked, is not waited for either. A
//! late signal, after the dump is gone, finds no dump with its number and returns at
//! once.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{
    FLAG_NO_SCRATCH, MAX_DEPTH, Memory, RUNNING_HANDLERS, Slot, StartError, TimerSignalInfo,
    Unwinding, Unwound, current_tid, handler_is_ours_or_default, install_handler,
    register_fork_handler, registers, scratch_slots,
};
use crate::cpu::PerProcess;
use crate::cpu::timers::blocks_sigprof;
use crate::objects::Objects;

/// High 32 bits of a dump's signal value ("KRBD"); a timer's are "KRBA".
const DUMP_TAG: u64 = 0x4b52_4244;
/// Reply slots a dump has at most: the signal value has 16 bits for the slot.
pub(crate) const MAX_DUMP_THREADS: usize = 1 << 16;
/// How often a thread that has not answered is signalled again.
const RESEND_EVERY: Duration = Duration::from_millis(10);
/// How far apart two looks at a pending thread's signal mask are.
const BLOCKED_LOOK: Duration = Duration::from_millis(1);

const PENDING: u8 = 0;
const WRITING: u8 = 1;
const DONE: u8 = 2;
const EXPIRED: u8 = 3;

/// The dump running now, if any; the handler reads it.
pub(super) static DUMP: AtomicPtr<Dump> = AtomicPtr::new(std::ptr::null_mut());
static NEXT_DUMP: AtomicU32 = AtomicU32::new(1);
/// One dump at a time: the next waits (each ends by its deadline). Per process: a child
/// made by `fork` during a dump must not inherit the lock held.
static ONE_DUMP: PerProcess<Mutex<()>> = PerProcess::new(|| Mutex::new(()));

/// The signal value that asks reply slot `index` of dump `id` for its stack.
fn signal_value(id: u32, index: usize) -> u64 {
    DUMP_TAG << 32 | u64::from(id & 0xffff) << 16 | index as u64 & 0xffff
}

/// The dump number and reply slot of a dump's signal value.
fn parse_value(value: u64) -> Option<(u32, usize)> {
    (value >> 32 == DUMP_TAG).then_some(((value >> 16 & 0xffff) as u32, (value & 0xffff) as usize))
}

/// One thread's stack, as its handler wrote it.
struct Answer {
    depth: usize,
    flags: u8,
    complete: bool,
    frames: [u64; MAX_DEPTH],
}

struct Reply {
    tid: u32,
    state: AtomicU8,
    answer: UnsafeCell<Answer>,
}

/// Everything a dump's handlers read.
pub(super) struct Dump {
    id: u32,
    unwinding: Unwinding,
    scratch: Box<[Slot]>,
    replies: Box<[Reply]>,
    /// Replies done; the collector waits on it as a futex.
    answered: AtomicU32,
    /// Scratch slots given back; handlers waiting for one wait on it as a futex.
    released: AtomicU32,
    /// The deadline has passed: a handler still waiting for a scratch slot stops waiting.
    expired: AtomicBool,
}

// SAFETY: a reply's `answer` is only written by the handler that moved its state from
// pending to writing, and only read by the collector once the state is done (release /
// acquire); the scratch slots are guarded by their flag, as in a CPU session.
unsafe impl Sync for Dump {}

/// What one thread answered.
pub(crate) enum Stack {
    /// Its stack, leaf first: the interrupted PC, then return addresses.
    Unwound {
        frames: Vec<u64>,
        /// `FLAG_*` of the sampler: truncated, blocklisted, not unwound and why.
        flags: u8,
        /// The unwind reached the outermost frame.
        complete: bool,
    },
    /// It blocks `SIGPROF`, so it was not asked.
    SignalBlocked,
    /// It did not answer before the deadline.
    NoAnswer,
    /// It exited before it could be asked.
    Exited,
    /// It could not be signalled (the error says why).
    NotSignalled(std::io::Error),
}

/// A finished dump.
pub(crate) struct Taken {
    /// Per thread asked, in the order given.
    pub(crate) stacks: Vec<(u32, Stack)>,
    /// The objects the stacks' addresses lie in, for symbols.
    pub(crate) objects: Objects,
    /// From the first signal to the last answer (or the deadline).
    pub(crate) elapsed: Duration,
    /// How the stacks were read (`process_vm_readv`, `/proc/self/mem`, none).
    pub(crate) reader: &'static str,
}

/// Asks each of `tids` (threads of this process) for its stack and waits up to
/// `deadline` for the answers. Blocks; call it on the blocking pool.
pub(crate) fn take(
    tids: &[u32],
    blocklist: &[&str],
    deadline: Duration,
) -> Result<Taken, StartError> {
    let _one = ONE_DUMP
        .get()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    register_fork_handler();
    if !handler_is_ours_or_default() {
        return Err(StartError::ForeignHandler);
    }
    let objects = Objects::current();
    let (unwinding, libraries) = Unwinding::new(&objects, blocklist, Memory::choose().memory);
    let tids = &tids[..tids.len().min(MAX_DUMP_THREADS)];
    let dump = Box::new(Dump {
        id: NEXT_DUMP.fetch_add(1, Ordering::Relaxed) & 0xffff,
        unwinding,
        scratch: (0..scratch_slots()).map(|_| Slot::new()).collect(),
        replies: tids
            .iter()
            .map(|&tid| Reply {
                tid,
                state: AtomicU8::new(PENDING),
                answer: UnsafeCell::new(Answer {
                    depth: 0,
                    flags: 0,
                    complete: false,
                    frames: [0; MAX_DEPTH],
                }),
            })
            .collect(),
        answered: AtomicU32::new(0),
        released: AtomicU32::new(0),
        expired: AtomicBool::new(false),
    });
    install_handler()?;
    let pointer = Box::into_raw(dump);
    // One dump at a time (`ONE_DUMP`), and a forked child clears its copy: the slot is
    // free.
    DUMP.store(pointer, Ordering::SeqCst);
    // SAFETY: the dump lives until `retire` below.
    let dump = unsafe { &*pointer };

    let started = Instant::now();
    let mut outcome: Vec<Option<Stack>> = tids.iter().map(|_| None).collect();
    // Asks reply `index`'s thread; false if it cannot be asked (then `outcome` says why).
    let ask = |index: usize, outcome: &mut Vec<Option<Stack>>| {
        let early = match send(tids[index], signal_value(dump.id, index)) {
            Ok(()) => return true,
            Err(err) if err.raw_os_error() == Some(libc::ESRCH) => Stack::Exited,
            Err(err) => Stack::NotSignalled(err),
        };
        dump.replies[index].state.store(EXPIRED, Ordering::SeqCst);
        outcome[index] = Some(early);
        false
    };
    // A thread whose mask holds SIGPROF is not signalled: the signal would stay pending
    // on it, and survive an `execve` it makes. The mask also holds SIGPROF while the
    // thread's own handler runs (a CPU sample: microseconds), so such a thread is looked
    // at again BLOCKED_LOOK later, and signalled then if its mask no longer holds it.
    let mut asked = vec![false; tids.len()];
    let mut deferred = Vec::new();
    for (index, &tid) in tids.iter().enumerate() {
        if blocks_sigprof(tid) {
            deferred.push(index);
        } else {
            asked[index] = ask(index, &mut outcome);
        }
    }
    let mut last_sent = Instant::now();
    let mut last_checked = Instant::now();
    let mut all_unable_before = false;
    loop {
        let answered = dump.answered.load(Ordering::Acquire);
        let elapsed = started.elapsed();
        let waiting = asked.iter().filter(|a| **a).count();
        if (answered as usize >= waiting && deferred.is_empty()) || elapsed >= deadline {
            break;
        }
        if last_checked.elapsed() >= BLOCKED_LOOK {
            for index in deferred.drain(..) {
                if blocks_sigprof(tids[index]) {
                    dump.replies[index].state.store(EXPIRED, Ordering::SeqCst);
                    outcome[index] = Some(Stack::SignalBlocked);
                } else {
                    asked[index] = ask(index, &mut outcome);
                }
            }
            // A thread asked that has exited since, or has blocked SIGPROF since, cannot
            // answer: seen so on two looks BLOCKED_LOOK apart, for every thread still
            // pending, there is nothing left to wait for.
            let all_unable = dump
                .replies
                .iter()
                .enumerate()
                .filter(|(index, reply)| {
                    asked[*index]
                        && outcome[*index].is_none()
                        && reply.state.load(Ordering::Acquire) == PENDING
                })
                .all(|(_, reply)| !is_alive(reply.tid) || blocks_sigprof(reply.tid));
            if all_unable && all_unable_before {
                break;
            }
            all_unable_before = all_unable;
            last_checked = Instant::now();
        }
        if last_sent.elapsed() >= RESEND_EVERY {
            for (index, reply) in dump.replies.iter().enumerate() {
                if asked[index]
                    && outcome[index].is_none()
                    && reply.state.load(Ordering::Acquire) == PENDING
                {
                    // An error now (the thread exited) shows at the deadline.
                    let _ = send(reply.tid, signal_value(dump.id, index));
                }
            }
            last_sent = Instant::now();
        }
        let wait = deadline
            .saturating_sub(elapsed)
            .min(RESEND_EVERY.saturating_sub(last_sent.elapsed()))
            .min(BLOCKED_LOOK.saturating_sub(last_checked.elapsed()))
            .max(Duration::from_micros(100));
        futex_wait(&dump.answered, answered, wait);
    }
    dump.expired.store(true, Ordering::Release);
    futex_wake(&dump.released, i32::MAX);
    for (index, reply) in dump.replies.iter().enumerate() {
        if outcome[index].is_some() {
            continue;
        }
        let state = match reply.state.compare_exchange(
            PENDING,
            EXPIRED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => EXPIRED,
            Err(mut state) => {
                // A handler is writing it: it finishes in microseconds.
                while state == WRITING {
                    std::thread::yield_now();
                    state = reply.state.load(Ordering::Acquire);
                }
                state
            }
        };
        outcome[index] = Some(if state == DONE {
            // SAFETY: done: its handler has finished writing (acquire above).
            let answer = unsafe { &*reply.answer.get() };
            Stack::Unwound {
                frames: answer.frames[..answer.depth].to_vec(),
                flags: answer.flags,
                complete: answer.complete,
            }
        } else if blocks_sigprof(reply.tid) {
            Stack::SignalBlocked
        } else if !is_alive(reply.tid) {
            Stack::Exited
        } else {
            Stack::NoAnswer
        });
    }
    let elapsed = started.elapsed();
    let dump = retire(pointer);
    let reader = dump.unwinding.memory.name();
    drop(dump);
    // Only now that no handler can read their unwind tables.
    drop(libraries);
    Ok(Taken {
        stacks: tids
            .iter()
            .copied()
            .zip(outcome.into_iter().map(|o| o.unwrap_or(Stack::NoAnswer)))
            .collect(),
        objects,
        elapsed,
        reader,
    })
}

/// Clears [`DUMP`], waits until no handler can still use the dump, and hands it back.
fn retire(pointer: *mut Dump) -> Box<Dump> {
    DUMP.store(std::ptr::null_mut(), Ordering::SeqCst);
    // A handler that loaded the pointer before it was cleared registered itself first
    // (both SeqCst), so it is counted here until it is done.
    while RUNNING_HANDLERS.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    // SAFETY: `pointer` came from `Box::into_raw`, and no handler can reach it any more.
    unsafe { Box::from_raw(pointer) }
}

/// Whether thread `tid` of this process still exists (`tgkill` with no signal).
fn is_alive(tid: u32) -> bool {
    // SAFETY: signal 0 only checks that the thread exists and may be signalled.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Sends `SIGPROF` carrying `value` to thread `tid` of this process.
fn send(tid: u32, value: u64) -> std::io::Result<()> {
    /// The layout of a `siginfo_t` queued by `sigqueue` on 64-bit Linux.
    #[repr(C)]
    struct QueuedSignalInfo {
        signo: libc::c_int,
        errno: libc::c_int,
        code: libc::c_int,
        _pad: libc::c_int,
        pid: libc::pid_t,
        uid: libc::uid_t,
        value: u64,
    }
    const _: () = assert!(size_of::<QueuedSignalInfo>() <= size_of::<libc::siginfo_t>());
    // SAFETY: an all-zero siginfo_t is valid; the fields written are the kernel's layout
    // for SI_QUEUE (checked against the size above).
    let result = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let queued = (&raw mut info).cast::<QueuedSignalInfo>();
        (*queued).signo = libc::SIGPROF;
        (*queued).code = libc::SI_QUEUE;
        (*queued).pid = libc::getpid();
        (*queued).uid = libc::getuid();
        (*queued).value = value;
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            tid as libc::pid_t,
            libc::SIGPROF,
            &raw const info,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sleeps until `word` is no longer `expected`, a wake, or `timeout`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT reads the word and sleeps; the pointers are valid for the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &raw const timeout,
        );
    }
}

/// Wakes up to `waiters` threads waiting on `word`; async-signal-safe (one system call).
fn futex_wake(word: &AtomicU32, waiters: i32) {
    // SAFETY: FUTEX_WAKE only reads the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            waiters,
        );
    }
}

/// A dump's signal, in the handler: answers it if its dump is the one running. Returns
/// whether the signal was a dump's (then the CPU session never sees it).
///
/// # Safety
/// `context` must be what the kernel passed to the `SA_SIGINFO` handler with `info`.
pub(super) unsafe fn on_signal(info: &TimerSignalInfo, context: *mut libc::c_void) -> bool {
    if info.code != libc::SI_QUEUE {
        return false;
    }
    let Some((id, index)) = parse_value(info.value) else {
        return false;
    };
    let dump = DUMP.load(Ordering::SeqCst);
    if dump.is_null() {
        return true;
    }
    // SAFETY: a published dump lives until no handler runs after it is cleared (`retire`),
    // and the caller registered in RUNNING_HANDLERS before loading it.
    let dump = unsafe { &*dump };
    if id == dump.id {
        // SAFETY: forwarded from the caller.
        unsafe { dump.answer(index, context) };
    }
    true
}

impl Dump {
    /// Writes this thread's stack into reply `index`, if it is this thread's and pending.
    ///
    /// # Safety
    /// `context` must be the `ucontext_t` the kernel passed to the handler.
    unsafe fn answer(&self, index: usize, context: *mut libc::c_void) {
        let Some(reply) = self.replies.get(index) else {
            return;
        };
        if reply.tid != current_tid()
            || reply
                .state
                .compare_exchange(PENDING, WRITING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // SAFETY: this handler moved the reply from pending to writing: it alone writes it.
        let answer = unsafe { &mut *reply.answer.get() };
        answer.depth = 0;
        answer.flags = 0;
        answer.complete = false;
        // SAFETY: forwarded from the caller.
        if let Some((pc, regs)) = unsafe { registers(context, self.unwinding.code_mask) } {
            answer.frames[0] = pc;
            answer.depth = 1;
            if let Some(flags) = self.unwinding.refusal(pc) {
                answer.flags = flags;
            } else if let Some(slot) = self.take_scratch() {
                // SAFETY: `take_scratch` gave this handler exclusive use of the slot.
                let scratch = unsafe { &mut *slot.scratch.get() };
                let Unwound {
                    depth,
                    flags,
                    complete,
                    ..
                } = self
                    .unwinding
                    .unwind((pc, regs), 0, scratch, Some(&mut answer.frames));
                self.release_scratch(slot);
                answer.depth = depth.max(1);
                answer.flags = flags;
                answer.complete = complete;
            } else {
                answer.flags = FLAG_NO_SCRATCH;
            }
        }
        reply.state.store(DONE, Ordering::Release);
        self.answered.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.answered, 1);
    }

    /// A free scratch slot. The holders are other threads' handlers, which finish in
    /// microseconds once they run again; on a busy machine one may be preempted for a
    /// while, so this sleeps on [`Dump::released`] until a slot is free, giving up (and
    /// answering with the PC alone) only once the dump's deadline has passed.
    fn take_scratch(&self) -> Option<&Slot> {
        loop {
            let seen = self.released.load(Ordering::Acquire);
            if let Some(slot) = self.scratch.iter().find(|slot| slot.try_take()) {
                return Some(slot);
            }
            if self.expired.load(Ordering::Acquire) {
                return None;
            }
            futex_wait(&self.released, seen, Duration::from_millis(1));
        }
    }

    /// Gives a scratch slot back and wakes the handlers waiting for one.
    fn release_scratch(&self, slot: &Slot) {
        slot.busy.store(false, Ordering::Release);
        self.released.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.released, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_values_carry_the_dump_and_the_slot() {
        let value = signal_value(0x1_2345, 7);
        assert_eq!(parse_value(value), Some((0x2345, 7)));
        assert_eq!(
            parse_value(crate::cpu::timers::signal_value(3, 1)),
            None,
            "a timer's value is not a dump's"
        );
        assert_eq!(parse_value(0), None);
    }
}
