//! The collector's side of thread dumps (off the signal path, on the blocking pool): it
//! builds a [`Dump`] (an unwinder over the loaded objects' tables, a reply slot per
//! listed thread, a few scratch slots), publishes it in [`DUMP`] and asks each thread for
//! its stack with `SIGPROF` (`dump.rs` is what the thread does then).
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
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::dump::{
    Answer, DONE, DUMP, DUMP_HANDLERS, Dump, EXPIRED, MAX_DUMP_THREADS, PENDING, Reply, WRITING,
    futex_wait, futex_wake, on_dump_signal, signal_value,
};
use super::fork::register_fork_handler;
use super::memory::Memory;
use super::scratch::{Slot, scratch_slots};
use super::signals::{CPU_SIGNAL, DUMP_SIGNAL, StartError, install, is_free_for};
use super::unwind::{MAX_DEPTH, Unwinding};
use crate::objects::Objects;
use crate::process::{PerProcess, blocks_signal};

/// How often a thread that has not answered is signalled again.
const RESEND_EVERY: Duration = Duration::from_millis(10);
/// How far apart two looks at a pending thread's signal mask are.
const BLOCKED_LOOK: Duration = Duration::from_millis(1);

static NEXT_DUMP: AtomicU32 = AtomicU32::new(1);
/// One dump at a time: the next waits (each ends by its deadline). Per process: a child
/// made by `fork` during a dump must not inherit the lock held.
static ONE_DUMP: PerProcess<Mutex<()>> = PerProcess::new(|| Mutex::new(()));

/// What one thread answered.
pub(crate) enum ThreadAnswer {
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
pub(crate) struct ThreadStacks {
    /// Per thread asked, in the order given.
    pub(crate) stacks: Vec<(u32, ThreadAnswer)>,
    /// The objects the stacks' addresses lie in, for symbols.
    pub(crate) objects: Objects,
    /// From the first signal to the last answer (or the deadline).
    pub(crate) elapsed: Duration,
    /// How the stacks were read (`process_vm_readv`, `/proc/self/mem`, none).
    pub(crate) reader: &'static str,
}

/// Asks each of `tids` (threads of this process) for its stack and waits up to
/// `deadline` for the answers. Blocks; call it on the blocking pool.
pub(crate) fn take_dump(
    tids: &[u32],
    blocklist: &[&str],
    deadline: Duration,
) -> Result<ThreadStacks, StartError> {
    let _one = ONE_DUMP
        .get()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    register_fork_handler();
    if !is_free_for(DUMP_SIGNAL, on_dump_signal) {
        return Err(StartError::ForeignHandler);
    }
    let objects = Objects::current();
    let unwinding = Unwinding::new(&objects, blocklist, Memory::choose().memory);
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
    install(DUMP_SIGNAL, on_dump_signal, CPU_SIGNAL)?;
    let pointer = Box::into_raw(dump);
    // One dump at a time (`ONE_DUMP`), and a forked child clears its copy: the slot is
    // free.
    DUMP.store(pointer, Ordering::SeqCst);
    // SAFETY: the dump lives until `retire` below.
    let dump = unsafe { &*pointer };

    let started = Instant::now();
    let mut outcome: Vec<Option<ThreadAnswer>> = tids.iter().map(|_| None).collect();
    // Asks reply `index`'s thread; false if it cannot be asked (then `outcome` says why).
    let ask = |index: usize, outcome: &mut Vec<Option<ThreadAnswer>>| {
        let early = match send(tids[index], signal_value(dump.id, index)) {
            Ok(()) => return true,
            Err(err) if err.raw_os_error() == Some(libc::ESRCH) => ThreadAnswer::Exited,
            Err(err) => ThreadAnswer::NotSignalled(err),
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
        if blocks_signal(tid, DUMP_SIGNAL) {
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
                if blocks_signal(tids[index], DUMP_SIGNAL) {
                    dump.replies[index].state.store(EXPIRED, Ordering::SeqCst);
                    outcome[index] = Some(ThreadAnswer::SignalBlocked);
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
                .all(|(_, reply)| !is_alive(reply.tid) || blocks_signal(reply.tid, DUMP_SIGNAL));
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
            ThreadAnswer::Unwound {
                frames: answer.frames[..answer.depth].to_vec(),
                flags: answer.flags,
                complete: answer.complete,
            }
        } else if blocks_signal(reply.tid, DUMP_SIGNAL) {
            ThreadAnswer::SignalBlocked
        } else if !is_alive(reply.tid) {
            ThreadAnswer::Exited
        } else {
            ThreadAnswer::NoAnswer
        });
    }
    let elapsed = started.elapsed();
    let reader = dump.unwinding.memory.name();
    retire(pointer);
    Ok(ThreadStacks {
        stacks: tids
            .iter()
            .copied()
            .zip(
                outcome
                    .into_iter()
                    .map(|o| o.unwrap_or(ThreadAnswer::NoAnswer)),
            )
            .collect(),
        objects,
        elapsed,
        reader,
    })
}

/// Clears [`DUMP`] and waits until no handler can still use the dump; then frees it, or
/// leaves it allocated if a handler never returned.
fn retire(pointer: *mut Dump) {
    DUMP.store(std::ptr::null_mut(), Ordering::SeqCst);
    if DUMP_HANDLERS.wait_until_none() {
        // SAFETY: `pointer` came from `Box::into_raw`, and no handler can reach it any more.
        drop(unsafe { Box::from_raw(pointer) });
    }
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
        (*queued).signo = DUMP_SIGNAL;
        (*queued).code = libc::SI_QUEUE;
        (*queued).pid = libc::getpid();
        (*queued).uid = libc::getuid();
        (*queued).value = value;
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            tid as libc::pid_t,
            DUMP_SIGNAL,
            &raw const info,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
