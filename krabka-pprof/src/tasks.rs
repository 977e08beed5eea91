//! tokio's task dump as text (`/tasks`): every task's trace grouped by identical trace and
//! the largest group first, as Go's `goroutine?debug=1` groups goroutines. tokio dumps only
//! with its own opt-in, so the dump exists where `cfg(task_dumps)` (build.rs: feature
//! `task-dump`, `--cfg tokio_unstable`, a target tokio dumps on); elsewhere the answer is
//! [`TaskError::Unavailable`] naming both switches. `tasks/runtime.rs` asks tokio's
//! runtime, `tasks/text.rs` lays the traces out (it knows nothing of tokio, so its tests
//! run in every build). Knows no HTTP: `routes` turns the errors into answers.

mod error;
#[cfg(task_dumps)]
mod runtime;
#[cfg(any(task_dumps, test))]
mod text;

pub(crate) use error::TaskError;

/// Without the dump: what a person must change, and where tokio can dump at all.
#[cfg(not(task_dumps))]
const WITHOUT: &str = "task dumps need the app built with RUSTFLAGS=\"--cfg tokio_unstable\" \
     and krabka-pprof's `task-dump` feature, on Linux on x86_64, aarch64, x86 or s390x (the \
     targets tokio's taskdump supports); rebuild with both to use /tasks";

/// tokio's task dump of the runtime this is awaited on, as text.
#[cfg(not(task_dumps))]
pub(crate) async fn dump() -> Result<String, TaskError> {
    Err(TaskError::Unavailable(WITHOUT.to_owned()))
}

#[cfg(task_dumps)]
pub(crate) use runtime::dump;
