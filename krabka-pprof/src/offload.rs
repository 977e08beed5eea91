//! Work that takes more than microseconds (starting and stopping the sampler, symbolizing,
//! encoding, drawing, gzipping, heap dumps) runs on tokio's blocking pool, so that the
//! async workers keep serving the app, also on a `current_thread` runtime; CPU profiles
//! are built on the profiler's own thread when it is idle (see [`on_profiler_thread`]).

#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

/// Runs `f` on tokio's blocking pool. A panic inside becomes `failed(reason)`, an error
/// the route turns into a 500, never a crash of the service.
pub(crate) async fn on_blocking_pool<T, E, F>(f: F, failed: fn(String) -> E) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|join| Err(failed(format!("the profiler's task failed: {join}"))))
}

/// A panic's message, if it carries one (`panic!` with a literal, or formatted).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> Option<&str> {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
}

/// Runs `f` on the profiler's own thread (`krabka-worker`, one for the process's life)
/// when that thread is idle, or on tokio's blocking pool when it is not: the work that
/// builds profiles (closing a window, symbolizing, encoding, gzipping) allocates and frees
/// megabytes, and on one long-lived thread it does so in one of glibc's allocator arenas.
/// Spread over the blocking pool's threads, which come and go, each arena they took kept
/// its own partly used pages (glibc trims a thread arena's top only past a threshold that
/// grows with the largest block freed, and `malloc_trim` never), and a service's resident
/// memory grew by megabytes over hours of scraping. Work never waits for the thread: two
/// profiles that finish at once are built side by side, as before. A panic inside becomes
/// `failed(reason)`, as on the blocking pool.
#[cfg(sampler)]
pub(crate) async fn on_profiler_thread<T, E, F>(f: F, failed: fn(String) -> E) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    on_thread_of(worker::WORKER.get(), f, failed).await
}

/// [`on_profiler_thread`] with `worker` as the profiler's thread.
#[cfg(sampler)]
async fn on_thread_of<T, E, F>(
    worker: &'static worker::Worker,
    f: F,
    failed: fn(String) -> E,
) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    let Some(claimed) = worker.claim() else {
        return on_blocking_pool(f, failed).await;
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    let job: worker::Job = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        // Free for the next profile before this one's answer is read.
        drop(claimed);
        // The request may have gone away meanwhile: then nobody reads it.
        let _ = answer.send(result);
    });
    if let Err(job) = worker.send(job) {
        // The thread could not be spawned: the blocking pool, then (and from now on).
        drop(tokio::task::spawn_blocking(job));
    }
    match answered.await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(failed(format!(
            "the profiler's task failed: {}",
            panic_message(&*panic).unwrap_or("a panic")
        ))),
        Err(_) => Err(failed(
            "the profiler's task failed: it was dropped".to_owned(),
        )),
    }
}

/// While held, the profiler's thread takes no new work, and every CPU profile is built on
/// the blocking pool as if the thread were busy. For the workspace's tests, which hold the
/// blocking pool to catch a window between its end and its close.
pub struct ProfilerThreadHold {
    #[cfg(sampler)]
    worker: &'static worker::Worker,
}

/// Holds the profiler's thread (any number of holds at once) until dropped.
pub fn hold_profiler_thread() -> ProfilerThreadHold {
    #[cfg(sampler)]
    return hold_of(worker::WORKER.get());
    #[cfg(not(sampler))]
    ProfilerThreadHold {}
}

#[cfg(sampler)]
fn hold_of(worker: &'static worker::Worker) -> ProfilerThreadHold {
    worker.hold();
    ProfilerThreadHold { worker }
}

impl ProfilerThreadHold {
    /// Whether the thread has finished what it was building when the hold began.
    pub fn idle(&self) -> bool {
        #[cfg(sampler)]
        return !self.worker.is_busy();
        #[cfg(not(sampler))]
        true
    }
}

impl Drop for ProfilerThreadHold {
    fn drop(&mut self) {
        #[cfg(sampler)]
        self.worker.release();
    }
}

