//! The sampler's clocks: one POSIX CPU-time timer per thread of the process, plus one
//! process-wide backstop, all sending `SIGPROF` tagged with the session's signal value.
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
//! Threads are found by listing `/proc/self/task` at the start and at every drain; a thread
//! that lives and dies between two listings is covered by the backstop, a
//! `CLOCK_PROCESS_CPUTIME_ID` timer whose signals the handler keeps only on threads that
//! have no timer of their own ([`Threads`]). A thread that exited loses its timer at the
//! next listing, so that timers (each holds a queued signal of the user's
//! `RLIMIT_SIGPENDING`) never outnumber the threads alive.
//!
//! Everything here runs off the signal path; the handler reads only [`Threads`] and the
//! signal values.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use super::thread_table::Threads;
use crate::process::{clock_time, list_threads, thread_cpu_clock};

/// What a timer's signal value says, besides the session it belongs to.
pub(crate) const KIND_THREAD: u64 = 1;
pub(crate) const KIND_BACKSTOP: u64 = 2;
/// High bits of every signal value this crate arms a timer with.
const SIGNAL_TAG: u64 = 0x4b52_4241 << 32;

/// The signal value for timers of `kind` in the session numbered `session`.
pub(crate) fn signal_value(session: u32, kind: u64) -> u64 {
    SIGNAL_TAG | u64::from(session) << 8 | kind
}

/// The timer kind of `value` if it belongs to the session numbered `session`.
pub(crate) fn signal_kind(value: u64, session: u32) -> Option<u64> {
    (value & !0xff == signal_value(session, 0)).then_some(value & 0xff)
}

/// One thread's timer and its CPU clock at the moment the timer was armed.
struct Tracked {
    timer: libc::c_int,
    clock: libc::clockid_t,
    cpu_at_start: Duration,
}

/// A thread's CPU over the part of the window it was tracked, read when the timers stop.
pub(crate) struct ThreadCpu {
    pub(crate) tid: u32,
    pub(crate) cpu: Duration,
}

/// Every timer of one session. Dropping it deletes them all.
pub(crate) struct Timers {
    session: u32,
    period: Duration,
    backstop: Option<libc::c_int>,
    threads: HashMap<u32, Tracked>,
    /// Why some thread has no timer (e.g. `RLIMIT_SIGPENDING` reached), said once.
    pub(crate) shortfall: Option<String>,
    seed: u64,
}

impl Timers {
    /// Arms one timer per current thread, registering each in `threads`, then the
    /// backstop (after them, so that it never samples a thread that has its own).
    pub(crate) fn start(session: u32, frequency: u32, threads: &Threads) -> io::Result<Timers> {
        let period = Duration::from_nanos(1_000_000_000 / u64::from(frequency.max(1)));
        let mut timers = Timers {
            session,
            period,
            backstop: None,
            threads: HashMap::new(),
            shortfall: None,
            seed: seed(),
        };
        timers.refresh(threads);
        let backstop = create(
            libc::CLOCK_PROCESS_CPUTIME_ID,
            libc::SIGEV_SIGNAL,
            0,
            signal_value(session, KIND_BACKSTOP),
        )?;
        timers.backstop = Some(backstop);
        timers.arm(backstop)?;
        Ok(timers)
    }

    /// Gives a timer to every thread that started since the last call, and forgets the
    /// threads that exited (deleting their timers).
    pub(crate) fn refresh(&mut self, threads: &Threads) {
        let alive = list_threads();
        if alive.is_empty() {
            return;
        }
        let exited: Vec<u32> = threads
            .known()
            .filter(|tid| alive.binary_search(tid).is_err())
            .collect();
        for tid in exited {
            let timer = self.threads.remove(&tid).map(|tracked| {
                delete(tracked.timer);
                tracked.timer
            });
            threads.forget(tid, timer);
        }
        for &tid in &alive {
            if threads.add(tid).is_none() {
                self.shortfall.get_or_insert_with(|| {
                    "more threads than the sampler tracks: the newest are sampled by the \
                     process-wide timer"
                        .to_owned()
                });
                continue;
            }
            if self.threads.contains_key(&tid) || self.shortfall.is_some() {
                continue;
            }
            match self.track(tid, threads) {
                Ok(()) => {}
                // The thread exited between the listing and now.
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {}
                Err(err) => {
                    self.shortfall = Some(format!(
                        "thread {tid} and later threads have no CPU timer of their own \
                         ({err}); the process-wide timer samples them"
                    ));
                }
            }
        }
    }

    fn track(&mut self, tid: u32, threads: &Threads) -> io::Result<()> {
        let clock = thread_cpu_clock(tid);
        let cpu_at_start = clock_time(clock)?;
        let timer = create(
            clock,
            libc::SIGEV_THREAD_ID,
            tid as libc::c_int,
            signal_value(self.session, KIND_THREAD),
        )?;
        threads.set_timed(tid, timer);
        self.threads.insert(
            tid,
            Tracked {
                timer,
                clock,
                cpu_at_start,
            },
        );
        self.arm(timer)
    }

    /// Starts `timer` with the session's period, its first expiry uniform in (0, period]
    /// so that threads that live less than a period are sampled without bias.
    fn arm(&mut self, timer: libc::c_int) -> io::Result<()> {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let period = self.period.as_nanos() as u64;
        let first = 1 + self.seed % period;
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
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Each tracked thread's CPU clock now.
    pub(crate) fn clocks(&self) -> HashMap<u32, Duration> {
        self.threads
            .iter()
            .filter_map(|(&tid, tracked)| Some((tid, clock_time(tracked.clock).ok()?)))
            .collect()
    }

    /// The CPU each tracked thread still alive used since `clocks` were read (a thread
    /// tracked later: since its timer was armed).
    pub(crate) fn cpu_since(&self, clocks: &HashMap<u32, Duration>) -> Vec<ThreadCpu> {
        self.threads
            .iter()
            .filter_map(|(&tid, tracked)| {
                let now = clock_time(tracked.clock).ok()?;
                let since = clocks.get(&tid).copied().unwrap_or(tracked.cpu_at_start);
                Some(ThreadCpu {
                    tid,
                    cpu: now.saturating_sub(since),
                })
            })
            .collect()
    }

    /// How many threads have a timer of their own.
    pub(crate) fn tracked(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for Timers {
    fn drop(&mut self) {
        if let Some(backstop) = self.backstop.take() {
            delete(backstop);
        }
        for (_, tracked) in self.threads.drain() {
            delete(tracked.timer);
        }
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

/// The raw `timer_create` system call (glibc's wrapper hides the kernel's timer id behind
/// its own `timer_t`; the kernel id is what `si_timerid` reports and `timer_settime` takes).
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

fn delete(timer: libc::c_int) {
    // SAFETY: deleting a timer id this session created, once.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
}

fn timespec(nanos: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (nanos / 1_000_000_000) as _,
        tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
    }
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (u64::from(nanos) << 1 | 1) ^ u64::from(std::process::id()) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_values_name_their_session_and_kind() {
        let value = signal_value(7, KIND_THREAD);
        assert_eq!(signal_kind(value, 7), Some(KIND_THREAD));
        assert_eq!(
            signal_kind(signal_value(7, KIND_BACKSTOP), 7),
            Some(KIND_BACKSTOP)
        );
        assert_eq!(signal_kind(value, 8), None, "another session's timer");
        assert_eq!(signal_kind(0, 7), None, "kill(2) carries no value");
        assert_eq!(signal_kind(value & 0xffff_ffff, 7), None, "no tag");
    }
}
