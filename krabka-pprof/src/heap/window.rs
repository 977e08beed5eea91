//! The timed heap window, for processes where jemalloc's sampling is off
//! (`prof_active:false`): one request at a time switches sampling on, waits its
//! `seconds`, dumps, and switches it off again (which resets jemalloc's samples, unless
//! `prof_accum` keeps them); a second window meanwhile gets 409. A client that hangs up
//! switches sampling off as well. Where sampling is on, windows are `heap/delta.rs`'s.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::jemalloc::{state, switch_sampling_off};
use super::request::HeapError;

/// The end of the running timed window, if one runs.
static WINDOW: Mutex<Option<Instant>> = Mutex::new(None);

/// Holds the timed window for one request. [`finish`](Self::finish) switches sampling
/// back off and frees the window before the response leaves; dropping it unfinished
/// (the client hung up) does the same on the blocking pool.
pub(super) struct WindowLease {
    finished: bool,
}

/// What a request gets to do, decided under the window lock so that no request can
/// see sampling active because another request's window just switched it on.
pub(super) enum Plan {
    /// Sampling is active on its own: dump at once, or take a window's difference.
    Active,
    /// Sampling is off: this request runs a window.
    Window(WindowLease),
}

pub(super) fn plan(window: Duration) -> Result<Plan, HeapError> {
    let mut running = WINDOW.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(ends_at) = *running {
        return Err(HeapError::Busy {
            retry_after: ends_at.saturating_duration_since(Instant::now()),
        });
    }
    if state()? {
        return Ok(Plan::Active);
    }
    *running = Some(Instant::now() + window);
    Ok(Plan::Window(WindowLease { finished: false }))
}

/// Switches sampling off (which also resets jemalloc's samples) and frees the window.
fn end_window() {
    switch_sampling_off();
    *WINDOW.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

impl WindowLease {
    /// Ends the window; call on the blocking pool.
    pub(super) fn finish(mut self) {
        self.finished = true;
        end_window();
    }
}

impl Drop for WindowLease {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Resetting walks jemalloc's samples: not on an async worker.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(end_window)),
            Err(_) => end_window(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The window's state is the process's: these tests take turns.
    static TURN: Mutex<()> = Mutex::new(());

    /// A runtime whose one blocking thread is held until the returned sender is dropped,
    /// so that whatever is sent to the blocking pool meanwhile waits its turn.
    fn runtime_with_its_blocking_thread_held() -> (tokio::runtime::Runtime, mpsc::Sender<()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel();
        runtime.spawn_blocking(move || {
            started.send(()).unwrap();
            let _ = held.recv();
        });
        running.recv().unwrap();
        (runtime, release)
    }

    fn open_window() -> WindowLease {
        *WINDOW.lock().unwrap() = Some(Instant::now() + Duration::from_secs(60));
        WindowLease { finished: false }
    }

    fn window_is_free() -> bool {
        WINDOW.lock().unwrap().is_none()
    }

    /// `finish` frees the window before it returns, that is before the response leaves:
    /// a request sent as soon as the window's profile arrived is not told 409, even when
    /// the blocking pool is busy with other work.
    #[test]
    fn finishing_frees_the_window_before_it_returns() {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        let (runtime, release) = runtime_with_its_blocking_thread_held();
        let _entered = runtime.enter();
        let lease = open_window();
        assert!(!window_is_free());
        lease.finish();
        assert!(
            window_is_free(),
            "the window is still held after finish returned"
        );
        drop(release);
    }

    /// A lease dropped unfinished (the client hung up) frees the window too, on the
    /// blocking pool when a runtime runs (resetting jemalloc's samples walks them all: not
    /// on an async worker), at once where none does.
    #[test]
    fn a_lease_dropped_unfinished_frees_the_window_off_the_async_workers() {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        drop(open_window());
        assert!(
            window_is_free(),
            "dropped outside a runtime, the window is still held"
        );

        let (runtime, release) = runtime_with_its_blocking_thread_held();
        let entered = runtime.enter();
        drop(open_window());
        assert!(
            !window_is_free(),
            "the window was freed on the dropping thread, not on the blocking pool"
        );
        drop(entered);
        drop(release);
        // The blocking pool's one thread takes its work in turn: once a task sent after
        // the drop has run, so has the window's end.
        runtime.block_on(async { tokio::task::spawn_blocking(|| ()).await.unwrap() });
        assert!(
            window_is_free(),
            "the window is still held after the blocking pool ran"
        );
    }
}
