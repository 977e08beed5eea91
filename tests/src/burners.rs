//! CPU burners: threads that run a workload and note their own CPU clock, so a test knows
//! how much CPU they used inside a profile's window; and the process's and a thread's
//! CPU clocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::hot;

/// CPU time used by this process so far (user + system).
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Threads that call a workload in a loop until dropped or finished, or until `limit` has
/// passed. Each thread notes its own CPU clock every few milliseconds, so a test can tell
/// exactly how much CPU the burners used inside a profile's window.
pub struct Burner {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<(SystemTime, Duration)>>>,
}

/// Per burner thread: `(wall clock, that thread's CPU time)` readings.
pub struct CpuTimeline(Vec<Vec<(SystemTime, Duration)>>);

impl CpuTimeline {
    /// CPU the burner threads used between `start` and `end` (to within a few ms).
    pub fn cpu_within(&self, start: SystemTime, end: SystemTime) -> Duration {
        self.0
            .iter()
            .filter_map(|readings| {
                let first = readings.iter().find(|(at, _)| *at >= start)?;
                let last = readings.iter().rev().find(|(at, _)| *at <= end)?;
                Some(last.1.saturating_sub(first.1))
            })
            .sum()
    }
}

impl Burner {
    /// Burns CPU in [`hot::krabka_hot_spin`].
    pub fn start(threads: usize, limit: Duration) -> Burner {
        Burner::start_with(threads, limit, || {
            std::hint::black_box(hot::krabka_hot_spin(std::hint::black_box(20_000)));
        })
    }

    /// Calls `work` repeatedly on `threads` threads.
    pub fn start_with(threads: usize, limit: Duration, work: fn()) -> Burner {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("burner-{i}"))
                    .spawn(move || {
                        let started = Instant::now();
                        let mut readings = vec![(SystemTime::now(), thread_cpu_time())];
                        while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
                            work();
                            let now = SystemTime::now();
                            let due = readings.last().is_none_or(|(at, _)| {
                                now.duration_since(*at).unwrap_or_default()
                                    >= Duration::from_millis(2)
                            });
                            if due {
                                readings.push((now, thread_cpu_time()));
                            }
                        }
                        readings.push((SystemTime::now(), thread_cpu_time()));
                        readings
                    })
                    .expect("spawn a burner")
            })
            .collect();
        Burner { stop, threads }
    }

    /// Stops the threads and returns their CPU timelines.
    pub fn finish(mut self) -> CpuTimeline {
        self.stop.store(true, Ordering::Relaxed);
        CpuTimeline(
            self.threads
                .drain(..)
                .map(|t| t.join().expect("a burner thread"))
                .collect(),
        )
    }
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime writes into the zeroed timespec we pass.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time);
        time
    };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
