//! A session's drain thread: one thread, for the session's life, that drains the sampler
//! every [`DRAIN_EVERY`], or as far apart as each drain asks (an idle service's, further).
//!
//! Drains ran on tokio's blocking pool, on whichever thread was free. What they keep (the
//! windows' tables of stacks, the thread names, the accounting) grows in small steps for
//! as long as the session runs, and glibc's `malloc` serves each thread from an arena of
//! its own: over a session of hours, those steps were spread over every arena that a
//! blocking-pool thread (retired after 10 s idle, spawned again later) happened to take,
//! each holding its own partly used pages. Bench LS measured +2.8 MB of resident memory
//! over 9 minutes that way, against +0.2 MB with `MALLOC_ARENA_MAX=1`. One thread keeps
//! them in one arena, whatever the blocking pool does; and its drains keep their pace
//! while the async runtime is busy.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sampler::DRAIN_EVERY;

/// What the thread does at each drain: drain, and say how long after it the next drain
/// comes, or `None` once the session is no longer there to drain.
pub(super) type Drain = Box<dyn FnMut() -> Option<Duration> + Send>;

/// The drain thread, from before its session exists until the session drops it: then it
/// stops, and is joined unless it is the thread dropping it.
pub(super) struct Drainer {
    /// Hands the thread its work once the session exists; dropped, it stops the thread
    /// (also one dropped before serving, whose request went away: it never drains).
    work: Mutex<Option<mpsc::SyncSender<Drain>>>,
    thread: Option<JoinHandle<()>>,
    /// The process that spawned the thread: in a child made by `fork` it does not exist,
    /// and is not joined.
    pid: u32,
}

impl Drainer {
    /// Spawns the thread, named `krabka-drain` (profiles and thread dumps show the
    /// profiler's own CPU under that name). It waits for [`serve`](Self::serve).
    pub(super) fn spawn() -> std::io::Result<Drainer> {
        Drainer::spawn_every(DRAIN_EVERY)
    }

    fn spawn_every(every: Duration) -> std::io::Result<Drainer> {
        let (work, given) = mpsc::sync_channel::<Drain>(1);
        let thread = std::thread::Builder::new()
            .name("krabka-drain".into())
            .spawn(move || {
                let _own = crate::process::OwnThread::register();
                let Ok(mut drain) = given.recv() else {
                    return;
                };
                // The wait the last drain asked for after it ended (a period at first): a
                // slow drain (or a late wake-up) delays the next, and drains never come
                // closer together than asked. Anything but a timeout is the drainer's drop.
                let mut wait = every;
                while let Err(RecvTimeoutError::Timeout) = given.recv_timeout(wait) {
                    match drain() {
                        Some(next) => wait = next,
                        None => return,
                    }
                }
            })?;
        Ok(Drainer {
            work: Mutex::new(Some(work)),
            thread: Some(thread),
            pid: std::process::id(),
        })
    }

    /// Starts draining: `drain` a period after serving, then as long after each drain as
    /// it returns, until it returns `None` or the drainer is dropped. Once: the thread
    /// takes one piece of work.
    pub(super) fn serve(&self, drain: Drain) {
        let work = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(work) = work.as_ref() {
            // The thread waits for it; if it is gone, nothing is left to drain for.
            let _ = work.send(drain);
        }
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        // The channel closes: the thread, asleep or waiting for its work, ends.
        drop(
            self.work
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
            && self.pid == std::process::id()
        {
            // It is asleep, or about to see the channel closed: a drain in progress
            // holds the session, which is not being dropped then.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    #[test]
    fn it_drains_on_its_own_thread_until_dropped() {
        let drainer = Drainer::spawn_every(Duration::from_millis(1)).expect("spawned");
        let drains = Arc::new(AtomicUsize::new(0));
        let (seen, names) = mpsc::channel();
        let counted = drains.clone();
        drainer.serve(Box::new(move || {
            let _ = seen.send(std::thread::current().name().map(str::to_owned));
            counted.fetch_add(1, Ordering::SeqCst);
            Some(Duration::from_millis(1))
        }));
        for _ in 0..3 {
            let name = names
                .recv_timeout(Duration::from_secs(60))
                .expect("a drain within a minute");
            assert_eq!(name.as_deref(), Some("krabka-drain"));
        }
        drop(drainer);
        // Joined: the thread has ended, and its work (holding the other count) with it.
        assert_eq!(Arc::strong_count(&drains), 1);
        assert!(drains.load(Ordering::SeqCst) >= 3);
    }

    #[test]
    fn drains_come_as_far_apart_as_asked_never_sooner() {
        let every = Duration::from_millis(5);
        let drainer = Drainer::spawn_every(every).expect("spawned");
        let (seen, at) = mpsc::channel();
        // Each drain asks for a longer wait than the one before: 5, 10, 15 ms...
        let mut asked = every;
        drainer.serve(Box::new(move || {
            seen.send((Instant::now(), asked)).ok()?;
            asked += every;
            Some(asked)
        }));
        let times: Vec<(Instant, Duration)> = (0..4)
            .map(|_| at.recv_timeout(Duration::from_secs(60)).expect("a drain"))
            .collect();
        drop(drainer);
        // A busy machine makes the gaps longer, never shorter than asked.
        for pair in times.windows(2) {
            let ((then, _), (now, _)) = (pair[0], pair[1]);
            let asked = pair[0].1 + every;
            assert!(
                now - then >= asked,
                "{:?} between drains, {asked:?} asked",
                now - then
            );
        }
    }

    #[test]
    fn a_drain_that_finds_its_session_gone_ends_the_thread() {
        let mut drainer = Drainer::spawn_every(Duration::from_millis(1)).expect("spawned");
        let (once, ran) = mpsc::channel();
        drainer.serve(Box::new(move || {
            let _ = once.send(());
            None
        }));
        ran.recv_timeout(Duration::from_secs(60))
            .expect("one drain within a minute");
        let thread = drainer.thread.take().expect("spawned");
        // Ends by itself, with the drainer still alive.
        thread.join().expect("the thread ends without a panic");
        assert!(ran.try_recv().is_err(), "it drained once, then ended");
    }

    #[test]
    fn a_drainer_dropped_before_it_serves_ends_its_thread() {
        let drainer = Drainer::spawn_every(Duration::from_millis(1)).expect("spawned");
        // Would hang if the thread waited for work that never comes.
        drop(drainer);
    }

    #[test]
    fn a_drainer_dropped_on_its_own_thread_does_not_join_itself() {
        let drainer = Arc::new(Mutex::new(Some(
            Drainer::spawn_every(Duration::from_millis(1)).expect("spawned"),
        )));
        let (done, dropped) = mpsc::channel();
        let held = drainer.clone();
        let mut done = Some(done);
        drainer
            .lock()
            .unwrap()
            .as_mut()
            .expect("set")
            .serve(Box::new(move || {
                // The last owner drops it here, as the last window's drop may.
                drop(held.lock().unwrap().take());
                if let Some(done) = done.take() {
                    let _ = done.send(());
                }
                Some(Duration::from_millis(1))
            }));
        dropped
            .recv_timeout(Duration::from_secs(60))
            .expect("the drainer dropped on its own thread without a deadlock");
        assert!(drainer.lock().unwrap().is_none());
    }
}
