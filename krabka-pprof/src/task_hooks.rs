//! tokio's task hooks for the blocking view (`/blocking`): with them, a thread asleep
//! inside an async task's poll is known to be, whatever its stack shows.
//!
//! Without them the blocking view tells a poll by the stack (a tokio worker's
//! `run_task` on it) and, where the stack cannot be read that far (aarch64, static musl,
//! a C library without unwind tables), by the labels of a labelled future or span. The
//! hooks cover every task, labelled or not, on every platform the wall profile runs on.
//! They need tokio's own opt-in to its unstable APIs, `RUSTFLAGS="--cfg tokio_unstable"`:
//!
//! ```
//! # #[cfg(tokio_unstable)]
//! # fn main() -> std::io::Result<()> {
//! let mut builder = tokio::runtime::Builder::new_multi_thread();
//! krabka_pprof::task_hooks::install(&mut builder);
//! let runtime = builder.enable_all().build()?;
//! # drop(runtime);
//! # Ok(())
//! # }
//! # #[cfg(not(tokio_unstable))]
//! # fn main() {}
//! ```
//!
//! `install` (which exists in builds with that flag) sets the builder's
//! `on_before_task_poll` and `on_after_task_poll`, replacing hooks set before it. An app
//! with hooks of its own calls [`before_poll`] and [`after_poll`] from them instead:
//!
//! ```
//! # #[cfg(tokio_unstable)]
//! # fn main() {
//! let mut builder = tokio::runtime::Builder::new_multi_thread();
//! builder
//!     .on_before_task_poll(|_meta| {
//!         krabka_pprof::task_hooks::before_poll();
//!         // ... the app's own hook
//!     })
//!     .on_after_task_poll(|_meta| krabka_pprof::task_hooks::after_poll());
//! # }
//! # #[cfg(not(tokio_unstable))]
//! # fn main() {}
//! ```
//!
//! Each hook is one store to a thread-local (a few nanoseconds a poll, the benchmark's
//! figure W), and on a thread's first poll one registration under a lock. Where the wall
//! profile is not available (it needs this crate's own sampler: Linux on x86_64 or
//! aarch64) the hooks do nothing. Each `/blocking` profile's comments say how many of its
//! places the hooks told. See [wall-clock profiles](crate::guide::wall).

/// Call first thing in `on_before_task_poll`: this thread is inside a task's poll from
/// now until [`after_poll`].
#[inline]
pub fn before_poll() {
    crate::labels::current::set_polling(true);
}

/// Call in `on_after_task_poll`: the poll [`before_poll`] began has ended.
#[inline]
pub fn after_poll() {
    crate::labels::current::set_polling(false);
}

/// Sets `builder`'s `on_before_task_poll` and `on_after_task_poll` to [`before_poll`] and
/// [`after_poll`] (replacing hooks set before). Needs `RUSTFLAGS="--cfg tokio_unstable"`,
/// as tokio's hooks do.
#[cfg(tokio_unstable)]
pub fn install(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder
        .on_before_task_poll(|_| before_poll())
        .on_after_task_poll(|_| after_poll())
}
