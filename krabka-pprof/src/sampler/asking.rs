//! The collector's side of thread dumps (off the signal path, on the blocking pool): it
//! builds a [`Dump`] (an unwinder over the loaded objects' tables, a reply slot per listed
//! thread, a few scratch slots), publishes it in [`DUMP`], and reads a thread asleep in
//! the kernel without a signal (`asleep.rs`); only the others are asked with `SIGURG`
//! (`dump.rs` is what the thread does then).
//!
//! One dump at a time per process: [`DumpTurn`] is taken before the dump goes to the
//! blocking pool; a request that finds it taken is refused at once with the time the
//! running dump still needs, never queued. Its holder can cancel the dump
//! ([`DumpTurn::canceller`], when its client hangs up). The collector waits until every
//! thread asked has answered, the deadline passes (from the last thread asked) or the dump
//! is cancelled, signalling again every [`RESEND_EVERY`] (a pending `SIGURG` makes the
//! kernel drop another). Then it expires the replies still pending (a late handler leaves
//! them alone), waits for those being written, clears [`DUMP`] and waits until no handler
//! runs before freeing the dump. A thread that blocks `SIGURG` (its `SigBlk` seen twice a
//! millisecond apart: its own handler's mask holds it too) is not signalled and is
//! reported so; one that exits or blocks it after being asked is not waited for. A thread
//! whose sleeping stack did not unwind to its end is asked too, and if it cannot answer,
//! the part read is its answer. A thread with a seccomp filter of its own (its `status`)
//! answers without the system calls its filter may forbid (`dump.rs`). A late signal finds
//! no dump with its number and returns at once.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::asleep::{Asleep, Read};
use super::buffer::FLAG_NO_SCRATCH;
use super::dump::{
    Answer, DONE, DUMP, DUMP_HANDLERS, Dump, EXPIRED, MAX_DUMP_THREADS, PENDING, Reply, Stack,
    WRITING, Wake, futex_wake, on_dump_signal, signal_value,
};
use super::fork::register_fork_handler;
use super::frames::drop_guessed_callers;
use super::memory::Memory;
use super::scratch::{Slot, scratch_slots};
use super::signals::{DUMP_SIGNAL, StartError, install, is_free_for};
use super::unwind::Unwinding;
use crate::objects::Objects;
use crate::process::{PerProcess, ProcThread, ThreadStatus, current_tid};

/// How often a thread that has not answered is signalled again (and looked at).
const RESEND_EVERY: Duration = Duration::from_millis(10);
/// How often a thread whose handler found no scratch slot is asked again.
const BUSY_RETRIES: u8 = 3;
/// How far apart two looks at a pending thread's signal mask are.
const BLOCKED_LOOK: Duration = Duration::from_millis(1);

/// The next dump's number: 16 bits of the signal's value (wrapping, as dumps take turns).
static NEXT_DUMP: AtomicU16 = AtomicU16::new(1);
/// When the running dump's deadline ends. Per process: a forked child has no dump.
static TURN: PerProcess<Mutex<Option<Instant>>> = PerProcess::new(|| Mutex::new(None));

/// The one dump of this process that may run now; given back when dropped.
pub(crate) struct DumpTurn {
    wake: Arc<Wake>,
    /// The process that took it (a forked child gives back only its own).
    pid: u32,
}

impl DumpTurn {
    /// The turn, for a dump that waits up to `deadline`; else how long the other waits.
    pub(crate) fn take(deadline: Duration) -> Result<DumpTurn, Duration> {
        let mut running = TURN.get().lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(ends) = *running {
            return Err(ends.saturating_duration_since(now));
        }
        *running = Some(now + deadline);
        Ok(DumpTurn {
            wake: Arc::new(Wake::default()),
            pid: std::process::id(),
        })
    }

    /// What cancels this turn's dump from elsewhere (the request's future, once its
    /// client hangs up).
    pub(crate) fn canceller(&self) -> Canceller {
        Canceller(self.wake.clone())
    }

