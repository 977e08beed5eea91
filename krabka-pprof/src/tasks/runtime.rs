//! One dump at a time, bounded in time, symbolized off the async workers.
//!
//! - **One at a time, refused at once.** A second request gets 409 with `Retry-After`,
//!   as a busy CPU profile does, instead of queueing: a dump pauses every worker and
//!   re-polls every task, tokio itself serializes dumps by spinning
//!   (`start_trace_request` yields in a loop), and a dump stuck on a blocked worker
//!   would hold a queue of requests that each appear in the next dump.
//! - **The turn outlives a timeout.** On a multi-threaded runtime tokio dumps on a
//!   thread of its own that keeps going when the request stops waiting; the turn goes
//!   with the dump's task and ends when tokio answers, so a request after a timeout
//!   gets 409, never a second dump beside a stuck one.
//! - **Never while a worker is stuck.** tokio's workers meet at a barrier before a
//!   dump, each waiting 250 ms for the others; a worker that is still inside one poll
//!   when that runs out leaves the barrier miscounted (tokio-rs/tokio#8370, open),
//!   and a later round can elect a lone leader that traces beside a running worker
//!   (the `is_notified` assertion of #6343) or park a worker for good. So the route
//!   first watches each worker's published metrics for 250 ms: a worker that is
//!   running yet publishes nothing in that time (it publishes at every scheduling
//!   point, where it would also notice the dump) gets a 503 naming it, and tokio is
//!   never asked. A worker that blocks after that look still meets the 2 s timeout
//!   (and a request meanwhile gets 409), but what tokio does after is its own: held
//!   at the dumper's first poll and let go, the dump that followed left a worker
//!   waiting at tokio's `trace_end` barrier for good, so that the runtime never shut
//!   down, in 4 of 18 tries (the others dumped and shut down cleanly): the barrier
//!   #8370 is about, though that its cause is the same is not proven. So the test
//!   that holds a worker there (`tasks` suite) runs in a process of its own, which
//!   ends after the 503 and the 409s: a dump stuck so would keep its process's one
//!   turn, and every later test would get 409.
//! - **Only multi-threaded runtimes.** On `current_thread`, tokio re-polls the tasks
//!   while it borrows the scheduler's core, and a traced task that wakes any task
//!   during that poll panics inside itself, killing it (tokio-rs/tokio#8391, open;
//!   it took down restatedev/restate#5235). A profiling route must not kill the
//!   app's tasks, so there the answer is a 503 that says so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::runtime::dump::{BacktraceSymbol, Dump, Trace};
use tokio::runtime::{Handle, RuntimeFlavor, RuntimeMetrics};
use tokio::task;

use super::error::TaskError;
use super::text;

/// How long a request waits for tokio's dump: tokio's documentation pairs `dump` with
/// a 2 s timeout, since the dump never ends while a worker is blocked.
const TIMEOUT: Duration = Duration::from_secs(2);

/// How long each worker waits at tokio's barrier for the others before a dump, and
/// so how long the route watches for a worker that would not come.
const BARRIER_WAIT: Duration = Duration::from_millis(250);

/// Whether a dump is in progress in this process.
static DUMPING: AtomicBool = AtomicBool::new(false);

/// The one dump's turn; dropping it ends the turn.
struct Turn(());

impl Turn {
    fn take() -> Option<Turn> {
        DUMPING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Turn(()))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        DUMPING.store(false, Ordering::Release);
    }
}

