//! Heap and allocation profiles from jemalloc's allocation sampling (feature
//! `heap-profiling`): what a request asks for and how it fails, availability checks that
//! answer instead of panicking, and the order of a profile's work: decide, read the
//! counts, wait out a window, dump, assemble. Its rooms: `heap/jemalloc.rs` (the
//! allocator users install, the `malloc_conf` that turns sampling on from process start,
//! jemalloc's state and dumps), `heap/hooks.rs` (the cumulative allocation counts: the
//! sample hook and its table, with the hook's safety contract), `heap/window.rs` (the
//! timed window where sampling is off), `heap/delta.rs` (windows of allocations where it
//! is on), `heap/accum.rs` (jemalloc's own counts with `prof_accum`), `heap/report.rs`
//! (the profile from its parts), `heap/request.rs` (what a request asks for and how it
//! fails) and `heap/dump.rs` (parsing the dump and spotting allocator frames: pure, so
//! built and tested on every target).

use crate::profile::Profile;

#[cfg(heap_dumps)]
mod accum;
#[cfg(heap_dumps)]
mod delta;
// Used only where dumps exist; compiled everywhere so that its tests run on every target
// and without features.
#[cfg_attr(not(heap_dumps), allow(dead_code))]
mod dump;
#[cfg(heap_dumps)]
mod hooks;
#[cfg(jemalloc)]
mod jemalloc;
#[cfg(heap_dumps)]
mod report;
mod request;
#[cfg(heap_dumps)]
mod window;

pub(crate) use request::{HeapError, HeapRequest, HeapRoute, SAMPLE_TYPES, UNAVAILABLE};

#[cfg(jemalloc)]
pub use jemalloc::Jemalloc;

#[cfg(heap_dumps)]
use std::time::{Instant, SystemTime};

#[cfg(heap_dumps)]
use self::delta::DeltaLease;
#[cfg(heap_dumps)]
use self::dump::{HeapStack, Parsed};
#[cfg(heap_dumps)]
use self::hooks::{Table, Totals};
#[cfg(heap_dumps)]
use self::jemalloc::{dump, prof_accum, switch_sampling_on};
#[cfg(heap_dumps)]
use self::report::{Alloc, FULL_MARKER, Span};
#[cfg(heap_dumps)]
use self::window::{Plan, WindowLease, plan};

/// Starts counting allocations for a router with heap profiling, as early as the
/// process allows: the first router built with `alloc_stacks > 0` installs jemalloc's
/// sample hook with a table of that many stacks, for the life of the process.
pub(crate) fn prepare(alloc_stacks: u32) {
    #[cfg(heap_dumps)]
    if alloc_stacks > 0 {
        let _ = hooks::install(alloc_stacks);
    }
    #[cfg(not(heap_dumps))]
    let _ = alloc_stacks;
}