    /// Whether the dump was cancelled.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.wake.is_cancelled()
    }
}

impl Drop for DumpTurn {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            *TURN.get().lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}

/// Cancels a dump: its collector stops waiting at once, wherever it runs.
pub(crate) struct Canceller(Arc<Wake>);

impl Canceller {
    pub(crate) fn cancel(&self) {
        self.0.cancel();
    }
}

/// What one thread answered.
pub(crate) enum ThreadAnswer {
    /// Its stack: unwound by the thread itself when signalled, or read while it slept,
    /// without a signal.
    Unwound(Stack),
    /// It blocks `SIGURG`, so it was not asked; `part`: what was read of its stack while
    /// it slept, if anything.
    SignalBlocked { part: Option<Stack> },
    /// It sleeps in system call `syscall`, which a signal would cut short (not a futex
    /// wait), and its stack was read without one up to a frame that needs the frame
    /// pointer: `part`, exact, and not signalled.
    AsleepInPart { part: Stack, syscall: i64 },
    /// It did not answer before the deadline; `part` as above.
    NoAnswer { part: Option<Stack> },
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
    /// From the start to the last answer (or the deadline).
    pub(crate) elapsed: Duration,
    /// How the stacks were read (`process_vm_readv`, `/proc/self/mem`, none).
    pub(crate) reader: &'static str,
    /// Threads read whole while they slept, without a signal.
    pub(crate) asleep: usize,
    /// Threads sent a signal.
    pub(crate) signalled: usize,
}

/// Asks each of `tids` (threads of this process) for its stack, reading the sleeping ones
/// without a signal, and waits up to `deadline` for the others' answers, or until `turn`'s
/// dump is cancelled. Blocks; call it on the blocking pool.
/// Whether a thread asleep in system call `syscall`, whose stack read without a signal
/// stopped at the frame of return address `stopped` (see `asleep.rs`), may be signalled
/// for the rest: whether its wait survives a signal. Given by the dump's caller, which
/// can name functions (the sampler cannot). A futex wait always does: the kernel restarts
/// one without a timeout, and std's and parking_lot's loops retry a timed one.
pub(crate) type SurvivesSignal = fn(syscall: i64, stopped: Option<u64>, objects: &Objects) -> bool;

pub(crate) fn take_dump(
    turn: &DumpTurn,
    tids: &[u32],
    blocklist: &[&str],
    deadline: Duration,
    survives: SurvivesSignal,
) -> Result<ThreadStacks, StartError> {
    register_fork_handler();
    if !is_free_for(DUMP_SIGNAL, on_dump_signal) {
        return Err(StartError::ForeignHandler);
    }
    let objects = Objects::current();
    let unwinding = Unwinding::new(&objects, blocklist, Memory::choose().memory);
    let tids = &tids[..tids.len().min(MAX_DUMP_THREADS)];
    let dump = Box::new(Dump {
        id: NEXT_DUMP.fetch_add(1, Ordering::Relaxed),
        unwinding,
        scratch: (0..scratch_slots()).map(|_| Slot::new()).collect(),
        replies: tids
            .iter()
            .map(|&tid| Reply {
                tid,
                state: AtomicU8::new(PENDING),
                filtered: AtomicBool::new(false),
                answer: UnsafeCell::new(Answer::new()),
            })
            .collect(),
        answered: AtomicU32::new(0),
        wake: turn.wake.clone(),
        released: AtomicU32::new(0),
        expired: AtomicBool::new(false),
    });
    install(DUMP_SIGNAL, on_dump_signal)?;
    let pointer = Box::into_raw(dump);
    // One dump at a time (the turn), and a forked child clears its copy: the slot is free.
    DUMP.store(pointer, Ordering::SeqCst);
    // SAFETY: the dump lives until `retire` below.
    let dump = unsafe { &*pointer };

    let started = Instant::now();
    let mut collector = Collector::new(dump, &objects);
    collector.survives = survives;
    collector.ask_every_thread();
    collector.wait(deadline);
    let stacks = collector.finish();
    let (asleep, signalled) = (collector.asleep.read, collector.signalled);
    let elapsed = started.elapsed();
    let reader = dump.unwinding.memory.name();
    retire(pointer);
    Ok(ThreadStacks {
        stacks: tids.iter().copied().zip(stacks).collect(),
        objects,
        elapsed,
        reader,
        asleep,
        signalled,
    })
}