/// tokio's task dump of the runtime this runs on, as text.
pub(crate) async fn dump() -> Result<String, TaskError> {
    let handle = Handle::current();
    if handle.runtime_flavor() == RuntimeFlavor::CurrentThread {
        return Err(TaskError::Unavailable(
            "task dumps are served only on a multi-threaded tokio runtime: on a \
             current_thread runtime tokio's dump can panic inside a task that wakes \
             another and kill it (tokio-rs/tokio#8391), so serve the app on a \
             multi_thread runtime to use /tasks"
                .to_owned(),
        ));
    }
    let Some(turn) = Turn::take() else {
        return Err(TaskError::Busy {
            retry_after: TIMEOUT,
        });
    };
    if let Some(worker) = stuck_worker(&handle.metrics()).await {
        return Err(TaskError::Unavailable(format!(
            "tokio worker {worker} has been inside one task's poll for at least 250 ms \
             (a blocking call, a long computation, a deadlock); tokio's dump would wait \
             for it and can then stall the runtime (tokio-rs/tokio#8370), so no dump \
             was taken: take a CPU profile to see what it runs, and retry /tasks once \
             it is free"
        )));
    }
    // The dump runs in a task that owns the turn: if this request stops waiting, the
    // task still ends the turn when tokio answers.
    let dumper = tokio::spawn(async move { (handle.dump().await, turn) });
    let dumper_id = dumper.id();
    let (dump, turn) = match tokio::time::timeout(TIMEOUT, dumper).await {
        Ok(Ok(done)) => done,
        Ok(Err(error)) => {
            return Err(TaskError::Failed(format!(
                "tokio's task dump failed ({error}), a tokio bug; the app keeps running, \
                 retry the request once, and report it to tokio if it fails again"
            )));
        }
        Err(_elapsed) => {
            return Err(TaskError::Unavailable(
                "tokio's task dump did not finish within 2 s, which happens while a \
                 runtime worker thread is blocked (a long synchronous call, a lock held \
                 too long, a deadlock) or the runtime shuts down; take a CPU profile to \
                 find the blocked thread, and retry /tasks once it is free"
                    .to_owned(),
            ));
        }
    };
    // Symbolizing reads debug info, easily 100 ms: on the blocking pool, still in turn.
    let rendered = task::spawn_blocking(move || {
        let _turn = turn;
        render(&dump, dumper_id)
    });
    rendered.await.map_err(|error| {
        TaskError::Failed(format!(
            "laying out the task dump failed ({error}); retry the request"
        ))
    })
}

/// A worker that is running (not parked) but reaches no scheduling point for
/// [`BARRIER_WAIT`]. A worker publishes its metrics each time it parks and at each
/// scheduling point (every 61 polls, where it also checks for a requested dump);
/// unchanged park count and busy time over the wait, with the worker not parked,
/// mean it is inside one poll all that time.
async fn stuck_worker(metrics: &RuntimeMetrics) -> Option<usize> {
    let look = || {
        (0..metrics.num_workers())
            .map(|worker| {
                (
                    metrics.worker_park_unpark_count(worker),
                    metrics.worker_total_busy_duration(worker),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = look();
    tokio::time::sleep(BARRIER_WAIT).await;
    let after = look();
    // An odd park count means parked: a dump's wake-up reaches it at once.
    (0..after.len()).find(|&worker| before[worker] == after[worker] && after[worker].0 % 2 == 0)
}

/// The dump's text, without the task that took it (tokio's own dumping thread is
/// left out of dumps for the same reason).
fn render(dump: &Dump, dumper: task::Id) -> String {
    text::grouped(
        dump.tasks()
            .iter()
            .filter(|task| task.id() != dumper)
            .map(|task| frames(task.trace())),
    )
}

/// One task's backtraces (one per tokio leaf it awaits), each outermost frame first,
/// a frame inlined into another after it.
fn frames(trace: &Trace) -> Vec<Vec<String>> {
    trace
        .resolve_backtraces()
        .iter()
        .map(|backtrace| {
            let mut path: Vec<String> = backtrace
                .frames()
                .flat_map(|frame| {
                    let symbols: Vec<String> = frame.symbols().map(label).collect();
                    if symbols.is_empty() {
                        vec![format!("{:p}", frame.ip())]
                    } else {
                        symbols
                    }
                })
                .collect();
            path.reverse();
            path
        })
        .collect()
}

/// `function at file:line:column`, the function demangled without its hash, as
/// tokio's own `Display` for a trace writes a frame.
fn label(symbol: &BacktraceSymbol) -> String {
    let name = match symbol.name_raw().map(String::from_utf8_lossy) {
        Some(raw) => format!("{:#}", rustc_demangle::demangle(&raw)),
        None => symbol
            .name_demangled()
            .map_or_else(|| "<unknown>".to_owned(), str::to_owned),
    };
    let Some(file) = symbol.filename() else {
        return name;
    };
    match (symbol.lineno(), symbol.colno()) {
        (Some(line), Some(column)) => format!("{name} at {}:{line}:{column}", file.display()),
        (Some(line), None) => format!("{name} at {}:{line}", file.display()),
        _ => format!("{name} at {}", file.display()),
    }
}
