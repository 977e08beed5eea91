//! The signal side of thread dumps: what a thread does, in its `SIGURG` handler
//! ([`on_dump_signal`]), when a dump asks it for its stack (step 2 of the contract in
//! `sampler.rs`). The collector's side, which publishes a [`Dump`], reads sleeping threads
//! without a signal (`asleep.rs`) and asks the others, is `asking.rs`.
//!
//! A dump's signal is sent with `rt_tgsigqueueinfo`: `si_code` is `SI_QUEUE` and the
//! signal value carries [`DUMP_TAG`], the dump's number and the thread's reply slot.
//! It is `SIGURG`, not the CPU timers' `SIGPROF` (`signals.rs`), so a dump's signal is
//! never a sample, never a foreign signal, and the CPU session's counts and buffers are
//! untouched; a `SIGURG` that is not a dump's is left alone.
//!
//! In the handler, the thread checks that the slot is its own (`gettid`), claims it with a
//! compare-and-swap (pending → writing), borrows a scratch slot (its unwind cache and
//! stack copy; if all are taken, it sleeps on a futex until one is given back, for at most
//! [`MAX_SCRATCH_WAIT`], then answers with its PC alone, marked), unwinds from the interrupted context exactly as a CPU sample does, and
//! marks the reply done; then it wakes the collector with a futex. Nothing in it
//! allocates or takes a lock; it waits only for a scratch slot, about a millisecond at most:
//! the thread may hold the application's locks.
//! A late signal, after the dump is gone, finds no dump with its number and returns at
//! once.
//!
//! A thread with a seccomp filter of its own (its reply marked so by the collector, which
//! read its `status`) makes only the system calls every filter allows: no `gettid` (the
//! kernel delivers the signal to exactly the thread it names), no futex (it spins a
//! bounded while for a scratch slot, and the collector notices its answer on its own
//! timeout), and its stack is copied through its scratch slot's pipe with `write` and
//! `read` (`memory.rs`), never with `pread` or `process_vm_readv`.

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use super::buffer::FLAG_NO_SCRATCH;
use super::scratch::{Scratch, Slot};
use super::signals::Running;
use super::timers::SignalInfo;
use super::unwind::{MAX_DEPTH, Unwinding, Unwound, registers};
use crate::process::current_tid;

/// High 32 bits of a dump's signal value ("KRBD"); a timer's are "KRBA".
const DUMP_TAG: u64 = 0x4b52_4244;
/// Reply slots a dump has at most: the signal value has 16 bits for the slot.
pub(crate) const MAX_DUMP_THREADS: usize = 1 << 16;

pub(crate) const PENDING: u8 = 0;
pub(crate) const WRITING: u8 = 1;
pub(crate) const DONE: u8 = 2;
pub(crate) const EXPIRED: u8 = 3;

/// How many times a handler without futex calls (a thread with its own seccomp filter)
/// looks for a free scratch slot before it answers with its PC alone: about a millisecond.
const FILTERED_SPINS: u32 = 1 << 14;

/// How long a dump's handler waits for a scratch slot at most before it answers with its
/// PC alone: the interrupted thread may hold locks its application's other threads wait
/// on.
pub(crate) const MAX_SCRATCH_WAIT: Duration = Duration::from_millis(1);

/// The dump running now, if any; the handler reads it.
pub(crate) static DUMP: AtomicPtr<Dump> = AtomicPtr::new(std::ptr::null_mut());

/// The signal value that asks reply slot `index` of dump `id` for its stack.
pub(crate) fn signal_value(id: u16, index: usize) -> u64 {
    DUMP_TAG << 32 | u64::from(id) << 16 | index as u64 & 0xffff
}

/// The dump number and reply slot of a dump's signal value.
fn parse_value(value: u64) -> Option<(u16, usize)> {
    (value >> 32 == DUMP_TAG).then_some(((value >> 16) as u16, (value & 0xffff) as usize))
}

/// One thread's stack, as its handler wrote it.
pub(crate) struct Answer {
    pub(crate) depth: usize,
    pub(crate) flags: u8,
    pub(crate) complete: bool,
    pub(crate) frames: [u64; MAX_DEPTH],
}

