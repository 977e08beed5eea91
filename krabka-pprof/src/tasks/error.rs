//! Why no task dump was given: what `routes` turns into an answer.

use std::time::Duration;

/// Why no task dump was given.
#[derive(Debug)]
#[cfg_attr(
    not(task_dumps),
    allow(dead_code, reason = "without the dump only `Unavailable` occurs")
)]
pub(crate) enum TaskError {
    /// No dump can be taken here or now; the sentence says why and what to do.
    Unavailable(String),
    /// Another dump runs; it ends within `retry_after`.
    Busy { retry_after: Duration },
    /// tokio or the layout failed; the sentence says what to do.
    Failed(String),
}
