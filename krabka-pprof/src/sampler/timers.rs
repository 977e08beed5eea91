//! The sampler's clocks: one POSIX CPU-time timer per thread of the process, plus one
//! process-wide backstop per session, all sending `SIGPROF` with a value that says whose
//! timer it is.
//!
//! Why per thread (as Go does since 1.18): one process-wide `ITIMER_PROF` has one pending
//! signal per process and is checked once per tick, so on several busy cores most periods
//! are lost; it survives `execve`, where `SIGPROF`'s default action kills the new program;
//! and its signal goes to any thread that does not block it, so a thread that blocks
//! `SIGPROF` has its CPU charged to an idle one. A `CLOCK_THREAD_CPUTIME_ID` timer with
//! `SIGEV_THREAD_ID` signals exactly the thread whose CPU it measures, reports the periods
//! it could not signal as overrun (so each sample carries the CPU it stands for), and, like
//! every POSIX timer, is not inherited by `fork` and is deleted by `execve`.
//!
//! A thread's timer carries the thread's id in its signal value, so the handler knows whose
//! sample it is without a system call, for any number of timers ever made. Threads are
//! found by listing `/proc/self/task` at the start and at the drains' looks at the threads
//! (`thread_work_every` in `drain.rs`, when they changed); a thread that lives
//! and dies between two listings is covered by the backstop, a `CLOCK_PROCESS_CPUTIME_ID`
//! timer whose signals the handler keeps only on threads that have no timer of their own.
//! A thread that exited loses its timer at the next listing, so timers (each holds one
//! queued signal of the user's `RLIMIT_SIGPENDING`) never outnumber the threads alive. A
//! timer that could not be made (`EAGAIN` at that limit) is tried again at the next look.
//!
//! The thread timers outlive sessions ([`Registry`], one per process): a session arms them
//! and its end disarms them. A timer's signal that stays pending on a thread that blocks
//! `SIGPROF` is the timer's own preallocated one: deleting the timer would leave it queued
//! and charged to `RLIMIT_SIGPENDING` for as long as the thread lives, one more per
//! session, whereas a timer kept, disarmed, holds exactly one. So at a session's end the
//! timers of threads that block `SIGPROF` are kept for the next session, and the others
//! deleted (no signal of theirs can be pending once disarmed).
//!
//! Everything here runs off the signal path; the handler reads only the signal values.

use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::process::{PerProcess, blocks_signal, clock_time, thread_cpu_clock};

/// High 32 bits of a thread timer's signal value ("KRBT"); its low 32 bits are the
/// thread's id.
const THREAD_TAG: u64 = 0x4b52_4254;
/// High 32 bits of a backstop's signal value ("KRBB"); its low 32 bits are the session's
/// number.
const BACKSTOP_TAG: u64 = 0x4b52_4242;

/// Whose timer a `SIGPROF` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The timer of thread `tid`.
    Thread(u32),
    /// The running session's backstop.
    Backstop,
}

/// The signal value of thread `tid`'s timer.
pub(crate) fn thread_value(tid: u32) -> u64 {
    THREAD_TAG << 32 | u64::from(tid)
}

/// The signal value of the backstop of the session numbered `session`.
pub(crate) fn backstop_value(session: u32) -> u64 {
    BACKSTOP_TAG << 32 | u64::from(session)
}

/// Whose timer sent `value`, if it is one of this crate's timers and (for a backstop)
/// the running session's. Async-signal-safe.
pub(crate) fn source(value: u64, session: u32) -> Option<Source> {
    match value >> 32 {
        THREAD_TAG => Some(Source::Thread(value as u32)),
        BACKSTOP_TAG if value as u32 == session => Some(Source::Backstop),
        _ => None,
    }
}

/// The layout of a `siginfo_t` for `SIGPROF` on 64-bit Linux as this crate's senders fill
/// it: a POSIX timer's (`SI_TIMER`: timer id, overrun, value) and a dump's
/// `rt_tgsigqueueinfo` (`SI_QUEUE`: its value at the same offset).
#[repr(C)]
pub(crate) struct SignalInfo {
    pub(crate) signo: libc::c_int,
    pub(crate) errno: libc::c_int,
    pub(crate) code: libc::c_int,
    pub(crate) _pad: libc::c_int,
    pub(crate) timer: libc::c_int,
    pub(crate) overrun: libc::c_int,
    pub(crate) value: u64,
}