/// The heap profile the pusher sends with a window (`crate::push`), built on the calling
/// thread: `inuse_*` now and, where the allocation counts exist, `alloc_*` since the
/// pusher's previous heap profile (a window of its own: Pyroscope computes no deltas).
/// `None` at the first call, which takes the counts it is measured from, where jemalloc
/// does not sample, and when it sampled nothing. It never switches sampling on.
#[cfg(heap_dumps)]
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(crate) fn for_push(alloc_stacks: u32) -> Option<Profile> {
    use std::sync::{Mutex, PoisonError};
    /// The counts at the previous pushed heap profile, and when.
    static PREVIOUS: Mutex<Option<(Totals, Instant, SystemTime)>> = Mutex::new(None);
    let source = Source::of(alloc_stacks);
    let Source::Table(table) = source else {
        // Without the counts there is no window to speak of: the heap in use, now.
        let parsed = dump().ok()?;
        let mut comments = Vec::new();
        let alloc = allocated(
            &source,
            &parsed,
            Reading::None,
            Reading::None,
            false,
            &mut comments,
        );
        return (!parsed.stacks.is_empty()).then(|| {
            report::build(
                &parsed,
                alloc,
                HeapRoute::Heap,
                Span::Now,
                crate::symbolize::Symbolize::Full,
                None,
                comments,
            )
        });
    };
    let mut previous = PREVIOUS.lock().unwrap_or_else(PoisonError::into_inner);
    // A failed dump leaves the reading as it was: the next window's counts begin there.
    let parsed = dump().ok()?;
    let now = (Instant::now(), SystemTime::now());
    let totals = table.totals();
    let (before, since, since_wall) = previous.replace((totals.clone(), now.0, now.1))?;
    if parsed.stacks.is_empty() && totals.since(&before).slots.is_empty() {
        return None;
    }
    let mut comments = vec![
        "pushed: alloc_objects and alloc_space are what was allocated since the previous          pushed heap profile, inuse_objects and inuse_space what was in use at its end"
            .to_owned(),
    ];
    let alloc = allocated(
        &Source::Table(table),
        &parsed,
        Reading::Table(before),
        Reading::Table(totals),
        true,
        &mut comments,
    );
    Some(report::build(
        &parsed,
        alloc,
        HeapRoute::Heap,
        Span::Between(since_wall, now.0.duration_since(since)),
        crate::symbolize::Symbolize::Full,
        None,
        comments,
    ))
}

/// See the `heap_dumps` variant: no heap profiles here.
#[cfg(not(heap_dumps))]
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(crate) fn for_push(_alloc_stacks: u32) -> Option<Profile> {
    None
}

/// Takes one heap profile and hands it to `render` on the blocking pool.
#[cfg(not(heap_dumps))]
pub(crate) async fn profile<R, F>(_request: HeapRequest, _render: F) -> Result<R, HeapError>
where
    F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
    R: Send + 'static,
{
    Err(HeapError::Unsupported(
        UNAVAILABLE.unwrap_or("heap profiling is not available"),
    ))
}

#[cfg(heap_dumps)]
async fn blocking<T, F>(f: F) -> Result<T, HeapError>
where
    F: FnOnce() -> Result<T, HeapError> + Send + 'static,
    T: Send + 'static,
{
    crate::offload::on_blocking_pool(f, HeapError::Failed).await
}

/// Takes one heap profile and hands it to `render` on the blocking pool: at once, or
/// after the window the request asks for (sampling on: a difference of allocation
/// counts) or needs (sampling off: sampling switched on for it).
#[cfg(heap_dumps)]
pub(crate) async fn profile<R, F>(request: HeapRequest, render: F) -> Result<R, HeapError>
where
    F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
    R: Send + 'static,
{
    // Deciding, taking a window and switching sampling on happen in one blocking call,
    // and a window's lease exists only once sampling is on: if the client hangs up at
    // any point, dropping the lease (here, or with the call's unread result) switches
    // sampling off after it was switched on, never before.
    let started = blocking(move || start(request)).await?;
    if !matches!(started.window, Window::None) {
        tokio::time::sleep(request.window).await;
    }
    blocking(move || render(finish(started)?)).await
}

