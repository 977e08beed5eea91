//! Thread dumps (`/threads`, `/goroutine`): every thread's stack now, as a profile, or as
//! Go's text forms (`threads/text.rs`); `threads/take.rs` takes one. What each thread is
//! (name, state, CPU time, what it waits on) comes from `/proc/self/task`
//! (`crate::process`); its stack comes from the thread itself, unwinding in the sampler's
//! handler when signalled (`sampler/asking.rs`, `sampler/dump.rs`). A thread that blocks
//! the signal, does not answer in time or exits meanwhile is listed as such, never left
//! out. Knows no HTTP.

#![cfg_attr(not(sampler), allow(dead_code))]

mod take;
mod text;

pub(crate) use take::{DumpError, DumpRequest, ThreadDump, UNAVAILABLE};
pub(crate) use text::{every_thread_text, grouped_text};

/// Takes a dump of every thread of the process, on the blocking pool, and hands it to
/// `render` there.
pub(crate) async fn dump<R, F>(request: DumpRequest, render: F) -> Result<R, DumpError>
where
    F: FnOnce(ThreadDump) -> Result<R, String> + Send + 'static,
    R: Send + 'static,
{
    if let Some(reason) = UNAVAILABLE {
        return Err(DumpError::Unavailable(reason));
    }
    crate::offload::on_blocking_pool(
        move || render(take::take(request)?).map_err(DumpError::Failed),
        DumpError::Failed,
    )
    .await
}
