//! Thread dumps (`/threads`, `/goroutine`): every thread's stack now, as a profile, or as
//! Go's text forms (`threads/text.rs`); `threads/take.rs` takes one. What each thread is
//! (name, state, CPU time, what it waits on) comes from `/proc/self/task`
//! (`crate::process`); its stack is read without a signal while it sleeps in the kernel,
//! and otherwise comes from the thread itself, unwinding in the sampler's handler when
//! signalled (`sampler/asking.rs`, `sampler/asleep.rs`, `sampler/dump.rs`). A thread
//! that blocks the signal, does not answer in time or exits meanwhile is listed as such,
//! never left out. One dump at a time: another request meanwhile is refused at once.
//! Knows no HTTP.

#![cfg_attr(not(sampler), allow(dead_code))]

mod take;
mod text;

pub(crate) use take::{DumpError, DumpRequest, ThreadDump, UNAVAILABLE};
pub(crate) use text::{every_thread_text, grouped_text};

/// Takes a dump of every thread of the process, on the blocking pool, and hands it to
/// `render` there. One at a time: while another runs, [`DumpError::Busy`] at once. If
/// this future is dropped (its client hung up), the dump stops waiting for the threads at
/// once, and nothing is rendered.
#[cfg(sampler)]
pub(crate) async fn dump<R, F>(request: DumpRequest, render: F) -> Result<R, DumpError>
where
    F: FnOnce(ThreadDump) -> Result<R, String> + Send + 'static,
    R: Send + 'static,
{
    use crate::sampler::DumpTurn;

    /// Cancels the dump when the request's future is dropped before it ends.
    struct CancelOnDrop(Option<crate::sampler::Canceller>);
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            if let Some(canceller) = self.0.take() {
                canceller.cancel();
            }
        }
    }

    let turn =
        DumpTurn::take(request.deadline).map_err(|retry_after| DumpError::Busy { retry_after })?;
    let mut hang_up = CancelOnDrop(Some(turn.canceller()));
    let rendered = crate::offload::on_blocking_pool(
        move || {
            // The turn is given back once the dump is freed and rendered, or cancelled.
            let dump = take::take(request, &turn)?;
            if turn.is_cancelled() {
                return Err(DumpError::Failed("the request went away".to_owned()));
            }
            render(dump).map_err(DumpError::Failed)
        },
        DumpError::Failed,
    )
    .await;
    hang_up.0 = None;
    rendered
}

/// Where thread dumps cannot be taken: why.
#[cfg(not(sampler))]
pub(crate) async fn dump<R, F>(_request: DumpRequest, _render: F) -> Result<R, DumpError>
where
    F: FnOnce(ThreadDump) -> Result<R, String> + Send + 'static,
    R: Send + 'static,
{
    Err(DumpError::Unavailable(UNAVAILABLE.unwrap_or_default()))
}