impl Answer {
    /// An empty answer, to be written by a handler.
    pub(crate) fn new() -> Answer {
        Answer {
            depth: 0,
            flags: 0,
            complete: false,
            frames: [0; MAX_DEPTH],
        }
    }

    /// The stack written, off the signal path.
    pub(crate) fn stack(&self) -> Stack {
        Stack {
            frames: self.frames[..self.depth].to_vec(),
            flags: self.flags,
            complete: self.complete,
        }
    }
}

/// One thread's stack, leaf first: the PC it was stopped at, then return addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stack {
    pub(crate) frames: Vec<u64>,
    /// `FLAG_*` of the sampler: truncated, blocklisted, not unwound and why.
    pub(crate) flags: u8,
    /// The unwind reached the outermost frame.
    pub(crate) complete: bool,
}

pub(crate) struct Reply {
    pub(crate) tid: u32,
    pub(crate) state: AtomicU8,
    /// The thread has a seccomp filter of its own: its handler makes no system call that
    /// filter may forbid (see the module docs). Set before it is signalled.
    pub(crate) filtered: AtomicBool,
    pub(crate) answer: UnsafeCell<Answer>,
}

/// What the collector sleeps on (a futex word), and what wakes it: a handler's answer, or
/// the request that asked for the dump going away (its client hung up).
#[derive(Default)]
pub(crate) struct Wake {
    word: AtomicU32,
    cancelled: AtomicBool,
}

impl Wake {
    /// Wakes the collector; async-signal-safe (one system call).
    pub(crate) fn wake(&self) {
        self.word.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.word, i32::MAX);
    }

    /// The request went away: the collector stops waiting at once.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.wake();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// The word's value now: what [`sleep`](Self::sleep) compares against.
    pub(crate) fn seen(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    /// Sleeps until a wake after `seen` was read, or `timeout`.
    pub(crate) fn sleep(&self, seen: u32, timeout: Duration) {
        futex_wait(&self.word, seen, timeout);
    }
}

/// Everything a dump's handlers read.
pub(crate) struct Dump {
    /// Its number, carried by its signals: a late signal of an earlier dump is not this
    /// one's.
    pub(crate) id: u16,
    pub(crate) unwinding: Unwinding,
    pub(crate) scratch: Box<[Slot]>,
    pub(crate) replies: Box<[Reply]>,
    /// Replies done.
    pub(crate) answered: AtomicU32,
    /// What wakes the collector; shared with the request, which cancels through it.
    pub(crate) wake: Arc<Wake>,
    /// Scratch slots given back; handlers waiting for one wait on it as a futex.
    pub(crate) released: AtomicU32,
    /// The deadline has passed: a handler still waiting for a scratch slot stops waiting.
    pub(crate) expired: AtomicBool,
}

// SAFETY: a reply's `answer` is only written by the handler that moved its state from
// pending to writing, and only read by the collector once the state is done (release /
// acquire); the scratch slots are guarded by their flag, as in a CPU session.
unsafe impl Sync for Dump {}