/// One dump's collection: what is known of each reply so far.
struct Collector<'d> {
    dump: &'d Dump,
    objects: &'d Objects,
    /// Per reply, its outcome once known before the end: read asleep, or not askable.
    outcome: Vec<Option<ThreadAnswer>>,
    /// Per reply, the part of its stack read while it slept, if it did not unwind whole.
    parts: Vec<Option<Stack>>,
    /// Per reply, whether it was signalled.
    asked: Vec<bool>,
    /// Per reply, how often it was asked again after an answer without its stack (its
    /// handler found no scratch slot within a millisecond).
    retried: Vec<u8>,
    /// Per reply asked again, its first answer (the PC alone, marked): what it stays if
    /// the thread does not answer again.
    first: Vec<Option<Stack>>,
    /// Replies whose thread blocked `SIGURG` at the first look.
    deferred: Vec<usize>,
    asleep: Asleep,
    survives: SurvivesSignal,
    signalled: usize,
    /// The seccomp mode and filters of this thread: a thread with others has its own.
    own_filter: Option<(u32, u32)>,
    pipes_open: bool,
}

impl<'d> Collector<'d> {
    fn new(dump: &'d Dump, objects: &'d Objects) -> Collector<'d> {
        let n = dump.replies.len();
        Collector {
            dump,
            objects,
            outcome: (0..n).map(|_| None).collect(),
            parts: vec![None; n],
            asked: vec![false; n],
            retried: vec![0; n],
            first: vec![None; n],
            deferred: Vec::new(),
            asleep: Asleep::new(),
            survives: |syscall, _, _| syscall == libc::SYS_futex,
            signalled: 0,
            own_filter: ProcThread::seccomp(current_tid()),
            pipes_open: false,
        }
    }

    /// Settles reply `index` before the end: nothing will write it.
    fn settle(&mut self, index: usize, answer: ThreadAnswer) {
        self.dump.replies[index]
            .state
            .store(EXPIRED, Ordering::SeqCst);
        self.outcome[index] = Some(answer);
    }

    /// Reads every sleeping thread, and asks the others (or defers those that block the
    /// signal), unless the dump is cancelled meanwhile.
    fn ask_every_thread(&mut self) {
        for index in 0..self.dump.replies.len() {
            if self.dump.wake.is_cancelled() {
                return;
            }
            let tid = self.dump.replies[index].tid;
            if self.read_asleep(index) {
                continue;
            }
            // A thread that fell asleep since it was looked at is read asleep instead: a
            // signal now could cut its wait short. (A thread can still fall asleep in the
            // microseconds between this look and the signal: docs/threads.md says so.)
            if cfg!(target_arch = "x86_64")
                && self.parts[index].is_none()
                && matches!(
                    ProcThread::in_kernel(tid),
                    Some(crate::process::InKernel::Asleep { .. })
                )
                && self.read_asleep(index)
            {
                continue;
            }
            // A thread whose mask holds SIGURG is not signalled: the signal would stay
            // pending on it. The mask also holds SIGURG while the thread's own handler runs
            // (microseconds), so such a thread is looked at again BLOCKED_LOOK later.
            match ProcThread::status(tid) {
                None => self.settle(index, ThreadAnswer::Exited),
                Some(status) if status.blocks(DUMP_SIGNAL) => self.deferred.push(index),
                Some(status) => self.ask(index, &status),
            }
        }
    }

    /// Reads reply `index`'s thread where it sleeps, if it does; whether that settled it
    /// (its whole stack, or an exact part of a wait a signal would cut short). A part of
    /// a wait a signal does not cut short is kept, and the thread is to be asked.
    fn read_asleep(&mut self, index: usize) -> bool {
        #[cfg(test)]
        if tests::SIGNAL_EVERY_THREAD.load(Ordering::SeqCst) {
            return false;
        }
        let tid = self.dump.replies[index].tid;
        match self.asleep.read(&self.dump.unwinding, self.objects, tid) {
            Read::Whole { stack, .. } => {
                self.settle(index, ThreadAnswer::Unwound(stack));
                return true;
            }
            // A wait a signal does not cut short (`SurvivesSignal`): the thread is
            // asked for the rest. Any other: the exact part is its answer, and it is
            // not signalled.
            Read::Part { stack, syscall }
                if !(self.survives)(syscall, stack.frames.last().copied(), self.objects) =>
            {
                let answer = ThreadAnswer::AsleepInPart {
                    part: stack,
                    syscall,
                };
                self.settle(index, answer);
                return true;
            }
            Read::Part { stack, .. } => self.parts[index] = Some(stack),
            Read::NotAsleep => {}
        }
        false
    }

    /// Signals reply `index`'s thread, marking it first if it has a seccomp filter of its
    /// own; settles it if it cannot be signalled.
    fn ask(&mut self, index: usize, status: &ThreadStatus) {
        let reply = &self.dump.replies[index];
        if matches!(status.seccomp, Some((mode, _)) if mode != 0)
            && status.seccomp != self.own_filter
        {
            if !self.pipes_open {
                for slot in self.dump.scratch.iter() {
                    slot.pipe.open();
                }
                self.pipes_open = true;
            }
            reply.filtered.store(true, Ordering::SeqCst);
        }
        match send(reply.tid, signal_value(self.dump.id, index)) {
            Ok(()) => {
                self.asked[index] = true;
                self.signalled += 1;
            }
            Err(err) => self.settle(index, not_signalled(err)),
        }
    }

    /// Whether reply `index` was asked and has not answered yet.
    fn is_waited_for(&self, index: usize) -> bool {
        self.asked[index]
            && self.outcome[index].is_none()
            && self.dump.replies[index].state.load(Ordering::Acquire) == PENDING
    }

    /// Waits for the answers, up to `deadline` from now.
    fn wait(&mut self, deadline: Duration) {
        let wake = &*self.dump.wake;
        let mut pacing = Pacing::new(Instant::now(), deadline);
        loop {
            let seen = wake.seen();
            let now = Instant::now();
            let waiting = self.asked.iter().filter(|a| **a).count();
            let answered = self.dump.answered.load(Ordering::Acquire) as usize;
            if wake.is_cancelled() || pacing.is_over(now) {
                return;
            }
            if answered >= waiting && self.deferred.is_empty() {
                if !self.busy_to_ask_again() {
                    return;
                }
                // Asked again at the resend pace: the slots' holders are handlers that
                // another thread's preemption holds up, for a while.
                if pacing.resend_due(now) && self.ask_busy_again() > 0 {
                    pacing.sent(Instant::now());
                } else {
                    wake.sleep(seen, pacing.sleep(now, true));
                }
                continue;
            }
            if !self.deferred.is_empty() && pacing.look_due(now) {
                for index in std::mem::take(&mut self.deferred) {
                    match ProcThread::status(self.dump.replies[index].tid) {
                        None => self.settle(index, ThreadAnswer::Exited),
                        Some(status) if status.blocks(DUMP_SIGNAL) => {
                            let part = self.parts[index].take();
                            self.settle(index, ThreadAnswer::SignalBlocked { part });
                        }
                        Some(status) => self.ask(index, &status),
                    }
                }
                pacing.looked(Instant::now());
            }
            if pacing.check_due(now) {
                // A thread asked that has exited since, or has blocked SIGURG since, cannot
                // answer.
                let all_unable = (0..self.asked.len())
                    .filter(|&index| self.is_waited_for(index))
                    .all(|index| {
                        ProcThread::status(self.dump.replies[index].tid)
                            .is_none_or(|status| status.blocks(DUMP_SIGNAL))
                    });
                if pacing.checked(Instant::now(), all_unable, self.deferred.is_empty()) {
                    return;
                }
            }
            if pacing.resend_due(now) {
                for index in 0..self.asked.len() {
                    if self.is_waited_for(index) {
                        let reply = &self.dump.replies[index];
                        // An error now (the thread exited) shows at the end.
                        let _ = send(reply.tid, signal_value(self.dump.id, index));
                    }
                }
                pacing.sent(Instant::now());
            }
            let sleep = pacing.sleep(Instant::now(), self.deferred.is_empty());
            wake.sleep(seen, sleep);
        }
    }

    /// Whether a thread answered without its stack, for want of a scratch slot, and may be
    /// asked again.
    fn busy_to_ask_again(&self) -> bool {
        (0..self.asked.len()).any(|index| {
            let reply = &self.dump.replies[index];
            self.asked[index]
                && self.outcome[index].is_none()
                && self.retried[index] < BUSY_RETRIES
                && reply.state.load(Ordering::Acquire) == DONE
                // SAFETY: done: its handler has finished writing (acquire above).
                && unsafe { (*reply.answer.get()).flags } & FLAG_NO_SCRATCH != 0
        })
    }

    /// Asks again, at most [`BUSY_RETRIES`] times each, the threads whose handler found
    /// every scratch slot taken for a millisecond and answered with its PC alone (a
    /// handler never waits longer: its thread may hold the application's locks); returns
    /// how many were asked.
    fn ask_busy_again(&mut self) -> usize {
        let mut asked = 0;
        for index in 0..self.asked.len() {
            let reply = &self.dump.replies[index];
            if !self.asked[index]
                || self.outcome[index].is_some()
                || self.retried[index] >= BUSY_RETRIES
                || reply.state.load(Ordering::Acquire) != DONE
            {
                continue;
            }
            // SAFETY: done: its handler has finished writing (acquire above), and none
            // writes it again until it is pending.
            let busy = unsafe { (*reply.answer.get()).flags } & FLAG_NO_SCRATCH != 0;
            if !busy {
                continue;
            }
            // Asleep since it answered: read where it sleeps, as a thread is before its
            // first signal, rather than cut its wait short.
            if cfg!(target_arch = "x86_64")
                && matches!(
                    ProcThread::in_kernel(reply.tid),
                    Some(crate::process::InKernel::Asleep { .. })
                )
                && self.read_asleep(index)
            {
                continue;
            }
            // SAFETY: as above.
            let first = unsafe { (*reply.answer.get()).stack() };
            if reply
                .state
                .compare_exchange(DONE, PENDING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.first[index] = Some(first);
                self.dump.answered.fetch_sub(1, Ordering::AcqRel);
                self.retried[index] += 1;
                asked += 1;
                if send(reply.tid, signal_value(self.dump.id, index)).is_err() {
                    // Gone since: its first answer stands, and it is not waited for.
                    if reply
                        .state
                        .compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.dump.answered.fetch_add(1, Ordering::AcqRel);
                        asked -= 1;
                    }
                }
            }
        }
        asked
    }

    /// Expires every reply still pending and gives each reply's answer.
    fn finish(&mut self) -> Vec<ThreadAnswer> {
        self.dump.expired.store(true, Ordering::Release);
        futex_wake(&self.dump.released, i32::MAX);
        let mut answers = Vec::with_capacity(self.outcome.len());
        for (index, reply) in self.dump.replies.iter().enumerate() {
            if let Some(answer) = self.outcome[index].take() {
                answers.push(answer);
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
            let part = self.parts[index].take();
            answers.push(if state == DONE {
                // SAFETY: done: its handler has finished writing (acquire above).
                let answer = unsafe { &*reply.answer.get() };
                let mut stack = answer.stack();
                drop_guessed_callers(&mut stack, &self.dump.unwinding, self.objects);
                ThreadAnswer::Unwound(stack)
            } else if let Some(mut stack) = self.first[index].take() {
                // Asked again, and silent since: its first answer stands.
                drop_guessed_callers(&mut stack, &self.dump.unwinding, self.objects);
                ThreadAnswer::Unwound(stack)
            } else {
                unanswered(ProcThread::status(reply.tid), part)
            });
        }
        answers
    }
}