const _: () = assert!(size_of::<SignalInfo>() <= size_of::<libc::siginfo_t>());

/// One thread's timer.
struct ThreadTimer {
    timer: libc::c_int,
    clock: libc::clockid_t,
    /// When it was made, in clock ticks since boot (the unit of a thread's start time in
    /// its `stat`).
    made: u64,
}

/// Every thread timer of this process (a child made by `fork` starts with none: POSIX
/// timers are not inherited, and [`PerProcess`] gives it a registry of its own).
pub(crate) struct Registry {
    timers: HashMap<u32, ThreadTimer>,
    /// The running session's period; `None` between sessions (timers disarmed).
    period: Option<Duration>,
    /// Why the last listing left some thread without a timer, if it did.
    shortfall: Option<String>,
    seed: u64,
}

static REGISTRY: PerProcess<Mutex<Registry>> = PerProcess::new(|| {
    Mutex::new(Registry {
        timers: HashMap::new(),
        period: None,
        shortfall: None,
        seed: seed(),
    })
});

/// What [`Registry::refresh`] changed.
#[derive(Default)]
pub(crate) struct Changes {
    /// Threads that got a timer.
    pub(crate) timed: Vec<u32>,
    /// Threads whose timer was deleted: they exited.
    pub(crate) exited: Vec<u32>,
}

impl Registry {
    /// This process's timers.
    pub(crate) fn lock() -> MutexGuard<'static, Registry> {
        REGISTRY
            .get()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A session starts at `period`: every timer kept from the last one is armed.
    pub(crate) fn arm(&mut self, period: Duration) {
        self.period = Some(period);
        let tids: Vec<u32> = self.timers.keys().copied().collect();
        for tid in tids {
            // An error is `ESRCH`: the thread exited since, and its timer is of no use.
            if self.arm_one(tid).is_err() {
                self.delete(tid);
            }
        }
    }

    /// The session ends: every timer is disarmed, and deleted unless its thread blocks
    /// `SIGPROF` (see the module docs).
    pub(crate) fn disarm(&mut self) {
        self.period = None;
        let tids: Vec<u32> = self.timers.keys().copied().collect();
        for tid in tids {
            if let Some(timer) = self.timers.get(&tid) {
                settime(timer.timer, 0, 0);
            }
            if !blocks_signal(tid, libc::SIGPROF) {
                self.delete(tid);
            }
        }
    }

