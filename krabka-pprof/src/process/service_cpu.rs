//! Whether the service ran: the CPU the process's threads used, less what this
//! profiler's own threads (`super::OwnThread`) used, read twice. Unchanged, no thread of
//! the service ran between the two readings, so none of them changed its registers or
//! its stack: what a look found asleep is asleep there still, and the clocks read of
//! them then read the same now. A wall window's sweep skips its looks at quiet threads
//! so, and a drain its reading of every thread's clock, where nothing but the profiler
//! ran: an idle service costs them a reading (a few microseconds), not one per thread.
//!
//! The process's CPU clock is the sum of its threads' runtimes as the scheduler last
//! accounted them (`se.sum_exec_runtime`, the first field of a thread's `schedstat`);
//! reading it brings the reading thread's own up to date first, and nobody else's.
//! So the reading thread's own share is read from its `schedstat` at once after (the
//! same sum, not its CPU clock, which also counts the moments since), and every other
//! own thread's CPU clock is read before and after: the same both times, it did not
//! run meanwhile, and its clock is its share exactly; otherwise the reading cannot
//! tell, and says the service may have run. A service thread that runs and sleeps again
//! leaves a larger sum behind it, to the nanosecond; a tick that accounts the reading
//! thread between its two reads can only make the service's share look smaller, which
//! reads as a change too (the next reading compares with that one).

use std::time::Duration;

use super::{OWN_THREADS, ThreadFile, clock_time, current_tid};

/// The readings of one thread of this profiler at a time.
pub(crate) struct ServiceCpu {
    /// The reading thread, and its `schedstat`, kept open.
    reader: u32,
    own: Option<ThreadFile>,
    /// The service's share at the last reading, if it could be told.
    last: Option<Duration>,
    /// The other own threads' ids and clocks, before and after the process's clock.
    before: Vec<(u32, Duration)>,
    after: Vec<(u32, Duration)>,
}

impl ServiceCpu {
    /// For the thread that reads it first (another thread that reads it later takes it
    /// over: its first reading cannot tell). Opens nothing until then: a CPU session
    /// makes one on the thread that starts it, and its drain thread reads it.
    pub(crate) fn new() -> ServiceCpu {
        ServiceCpu {
            reader: 0,
            own: None,
            last: None,
            before: Vec::new(),
            after: Vec::new(),
        }
    }

    /// Whether a thread that is not one of this profiler's own may have used CPU since
    /// the last call: false only if it certainly did not (the first call, and any
    /// reading that cannot tell, say true).
    pub(crate) fn ran(&mut self) -> bool {
        let now = self.share();
        let unchanged = now.is_some() && now == self.last;
        self.last = now;
        !unchanged
    }

    /// The service's share of the process's CPU now, if it can be told: the CPU its
    /// threads used, as the scheduler last accounted it, from a start of its own (a
    /// difference of two is the CPU used between them).
    pub(crate) fn share(&mut self) -> Option<Duration> {
        let reader = current_tid();
        if reader != self.reader {
            *self = ServiceCpu {
                reader,
                own: ThreadFile::open(reader, "schedstat"),
                ..ServiceCpu::new()
            };
        }
        let me = current_tid();
        own_clocks(me, &mut self.before);
        let process = clock_time(libc::CLOCK_PROCESS_CPUTIME_ID).ok()?;
        let mine = self.own.as_ref()?.exec_runtime()?;
        own_clocks(me, &mut self.after);
        if self.before != self.after {
            return None;
        }
        let own: Duration = self.after.iter().map(|&(_, clock)| clock).sum();
        process.checked_sub(mine)?.checked_sub(own)
    }
}

/// This profiler's threads but `me`, each with its CPU clock (a thread gone between
/// reading its id and its clock is left out: the list read again differs).
fn own_clocks(me: u32, into: &mut Vec<(u32, Duration)>) {
    into.clear();
    for slot in &OWN_THREADS {
        let tid = slot.load(std::sync::atomic::Ordering::Acquire);
        if tid != 0
            && tid != me
            && let Ok(clock) = super::thread_cpu_time(tid)
        {
            into.push((tid, clock));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    use super::ServiceCpu;
    use crate::process::{OwnThread, clock_time};

    /// Burns `cpu` of the calling thread's CPU time.
    fn burn(cpu: Duration) {
        let from = clock_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap();
        while clock_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap() - from < cpu {
            std::hint::black_box(0u64);
        }
    }

    /// A thread of the service (not registered as the profiler's) that burns CPU between
    /// two readings is always seen; the profiler's own threads, the reading one and
    /// another, are not: with them alone busy, a reading says the service did not run
    /// (the test's other threads may run at any moment, so it is asked until it can say
    /// so, for up to 30 s of the client's clock).
    #[test]
    fn the_service_is_seen_to_run_and_the_profilers_own_threads_are_not() {
        let _own = OwnThread::register();
        let mut service = ServiceCpu::new();
        assert!(service.ran(), "the first reading cannot tell");
        for _ in 0..20 {
            service.ran();
            std::thread::spawn(|| burn(Duration::from_micros(200)))
                .join()
                .unwrap();
            assert!(service.ran(), "a thread of the service ran");
        }
        let (go, gone) = channel::<()>();
        let (done, finished) = channel::<()>();
        let other = std::thread::spawn(move || {
            let _own = OwnThread::register();
            while gone.recv().is_ok() {
                burn(Duration::from_micros(200));
                done.send(()).unwrap();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut quiet = false;
        while !quiet && Instant::now() < deadline {
            service.ran();
            burn(Duration::from_micros(200));
            go.send(()).unwrap();
            finished.recv().unwrap();
            quiet = !service.ran();
        }
        drop(go);
        other.join().unwrap();
        assert!(quiet, "own threads' CPU was always taken for the service's");
    }
}