/// Sleeps until `word` is no longer `expected`, a wake, or `timeout`.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = libc::timespec {
        // `as _`: `time_t`, whose alias musl's libc deprecates; no wait here nears 2^31 s.
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as _,
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
pub(crate) fn futex_wake(word: &AtomicU32, waiters: i32) {
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

/// Dump handlers running now: a dump is freed only once this is zero after its pointer
/// was cleared.
pub(crate) static DUMP_HANDLERS: Running = Running::new();

/// The handler of a dump's signal (`SIGURG`, see `signals.rs`): answers it if its dump is
/// the one running; any other `SIGURG` is left alone, as its default action would.
pub(crate) extern "C" fn on_dump_signal(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    if info.is_null() {
        return;
    }
    // SAFETY: errno is thread-local; reading and restoring it is what makes the handler
    // invisible to the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    DUMP_HANDLERS.enter();
    // SAFETY: the kernel's siginfo is valid for the handler's duration, and at least as
    // large as the layout read; `context` comes from the kernel.
    unsafe { answer_signal(&*info.cast::<SignalInfo>(), context) };
    DUMP_HANDLERS.leave();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Answers a dump's signal if its dump is the one running.
///
/// # Safety
/// `context` must be what the kernel passed to the `SA_SIGINFO` handler with `info`.
unsafe fn answer_signal(info: &SignalInfo, context: *mut libc::c_void) {
    if info.code != libc::SI_QUEUE {
        return;
    }
    let Some((id, index)) = parse_value(info.value) else {
        return;
    };
    let dump = DUMP.load(Ordering::SeqCst);
    if dump.is_null() {
        return;
    }
    // SAFETY: a published dump lives until DUMP_HANDLERS is seen at zero after it was
    // cleared (`retire` in asking.rs), and this handler entered DUMP_HANDLERS before
    // loading it.
    let dump = unsafe { &*dump };
    if id == dump.id {
        // SAFETY: forwarded from the caller.
        unsafe { dump.answer(index, context) };
    }
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
        let filtered = reply.filtered.load(Ordering::Acquire);
        // `rt_tgsigqueueinfo` delivers to exactly the thread it names; `gettid` checks the
        // value was not sent by someone else, where the thread's filter allows it.
        if (!filtered && reply.tid != current_tid())
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
            } else if let Some(slot) = self.take_scratch(filtered) {
                // SAFETY: `take_scratch` gave this handler exclusive use of the slot.
                let Scratch { cache, stack, .. } = unsafe { &mut *slot.scratch.get() };
                let Unwound {
                    depth,
                    flags,
                    complete,
                    ..
                } = self.unwinding.unwind(
                    (pc, regs),
                    0,
                    filtered.then_some(&slot.pipe),
                    cache,
                    stack,
                    &mut answer.frames,
                );
                self.release_scratch(slot, filtered);
                answer.depth = depth.max(1);
                answer.flags = flags;
                answer.complete = complete;
            } else {
                answer.flags = FLAG_NO_SCRATCH;
            }
        }
        reply.state.store(DONE, Ordering::Release);
        self.answered.fetch_add(1, Ordering::AcqRel);
        if !filtered {
            self.wake.wake();
        }
    }

    /// A free scratch slot. The holders are other threads' handlers, which finish in
    /// microseconds once they run again; on a busy machine one may be preempted for a
    /// while, so this sleeps on [`Dump::released`] until a slot is free, giving up (and
    /// answering with the PC alone) after [`MAX_SCRATCH_WAIT`], or at once when the dump's
    /// deadline has passed. A `filtered` thread's handler makes no futex call: it spins,
    /// for at most [`FILTERED_SPINS`].
    fn take_scratch(&self, filtered: bool) -> Option<&Slot> {
        let mut spins = 0u32;
        let mut give_up = None;
        loop {
            let seen = self.released.load(Ordering::Acquire);
            if let Some(slot) = self.scratch.iter().find(|slot| slot.try_take()) {
                return Some(slot);
            }
            if self.expired.load(Ordering::Acquire) {
                return None;
            }
            if filtered {
                if spins == FILTERED_SPINS {
                    return None;
                }
                spins += 1;
                std::hint::spin_loop();
            } else {
                let now = super::handler::monotonic_nanos();
                let give_up = *give_up.get_or_insert(now + MAX_SCRATCH_WAIT.as_nanos() as u64);
                if now >= give_up {
                    return None;
                }
                futex_wait(&self.released, seen, Duration::from_nanos(give_up - now));
            }
        }
    }

    /// Gives a scratch slot back and wakes the handlers waiting for one (a `filtered`
    /// thread's handler does not: they wake on their own timeout).
    fn release_scratch(&self, slot: &Slot, filtered: bool) {
        slot.busy.store(false, Ordering::Release);
        self.released.fetch_add(1, Ordering::AcqRel);
        if !filtered {
            futex_wake(&self.released, i32::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dumps_handler_gives_up_on_a_scratch_slot_within_its_bound() {
        // Every slot held (by handlers preempted on other threads), the dump's deadline
        // far off: the handler's thread may hold the application's locks, so it answers
        // without a slot instead of waiting for one, and takes one as soon as one is free.
        let objects = crate::objects::Objects::current();
        let dump = Dump {
            id: 1,
            unwinding: Unwinding::new(&objects, &[], super::super::memory::Memory::choose().memory),
            scratch: (0..2).map(|_| Slot::new()).collect(),
            replies: Box::new([]),
            answered: AtomicU32::new(0),
            wake: Arc::new(Wake::default()),
            released: AtomicU32::new(0),
            expired: AtomicBool::new(false),
        };
        for slot in dump.scratch.iter() {
            assert!(slot.try_take());
        }
        for filtered in [false, true] {
            let started = std::time::Instant::now();
            assert!(
                dump.take_scratch(filtered).is_none(),
                "filtered: {filtered}"
            );
            // By the test's clock, generously: the handler gave up long before the
            // dump's deadline (10 s), the wait it was bounded by before.
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "filtered: {filtered}, {:?}",
                started.elapsed()
            );
        }
        dump.release_scratch(&dump.scratch[1], false);
        assert!(std::ptr::eq(
            dump.take_scratch(false)
                .expect("a slot given back is taken"),
            &dump.scratch[1]
        ));
    }

    #[test]
    fn signal_values_carry_the_dump_and_the_slot() {
        let value = signal_value(0x2345, 7);
        assert_eq!(parse_value(value), Some((0x2345, 7)));
        let highest = signal_value(u16::MAX, 0xffff);
        assert_eq!(
            highest >> 32,
            DUMP_TAG,
            "the dump's number ran into the tag"
        );
        assert_eq!(parse_value(highest), Some((u16::MAX, 0xffff)));
        assert_eq!(
            parse_value(super::super::timers::thread_value(3)),
            None,
            "a timer's value is not a dump's"
        );
        assert_eq!(parse_value(0), None);
    }

    /// A dump asks as many threads as its signal value has slots for, and no more.
    #[test]
    fn a_dump_has_a_reply_slot_for_each_value_of_the_signals_slot_field() {
        let last = MAX_DUMP_THREADS - 1;
        assert_eq!(parse_value(signal_value(9, last)), Some((9, last)));
        assert_eq!(
            parse_value(signal_value(9, MAX_DUMP_THREADS)),
            Some((9, 0)),
            "one slot more would wrap to slot 0"
        );
    }

    #[test]
    fn a_wake_moves_the_word_a_sleeper_compares() {
        let wake = Wake::default();
        let before = wake.seen();
        wake.wake();
        let after = wake.seen();
        assert_ne!(after, before);
        wake.cancel();
        assert!(wake.is_cancelled());
        assert_ne!(wake.seen(), after, "a cancel wakes too");
        // Asleep with the word already moved: back at once (the wake came first).
        wake.sleep(before, Duration::from_secs(600));
    }

    /// A collector asleep on the word (as the kernel shows it: in `futex`) is woken by a
    /// wake, long before its timeout.
    #[cfg(procfs)]
    #[test]
    fn a_wake_wakes_a_collector_asleep_on_the_word() {
        use crate::process::{InKernel, ProcThread};
        let wake = Arc::new(Wake::default());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let timeout = Duration::from_secs(120);
        let sleeper = {
            let wake = wake.clone();
            std::thread::spawn(move || {
                let seen = wake.seen();
                tid_tx.send(current_tid()).unwrap();
                let start = std::time::Instant::now();
                wake.sleep(seen, timeout);
                start.elapsed()
            })
        };
        let tid = tid_rx.recv().unwrap();
        let looking = std::time::Instant::now();
        while !matches!(
            ProcThread::in_kernel(tid),
            Some(InKernel::Asleep { nr, .. }) if nr == libc::SYS_futex
        ) {
            assert!(
                looking.elapsed() < Duration::from_secs(60),
                "the sleeper never slept"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        wake.wake();
        let slept = sleeper.join().unwrap();
        assert!(slept < timeout, "woken, not timed out: {slept:?}");
    }

    /// Without a wake, a sleeper sleeps: a loop that sleeps until 50 ms have passed takes
    /// a few turns (a signal may cut one short), not the millions of a sleep that does not.
    #[test]
    fn a_sleep_without_a_wake_waits_for_its_timeout() {
        let wake = Wake::default();
        let seen = wake.seen();
        let start = std::time::Instant::now();
        let mut turns = 0;
        while let Some(left) = Duration::from_millis(50).checked_sub(start.elapsed()) {
            wake.sleep(seen, left);
            turns += 1;
        }
        assert!(turns < 100, "{turns} turns to sleep 50 ms");
    }
}