    /// Gives a timer to every thread in `alive` (sorted) that has none, and deletes the
    /// timers of threads no longer alive. A thread that cannot get one now is tried again
    /// at the next call.
    pub(crate) fn refresh(&mut self, alive: &[u32]) -> Changes {
        debug_assert!(alive.windows(2).all(|w| w[0] < w[1]));
        let mut changes = Changes::default();
        let exited: Vec<u32> = self
            .timers
            .keys()
            .copied()
            .filter(|tid| alive.binary_search(tid).is_err())
            .collect();
        for tid in exited {
            self.delete(tid);
            changes.exited.push(tid);
        }
        self.shortfall = None;
        for &tid in alive {
            if self.timers.contains_key(&tid) {
                continue;
            }
            match self.create(tid) {
                Ok(()) => changes.timed.push(tid),
                // The thread exited between the listing and now.
                Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ESRCH)) => {
                    self.delete(tid);
                }
                Err(err) => {
                    self.delete(tid);
                    let untimed = self.shortfall.get_or_insert_with(String::new);
                    if untimed.is_empty() {
                        *untimed = format!(
                            "some threads have no CPU timer of their own ({err}; tried again \
                             at the next look at the threads); the process-wide timer samples them"
                        );
                    }
                }
            }
        }
        changes
    }

    /// Makes thread `tid`'s timer anew if its thread id was used again by another thread,
    /// whose CPU the old timer (bound to the thread that exited) never measures: the thread
    /// with that id now started after the timer was made (its start time, in its `stat`). A timer whose thread is still the one it was made for is kept, with
    /// whatever periods it has pending (a thread that ran in a burst gets them as one late
    /// signal). Whether it was made anew.
    pub(crate) fn renew(&mut self, tid: u32) -> bool {
        let Some(made) = self.timers.get(&tid).map(|timer| timer.made) else {
            return false;
        };
        match crate::process::thread_start_ticks(tid) {
            // The same clock tick (10 ms) is taken for the same thread: the kernel uses an
            // id again only once its counter has wrapped.
            Some(started) if started <= made => return false,
            Some(_) => {}
            // Gone: the next listing forgets it.
            None => return false,
        }
        self.delete(tid);
        match self.create(tid) {
            Ok(()) => true,
            Err(_) => {
                self.delete(tid);
                false
            }
        }
    }

    /// Each timed thread's CPU clock now (threads that exited since are left out).
    pub(crate) fn clocks(&self, into: &mut Vec<(u32, Duration)>) {
        into.clear();
        into.extend(
            self.timers
                .iter()
                .filter_map(|(&tid, timer)| Some((tid, clock_time(timer.clock).ok()?))),
        );
    }

    /// Whether thread `tid` has a timer.
    pub(crate) fn is_timed(&self, tid: u32) -> bool {
        self.timers.contains_key(&tid)
    }

    /// How many threads have a timer of their own.
    pub(crate) fn len(&self) -> usize {
        self.timers.len()
    }

    /// Why the last listing left some thread without a timer, if it did.
    pub(crate) fn shortfall(&self) -> Option<&str> {
        self.shortfall.as_deref()
    }

    fn create(&mut self, tid: u32) -> io::Result<()> {
        let clock = thread_cpu_clock(tid);
        let timer = create(
            clock,
            libc::SIGEV_THREAD_ID,
            tid as libc::c_int,
            thread_value(tid),
        )?;
        self.timers.insert(
            tid,
            ThreadTimer {
                timer,
                clock,
                made: crate::process::boot_ticks(),
            },
        );
        if self.period.is_some() {
            self.arm_one(tid)?;
        }
        Ok(())
    }

    /// Starts thread `tid`'s timer with the session's period, its first expiry uniform in
    /// (0, period] so that threads that live less than a period are sampled without bias.
    fn arm_one(&mut self, tid: u32) -> io::Result<()> {
        let (Some(period), Some(timer)) = (self.period, self.timers.get(&tid)) else {
            return Ok(());
        };
        let period = period.as_nanos() as u64;
        if settime(timer.timer, period, first_expiry(&mut self.seed, period)) {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn delete(&mut self, tid: u32) {
        if let Some(timer) = self.timers.remove(&tid) {
            delete(timer.timer);
        }
    }
}

/// A session's process-wide timer, for threads too short-lived to get one of their own.
/// Dropping it deletes it, unless this is a child made by `fork` (the id would name one
/// of the child's own timers, if any).
pub(crate) struct Backstop {
    timer: libc::c_int,
    pid: u32,
}

impl Backstop {
    /// Arms the backstop of session `session` at `period`.
    pub(crate) fn start(session: u32, period: Duration) -> io::Result<Backstop> {
        let timer = create(
            libc::CLOCK_PROCESS_CPUTIME_ID,
            libc::SIGEV_SIGNAL,
            0,
            backstop_value(session),
        )?;
        let backstop = Backstop {
            timer,
            pid: std::process::id(),
        };
        let nanos = period.as_nanos() as u64;
        if !settime(timer, nanos, nanos) {
            return Err(io::Error::last_os_error());
        }
        Ok(backstop)
    }
}

impl Backstop {
    /// Stops it signalling (another handler replaced ours); deleting it is left to `drop`.
    pub(crate) fn disarm(&self) {
        if self.pid == std::process::id() {
            settime(self.timer, 0, 0);
        }
    }
}

impl Drop for Backstop {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            delete(self.timer);
        }
    }
}

