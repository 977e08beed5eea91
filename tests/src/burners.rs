//! CPU burners: threads that run a workload and note their own CPU clock, so a test knows
//! how much CPU they used inside a profile's window, and how long a window must be for
//! them to use enough on a machine busy with other work; the process's CPU, or the
//! workloads' own counters, over a window, from readings taken beside it; and the
//! process's and a thread's CPU clocks.

use std::os::unix::thread::JoinHandleExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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

    /// The least share of the time between `start` and `end` that any one burner thread
    /// spent on a core (1.0: each ran throughout). Well under 1, the machine was busy with
    /// other work, and a thread's CPU timer fired only at the ticks that found it running
    /// (see [`crate::quiet_cores`]).
    pub fn least_core_share(&self, start: SystemTime, end: SystemTime) -> f64 {
        let wall = end.duration_since(start).unwrap_or_default().as_secs_f64();
        self.0
            .iter()
            .map(|readings| {
                let first = readings.iter().find(|(at, _)| *at >= start);
                let last = readings.iter().rev().find(|(at, _)| *at <= end);
                match (first, last) {
                    (Some(first), Some(last)) => {
                        last.1.saturating_sub(first.1).as_secs_f64() / wall.max(1e-9)
                    }
                    _ => 0.0,
                }
            })
            .fold(f64::INFINITY, f64::min)
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

    /// Cores the burner threads use together now: their CPU clocks over `over` of the
    /// wall clock (2.0: two threads, each on a core of its own throughout).
    pub async fn cores_used(&self, over: Duration) -> f64 {
        let clocks: Vec<libc::clockid_t> = self
            .threads
            .iter()
            .map(|thread| {
                let mut clock: libc::clockid_t = 0;
                // std's `RawPthread` is a `u64` everywhere; libc's `pthread_t` is a pointer on
                // musl.
                let raw = thread.as_pthread_t() as libc::pthread_t;
                // SAFETY: the thread is running (it is joined only by finish or drop),
                // and the call writes its CPU clock's id into `clock`.
                let result = unsafe { libc::pthread_getcpuclockid(raw, &mut clock) };
                assert_eq!(result, 0, "pthread_getcpuclockid");
                clock
            })
            .collect();
        let read = || -> Duration { clocks.iter().map(|&clock| clock_time(clock)).sum() };
        let (cpu, wall) = (read(), Instant::now());
        tokio::time::sleep(over).await;
        (read() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64()
    }

    /// A window, in whole seconds from `min` to `max`, long enough for the burners to
    /// use `cpu` of CPU at the rate they run at now (measured over 300 ms, with a quarter
    /// more for a machine whose other work comes and goes). `Err` says why none is, for
    /// [`crate::skip`]: the machine leaves them too little.
    pub async fn window_for(&self, cpu: Duration, min: u64, max: u64) -> Result<u64, String> {
        let cores = self.cores_used(Duration::from_millis(300)).await;
        let seconds = (cpu.as_secs_f64() * 1.25 / cores.max(1e-3)).ceil();
        if seconds > max as f64 {
            return Err(format!(
                "the burners run on {cores:.2} cores here (the machine is busy with other \
                 work): {cpu:?} of their CPU would take a {seconds:.0} s window, more than \
                 {max} s"
            ));
        }
        Ok((seconds as u64).max(min))
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
    clock_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_time(clock: libc::clockid_t) -> Duration {
    // SAFETY: clock_gettime writes into the zeroed timespec we pass.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(clock, &mut time);
        time
    };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// Readings of a value taken every 2 ms by a thread of its own, with the wall clock
/// beside each, so that a test can take the value's change over exactly a profile's
/// window rather than around its request (which would also count the seconds before the
/// window and the rendering after it). Stops when dropped.
pub struct Readings<T: Copy + Send + 'static> {
    stop: Arc<AtomicBool>,
    readings: Arc<Mutex<Vec<(SystemTime, T)>>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Copy + Send + 'static> Readings<T> {
    /// Starts reading `read` on a thread named `name`.
    pub fn start(name: &str, read: fn() -> T) -> Readings<T> {
        let stop = Arc::new(AtomicBool::new(false));
        let readings = Arc::new(Mutex::new(vec![(SystemTime::now(), read())]));
        let thread = {
            let (stop, readings) = (stop.clone(), readings.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(2));
                        let reading = (SystemTime::now(), read());
                        readings.lock().unwrap().push(reading);
                    }
                })
                .expect("spawn a reader")
        };
        Readings {
            stop,
            readings,
            thread: Some(thread),
        }
    }

    /// The first reading at or after `start` and the last at or before `end`; panics if
    /// the readings do not reach both.
    pub fn around(&self, start: SystemTime, end: SystemTime) -> (T, T) {
        let readings = self.readings.lock().unwrap();
        let first = readings
            .iter()
            .find(|(at, _)| *at >= start)
            .expect("a reading after the window's start");
        let last = readings
            .iter()
            .rev()
            .find(|(at, _)| *at <= end)
            .expect("a reading before the window's end");
        (first.1, last.1)
    }
}

impl<T: Copy + Send + 'static> Drop for Readings<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Readings<[u64; 3]> {
    /// How much each of three counters (such as [`hot::SPLIT_CPU_NANOS`]) grew between
    /// `start` and `end`: the CPU a workload's parts used inside a profile's window, for
    /// [`crate::assert_split`].
    pub fn growth_within(&self, start: SystemTime, end: SystemTime) -> [f64; 3] {
        let (first, last) = self.around(start, end);
        [0, 1, 2].map(|i| last[i].saturating_sub(first[i]) as f64)
    }
}

/// The process's CPU clock (`CLOCK_PROCESS_CPUTIME_ID`, every thread's) in [`Readings`],
/// so that a test can take the process's CPU over exactly a profile's window (the CPU
/// around the request would also count rendering and symbolizing after it).
pub struct ProcessCpu(Readings<Duration>);

impl ProcessCpu {
    pub fn start() -> ProcessCpu {
        ProcessCpu(Readings::start("process-cpu", || {
            clock_time(libc::CLOCK_PROCESS_CPUTIME_ID)
        }))
    }

    /// The process's CPU between `start` and `end` (to within a few ms); panics if the
    /// readings do not reach both.
    pub fn cpu_within(&self, start: SystemTime, end: SystemTime) -> Duration {
        let (first, last) = self.0.around(start, end);
        last.saturating_sub(first)
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