/// Where allocation counts come from, for one request.
#[cfg(heap_dumps)]
enum Source {
    /// This crate's table.
    Table(&'static Table),
    /// jemalloc's `prof_accum` brackets; the string says why not the table.
    Accum(String),
    /// None: why.
    None(String),
}

#[cfg(heap_dumps)]
impl Source {
    fn of(alloc_stacks: u32) -> Source {
        let why = if alloc_stacks == 0 {
            "this router sets alloc_stacks = 0".to_owned()
        } else {
            match hooks::install(alloc_stacks) {
                Ok(table) => return Source::Table(table),
                Err(why) => format!("the allocation counts are unavailable ({why})"),
            }
        };
        if prof_accum() {
            Source::Accum(why)
        } else {
            Source::None(why)
        }
    }
}

/// A reading of the allocation counts, at a window's start.
#[cfg(heap_dumps)]
enum Reading {
    Table(Totals),
    Accum(Vec<HeapStack>),
    None,
}

#[cfg(heap_dumps)]
impl Reading {
    fn of(source: &Source) -> Result<Reading, HeapError> {
        Ok(match source {
            Source::Table(table) => Reading::Table(table.totals()),
            Source::Accum(_) => Reading::Accum(dump()?.stacks),
            Source::None(_) => Reading::None,
        })
    }
}

/// What a request waits for, holding its lease.
#[cfg(heap_dumps)]
enum Window {
    /// Nothing: the heap now.
    None,
    /// A difference of counts, sampling on.
    Delta(DeltaLease),
    /// Sampling switched on for the window.
    Sampled(WindowLease),
}

/// A profile under way, between its start and its dump.
#[cfg(heap_dumps)]
struct Started {
    request: HeapRequest,
    source: Source,
    window: Window,
    /// The counts at the window's start.
    before: Reading,
    started: (Instant, SystemTime),
    comments: Vec<String>,
}

#[cfg(heap_dumps)]
fn start(request: HeapRequest) -> Result<Started, HeapError> {
    let source = Source::of(request.alloc_stacks);
    if let (Some(asked), Source::None(why)) = (request.sample_index, &source)
        && asked.starts_with("alloc_")
    {
        return Err(HeapError::BadRequest(format!(
            "`sample_index={asked}` needs allocation counts, which this profile has none of \
             ({why}); ask for inuse_space or inuse_objects"
        )));
    }
    let seconds = request.window.as_secs();
    let mut comments = Vec::new();
    let window = match plan(request.window)? {
        Plan::Active if !request.seconds_given => Window::None,
        Plan::Active => match &source {
            Source::None(why) => {
                comments.push(format!(
                    "seconds={seconds} asks for what was allocated during those seconds, which \
                     needs allocation counts ({why}): this is the heap in use now"
                ));
                Window::None
            }
            _ => {
                comments.push(format!(
                    "a window of {seconds} s: alloc_objects and alloc_space are what was \
                     allocated during it, inuse_objects and inuse_space what was in use at its end"
                ));
                Window::Delta(delta::open(request.window)?)
            }
        },
        Plan::Window(lease) => {
            comments.push(format!(
                "jemalloc's sampling was off (prof_active:false) and sampled during this \
                 {seconds} s window only: inuse_objects and inuse_space are what the window \
                 allocated and still held at its end{}",
                if matches!(source, Source::None(_)) {
                    ""
                } else {
                    ", alloc_objects and alloc_space what it allocated"
                }
            ));
            // The counts before sampling is switched on, when nothing is being counted.
            let before = Reading::of(&source)?;
            switch_sampling_on()?;
            return Ok(Started {
                request,
                source,
                window: Window::Sampled(lease),
                before,
                started: (Instant::now(), SystemTime::now()),
                comments,
            });
        }
    };
    let before = match window {
        Window::Delta(_) => Reading::of(&source)?,
        _ => Reading::None,
    };
    Ok(Started {
        request,
        source,
        window,
        before,
        started: (Instant::now(), SystemTime::now()),
        comments,
    })
}

/// The dump at the end, the counts since the start, the window closed, the profile.
#[cfg(heap_dumps)]
fn finish(started: Started) -> Result<Profile, HeapError> {
    let Started {
        request,
        source,
        window,
        before,
        started,
        mut comments,
    } = started;
    let parsed = dump();
    let now = match &source {
        Source::Table(table) => Reading::Table(table.totals()),
        _ => Reading::None,
    };
    let span = match window {
        Window::None => Span::Now,
        Window::Delta(lease) => {
            drop(lease);
            Span::Window(started.0, started.1)
        }
        Window::Sampled(lease) => {
            lease.finish();
            Span::Window(started.0, started.1)
        }
    };
    let parsed = parsed?;
    let windowed = matches!(span, Span::Window(..));
    let alloc = allocated(&source, &parsed, before, now, windowed, &mut comments);
    Ok(report::build(
        &parsed,
        alloc,
        request.route,
        span,
        request.symbolize,
        request.sample_index,
        comments,
    ))
}

/// The `alloc_*` columns from the counts at the end (and at the start, for a window),
/// with the comments that say where they come from.
#[cfg(heap_dumps)]
fn allocated(
    source: &Source,
    parsed: &Parsed,
    before: Reading,
    now: Reading,
    windowed: bool,
    comments: &mut Vec<String>,
) -> Alloc {
    match source {
        Source::Table(table) => {
            let Reading::Table(now) = now else {
                return Alloc::None;
            };
            // Whole numbers of bytes (powers of two): compared exactly.
            let period = parsed.period as f64;
            if table.period() != period {
                comments.push(format!(
                    "jemalloc's sample period changed from {} to {period} bytes: allocations \
                     sampled before were weighed by the old one",
                    table.period()
                ));
                table.set_period(period);
            }
            comments.push(table_comment(table, &now));
            // Only a window takes a reading at its start.
            let counts = match before {
                Reading::Table(before) => now.since(&before),
                _ => now,
            };
            let overflow = counts.overflow;
            if overflow.samples > 0 {
                comments.push(format!(
                    "the allocation counts table is full (alloc_stacks = {}): {} sampled \
                     allocations, about {} bytes, of stacks it had no room for are counted \
                     under {FULL_MARKER}; raise alloc_stacks to see their stacks",
                    table.capacity(),
                    overflow.samples,
                    overflow.bytes
                ));
            }
            Alloc::Counted {
                stacks: counts
                    .slots
                    .iter()
                    .map(|(index, tally)| {
                        (table.stack(*index), tally.objects(), tally.bytes as f64)
                    })
                    .collect(),
                overflow: (overflow.samples, overflow.objects(), overflow.bytes as f64),
                cumulative: !windowed,
            }
        }
        Source::Accum(why) => {
            comments.push(format!(
                "alloc_objects and alloc_space are jemalloc's own counts (prof_accum:true, set in \
                 _RJEM_MALLOC_CONF), which keep every sampled stack of every thread for the life \
                 of the process; {why}"
            ));
            let stacks = match before {
                Reading::Accum(before) => delta::brackets_since(&parsed.stacks, &before),
                _ => {
                    let (stacks, note) = accum::cumulative(&parsed.stacks);
                    comments.extend(note);
                    stacks
                }
            };
            Alloc::Counted {
                stacks,
                overflow: (0, 0.0, 0.0),
                cumulative: false,
            }
        }
        Source::None(why) => {
            comments.push(format!(
                "no alloc_objects or alloc_space: {why}; allocation counts need heap = true with \
                 alloc_stacks above 0 (the default, 4096) and jemalloc 5.3.1's sample hook"
            ));
            Alloc::None
        }
    }
}

/// What the table is, since when, and how full.
#[cfg(heap_dumps)]
fn table_comment(table: &Table, now: &Totals) -> String {
    let (used, frames) = table.frames_used();
    let mut comment = format!(
        "alloc_objects and alloc_space: every allocation jemalloc sampled since {} (when the \
         routes were built), counted by krabka-pprof from jemalloc's sample hook, per stack, \
         unbiased by each allocation's size; alloc_stacks = {}: {} stacks held, {used} of \
         {frames} frames",
        humantime::format_rfc3339_seconds(table.since),
        table.capacity(),
        now.slots.len(),
    );
    if table.pid != std::process::id() {
        comment.push_str(&format!(
            "; this process was forked from process {}, and the counts include its parent's \
             until the fork",
            table.pid
        ));
    }
    comment
}