/// What a thread that did not answer by the end is listed as, by its `status` then:
/// blocking the signal, gone, or silent; `part` is what was read of its stack while it
/// slept, if anything.
fn unanswered(status: Option<ThreadStatus>, part: Option<Stack>) -> ThreadAnswer {
    match status {
        Some(status) if status.blocks(DUMP_SIGNAL) => ThreadAnswer::SignalBlocked { part },
        None => ThreadAnswer::Exited,
        Some(_) => ThreadAnswer::NoAnswer { part },
    }
}

/// What a thread the signal could not be sent to is listed as: gone if the kernel no
/// longer knows it, else the error.
fn not_signalled(err: std::io::Error) -> ThreadAnswer {
    if err.raw_os_error() == Some(libc::ESRCH) {
        ThreadAnswer::Exited
    } else {
        ThreadAnswer::NotSignalled(err)
    }
}

/// The collector's timetable while it waits for answers: when it looks again at the
/// threads that blocked the signal at the first look (every [`BLOCKED_LOOK`]), looks
/// whether the threads it waits for can still answer and sends the signal again to those
/// (each every [`RESEND_EVERY`]: handlers of threads with a seccomp filter of their own
/// do not wake the collector), and how long it may sleep in between. Each step is given
/// the time it happens at.
struct Pacing {
    started: Instant,
    deadline: Duration,
    looked: Instant,
    checked: Instant,
    sent: Instant,
    /// Whether the last check found every thread waited for unable to answer.
    all_unable_before: bool,
}