/// The raw `timer_create` system call (glibc's wrapper hides the kernel's timer id behind
/// its own `timer_t`; the kernel id is what `timer_settime` takes).
fn create(
    clock: libc::clockid_t,
    notify: libc::c_int,
    tid: libc::c_int,
    value: u64,
) -> io::Result<libc::c_int> {
    // SAFETY: sigevent is plain data; every field the kernel reads is set below.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_notify = notify;
    event.sigev_signo = libc::SIGPROF;
    event.sigev_value = libc::sigval {
        sival_ptr: value as usize as *mut libc::c_void,
    };
    event.sigev_notify_thread_id = tid;
    let mut timer: libc::c_int = 0;
    // SAFETY: the kernel reads `event` and writes the new id into `timer`.
    let result = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            clock,
            &raw mut event,
            &raw mut timer,
        )
    };
    if result == 0 {
        Ok(timer)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `timer` to fire every `period` nanoseconds, the first time after `first` (both 0:
/// disarmed). Whether the kernel took it.
fn settime(timer: libc::c_int, period: u64, first: u64) -> bool {
    let spec = libc::itimerspec {
        it_interval: timespec(period),
        it_value: timespec(first),
    };
    // SAFETY: the timer id came from timer_create; the spec is fully initialised.
    let result = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer,
            0,
            &raw const spec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    result == 0
}

fn delete(timer: libc::c_int) {
    // SAFETY: deleting a timer id this process created, once.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
}

fn timespec(nanos: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (nanos / 1_000_000_000) as _,
        tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
    }
}

/// A first expiry in (0, `period`] nanoseconds, drawn from `seed` (xorshift64, which
/// never leaves 0: the seed is odd).
fn first_expiry(seed: &mut u64, period: u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    1 + *seed % period
}

/// The first expiries' seed: odd, and another in each process and at each moment.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (u64::from(nanos) << 1 | 1) ^ u64::from(std::process::id()) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// First expiries fall in (0, period] and spread evenly over it, so that a thread
    /// that lives less than a period is sampled with a chance in proportion to its life;
    /// the seed is never xorshift's fixed point 0, and another moment gives another.
    #[test]
    fn first_expiries_are_uniform_in_the_period_from_a_seed_that_varies() {
        let mut drawn = seed();
        assert_eq!(drawn & 1, 1, "odd: {drawn:#x}");
        assert_eq!(
            drawn >> 32,
            u64::from(std::process::id()),
            "another in each process: the process id is its top half ({drawn:#x})"
        );
        let period = 1000;
        let mut quarters = [0u32; 4];
        for _ in 0..40_000 {
            let first = first_expiry(&mut drawn, period);
            assert!((1..=period).contains(&first), "{first}");
            quarters[((first - 1) * 4 / period) as usize] += 1;
        }
        // 10,000 expected in each, give or take 90 (one standard deviation).
        assert!(
            quarters.iter().all(|q| (9_000..=11_000).contains(q)),
            "{quarters:?}"
        );
        let earlier = seed();
        let later = (0..1_000_000).map(|_| seed()).find(|s| *s != earlier);
        assert!(later.is_some(), "the seed never changed: {earlier:#x}");
    }

    /// The draw is xorshift64 with Marsaglia's shifts (13, 7, 17), whose orbit from any
    /// seed but 0 is every value but 0 (its period is 2^64 - 1: no thread's first expiry
    /// repeats another's soon): the first three draws from seed 1, worked out by hand from
    /// the three steps, with a period past every state (so each draw is its state + 1).
    #[test]
    fn first_expiries_are_drawn_by_xorshift64() {
        let mut state = 1;
        let draws: Vec<u64> = (0..3).map(|_| first_expiry(&mut state, u64::MAX)).collect();
        assert_eq!(
            draws,
            [
                0x4082_2041 + 1,
                0x1000_4106_0c01_1441 + 1,
                0x9b1e_842f_6e86_2629 + 1
            ]
        );
        assert_eq!(state, 0x9b1e_842f_6e86_2629, "the state the draws leave");
    }

    #[test]
    fn signal_values_name_their_thread_or_session() {
        assert_eq!(
            source(thread_value(4242), 7),
            Some(Source::Thread(4242)),
            "a thread's timer names its thread, whatever the session"
        );
        assert_eq!(
            source(thread_value(u32::MAX), 1),
            Some(Source::Thread(u32::MAX))
        );
        assert_eq!(source(backstop_value(7), 7), Some(Source::Backstop));
        assert_eq!(
            source(backstop_value(7), 8),
            None,
            "another session's backstop"
        );
        assert_eq!(source(0, 7), None, "kill(2) carries no value");
        assert_eq!(source(4242, 7), None, "no tag");
    }

    /// The kernel's own list of this process's POSIX timers (`/proc/self/timers`):
    /// how many notify thread `tid`.
    fn kernel_timers_of(tid: u32) -> usize {
        let listing = std::fs::read_to_string("/proc/self/timers").unwrap();
        let suffix = format!("tid.{tid}");
        listing
            .lines()
            .filter(|line| line.starts_with("notify:") && line.ends_with(&suffix))
            .count()
    }

    /// A registry of its own (not the process's, which sessions use), never armed: no
    /// timer here ever fires. What it says it has is checked against the kernel's list.
    #[test]
    fn the_registry_gives_timers_to_the_threads_listed_and_deletes_those_gone() {
        // No session meanwhile: its registry would time these threads too.
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A thread that blocks SIGPROF, parked until told to go.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let parked = std::thread::spawn(move || {
            // SAFETY: sigset_t is plain data, filled by sigemptyset and sigaddset; the
            // mask is this thread's own.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&raw mut set);
                libc::sigaddset(&raw mut set, libc::SIGPROF);
                libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
            }
            tid_tx.send(crate::process::current_tid()).unwrap();
            go_rx.recv().ok();
        });
        let blocking = tid_rx.recv().unwrap();
        let me = crate::process::current_tid();
        let mut registry = Registry {
            timers: HashMap::new(),
            period: None,
            shortfall: None,
            seed: seed(),
        };
        let mut alive = vec![me, blocking];
        alive.sort_unstable();
        let changes = registry.refresh(&alive);
        assert_eq!(changes.timed, alive);
        assert!(changes.exited.is_empty());
        assert_eq!(registry.len(), 2);
        assert!(registry.is_timed(me) && registry.is_timed(blocking));
        assert!(!registry.is_timed(1), "pid 1 is no thread of this process");
        assert_eq!((kernel_timers_of(me), kernel_timers_of(blocking)), (1, 1));
        assert_eq!(registry.shortfall(), None);
        let mut clocks = Vec::new();
        registry.clocks(&mut clocks);
        clocks.sort_unstable();
        assert_eq!(clocks.iter().map(|c| c.0).collect::<Vec<_>>(), alive);
        assert!(clocks.iter().all(|c| c.1 > Duration::ZERO), "{clocks:?}");

        // Listed again: nothing new. A thread id no thread has: no timer, and no shortfall
        // (the thread "exited" between the listing and now).
        let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let ghost = (1..pid_max)
            .rev()
            .find(|tid| !std::path::Path::new(&format!("/proc/{tid}")).exists())
            .unwrap();
        let mut with_ghost = alive.clone();
        with_ghost.push(ghost);
        let changes = registry.refresh(&with_ghost);
        assert!(changes.timed.is_empty() && changes.exited.is_empty());
        assert!(!registry.is_timed(ghost));
        assert_eq!(registry.shortfall(), None);

        // A silent timer of the thread it was made for is kept, with its pending periods:
        // this thread started before its timer was made.
        let made = registry.timers[&me].made;
        let timer = registry.timers[&me].timer;
        assert!(!registry.renew(me), "the same thread: kept");
        assert_eq!(registry.timers[&me].timer, timer);
        // Renewed where the thread with that id started after the timer was made (its id
        // used again): a new timer in place of the old, one still.
        registry.timers.get_mut(&me).unwrap().made = 0;
        assert!(registry.renew(me));
        assert!(registry.timers[&me].made >= made);
        assert_eq!(kernel_timers_of(me), 1);
        assert!(!registry.renew(ghost), "no thread, no timer");
        assert!(!registry.is_timed(ghost));

        // A thread no longer listed loses its timer.
        let changes = registry.refresh(&[blocking]);
        assert_eq!(changes.exited, [me]);
        assert_eq!(kernel_timers_of(me), 0);
        assert_eq!(registry.len(), 1);

        // The session's end deletes every timer but those of threads that block SIGPROF.
        registry.refresh(&alive);
        assert_eq!(kernel_timers_of(me), 1);
        registry.disarm();
        assert_eq!((kernel_timers_of(me), kernel_timers_of(blocking)), (0, 1));
        assert!(registry.is_timed(blocking) && !registry.is_timed(me));
        registry.refresh(&[]);
        assert_eq!(kernel_timers_of(blocking), 0);
        go_tx.send(()).unwrap();
        parked.join().unwrap();
    }
}
