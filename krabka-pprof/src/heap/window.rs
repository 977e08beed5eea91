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