impl Pacing {
    fn new(started: Instant, deadline: Duration) -> Pacing {
        Pacing {
            started,
            deadline,
            looked: started,
            checked: started,
            sent: started,
            all_unable_before: false,
        }
    }

    /// Whether the deadline has passed at `now`.
    fn is_over(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) >= self.deadline
    }

    /// Whether it is time to look again at the threads that blocked the signal.
    fn look_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.looked) >= BLOCKED_LOOK
    }

    fn looked(&mut self, now: Instant) {
        self.looked = now;
    }

    /// Whether it is time to look whether the threads waited for can still answer.
    fn check_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.checked) >= RESEND_EVERY
    }

    /// A check at `now` found every thread waited for unable to answer (exited, or
    /// blocking the signal since it was sent), or not: whether there is nothing left to
    /// wait for, which takes two such checks in a row (a thread's mask also holds the
    /// signal while its own handler runs) and no thread deferred.
    fn checked(&mut self, now: Instant, all_unable: bool, none_deferred: bool) -> bool {
        let done = all_unable && self.all_unable_before && none_deferred;
        self.all_unable_before = all_unable;
        self.checked = now;
        done
    }

    /// Whether it is time to send the signal again to the threads that have not answered
    /// (one already pending on a thread makes the kernel drop the next).
    fn resend_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.sent) >= RESEND_EVERY
    }

    fn sent(&mut self, now: Instant) {
        self.sent = now;
    }

    /// How long to sleep at `now` before the next step: to the deadline, the next resend
    /// or, unless `none_deferred`, the next look; at least 100 µs.
    fn sleep(&self, now: Instant, none_deferred: bool) -> Duration {
        let since = |then: Instant| now.saturating_duration_since(then);
        let mut sleep = (self.deadline.saturating_sub(since(self.started)))
            .min(RESEND_EVERY.saturating_sub(since(self.sent)));
        if !none_deferred {
            sleep = sleep.min(BLOCKED_LOOK.saturating_sub(since(self.looked)));
        }
        sleep.max(Duration::from_micros(100))
    }
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

/// Sends `SIGURG` carrying `value` to thread `tid` of this process.
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

#[cfg(test)]
mod tests;