#[cfg(sampler)]
mod worker {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Mutex, PoisonError, mpsc};

    use crate::process::PerProcess;

    pub(super) type Job = Box<dyn FnOnce() + Send>;

    /// The profiler's thread in this process (a child made by `fork` spawns its own):
    /// whether it is working, and how to reach it once spawned.
    pub(super) struct Worker {
        busy: AtomicBool,
        /// Tests' holds (see `ProfilerThreadHold`): while any is, no job is taken.
        held: AtomicUsize,
        /// It could not be spawned: every job goes to the blocking pool.
        unavailable: AtomicBool,
        jobs: Mutex<Option<mpsc::Sender<Job>>>,
    }

    pub(super) static WORKER: PerProcess<Worker> = PerProcess::new(Worker::new);

    /// The thread, claimed for one job until dropped.
    pub(super) struct Claimed(&'static Worker);

    impl Drop for Claimed {
        fn drop(&mut self) {
            self.0.busy.store(false, Ordering::SeqCst);
        }
    }

    impl Worker {
        pub(super) const fn new() -> Worker {
            Worker {
                busy: AtomicBool::new(false),
                held: AtomicUsize::new(0),
                unavailable: AtomicBool::new(false),
                jobs: Mutex::new(None),
            }
        }

        /// The thread, if it is idle; `None` if it is busy or cannot be spawned.
        pub(super) fn claim(&'static self) -> Option<Claimed> {
            if self.unavailable.load(Ordering::Acquire) {
                return None;
            }
            self.busy
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .ok()?;
            let claimed = Claimed(self);
            // Looked at after claiming: a hold either sees this claim (and waits for the
            // job) or is seen here.
            (self.held.load(Ordering::SeqCst) == 0).then_some(claimed)
        }

        pub(super) fn hold(&self) {
            self.held.fetch_add(1, Ordering::SeqCst);
        }

        pub(super) fn release(&self) {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }

        pub(super) fn is_busy(&self) -> bool {
            self.busy.load(Ordering::SeqCst)
        }

        /// Hands `job` to the thread, spawned the first time; the job comes back if the
        /// thread cannot be spawned.
        pub(super) fn send(&'static self, job: Job) -> Result<(), Job> {
            let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            if jobs.is_none() {
                let (send, receive) = mpsc::channel::<Job>();
                let spawned = std::thread::Builder::new()
                    .name("krabka-worker".into())
                    .spawn(move || {
                        #[cfg(procfs)]
                        let _own = crate::process::OwnThread::register();
                        // Each job catches its own panic: the thread outlives them all.
                        for job in receive {
                            job();
                        }
                    });
                if spawned.is_err() {
                    self.unavailable.store(true, Ordering::Release);
                    return Err(job);
                }
                *jobs = Some(send);
            }
            // The thread never ends while the sender lives.
            jobs.as_ref()
                .expect("set above")
                .send(job)
                .map_err(|back| back.0)
        }
    }
}

#[cfg(test)]
#[cfg(sampler)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A profiler's thread of the test's own: other tests' profiles use the process's.
    fn fresh() -> &'static worker::Worker {
        Box::leak(Box::new(worker::Worker::new()))
    }

    fn thread() -> Result<(Option<String>, std::thread::ThreadId), String> {
        let current = std::thread::current();
        Ok((current.name().map(str::to_owned), current.id()))
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn work_runs_on_the_profilers_one_thread_while_it_is_idle() {
        let worker = fresh();
        let (name, first) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_eq!(name.as_deref(), Some("krabka-worker"));
        for _ in 0..3 {
            let (_, id) = on_thread_of(worker, thread, |e| e).await.unwrap();
            assert_eq!(id, first, "the same thread every time");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_finds_the_thread_busy_runs_beside_it_on_the_blocking_pool() {
        let worker = fresh();
        let (started, running) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn(on_thread_of(
            worker,
            move || {
                started.send(()).unwrap();
                released.recv_timeout(MINUTE).map_err(|e| e.to_string())?;
                thread()
            },
            |e| e,
        ));
        tokio::task::spawn_blocking(move || running.recv_timeout(MINUTE))
            .await
            .unwrap()
            .expect("the first job runs");
        // The first job holds the thread until released: waiting for it would time out.
        let (name, _) = tokio::time::timeout(MINUTE, on_thread_of(worker, thread, |e| e))
            .await
            .expect("the second job did not wait for the first")
            .unwrap();
        assert_ne!(name.as_deref(), Some("krabka-worker"));
        release.send(()).unwrap();
        let (name, _) = first.await.unwrap().unwrap();
        assert_eq!(name.as_deref(), Some("krabka-worker"));
    }

    #[tokio::test]
    async fn while_a_test_holds_the_thread_work_runs_on_the_blocking_pool() {
        let worker = fresh();
        worker.hold();
        let (name, _) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_ne!(name.as_deref(), Some("krabka-worker"));
        worker.release();
        let (name, _) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_eq!(name.as_deref(), Some("krabka-worker"));
    }

    #[tokio::test]
    async fn a_hold_waits_for_the_job_running_then_keeps_work_off_the_thread_until_dropped() {
        let worker = fresh();
        let running = worker.claim().expect("an idle thread");
        let hold = hold_of(worker);
        assert!(!hold.idle(), "a job still runs");
        drop(running);
        assert!(hold.idle());
        let (name, _) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_ne!(name.as_deref(), Some("krabka-worker"));
        drop(hold);
        let (name, _) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_eq!(name.as_deref(), Some("krabka-worker"));
    }

    #[tokio::test]
    async fn a_panic_is_an_error_and_the_thread_serves_the_next_job() {
        let worker = fresh();
        let failed = on_thread_of(
            worker,
            || -> Result<(), String> { panic!("a bug while encoding") },
            |e| e,
        )
        .await
        .unwrap_err();
        assert_eq!(failed, "the profiler's task failed: a bug while encoding");
        let (name, _) = on_thread_of(worker, thread, |e| e).await.unwrap();
        assert_eq!(name.as_deref(), Some("krabka-worker"));
    }
}
