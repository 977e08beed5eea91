//! The request side of the `pprof` crate's sampler, where this crate's own does not run
//! (macOS, the BSDs, Linux on other architectures), and on Linux when the tests choose it
//! (the hidden `__pprof-rs-sampler` feature), so that this file is proven without a Mac.
//!
//! Every HTTP rule is the same as with the Linux sampler, because the request's shape is:
//! the busy token first ([`CpuLease`]: 409, `force=true`), start and stop on the blocking
//! pool, a client that hangs up stops the sampler there and then frees the token. What
//! differs is what the `pprof` crate measures: `setitimer(ITIMER_PROF)`, one timer for
//! the process's CPU time whose signal the kernel hands to a running thread, and stacks
//! it has already symbolized (names, files, lines and inlined functions, from the
//! binary's debug info where it has some) but without their code addresses, so its
//! profiles have no mappings. The profile names the sampler in its comments.

use pprof::{ProfilerGuard, ProfilerGuardBuilder, Report};

use super::lease::{CpuLease, blocking, drop_off_the_async_worker};
use super::request::{CpuError, CpuRequest};
use crate::objects::Objects;
use crate::profile::Profile;
use crate::profile::{Frame, LabelValue, Meta, ProfileBuilder};
use crate::symbolize::FunctionLine;

#[cfg(sampler)]
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this process takes CPU profiles with the `pprof` crate's sampler instead of
/// this crate's own. Set by the tests only, before the first profile.
#[cfg(sampler)]
static CHOSEN: AtomicBool = AtomicBool::new(false);

/// From now on, CPU profiles in this process use the `pprof` crate's sampler.
#[cfg(sampler)]
pub(crate) fn choose() {
    CHOSEN.store(true, Ordering::Relaxed);
}

/// Whether [`choose`] was called.
#[cfg(sampler)]
pub(crate) fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

/// Takes one CPU profile and hands it to `render` on the blocking pool.
pub(crate) async fn profile<R, F>(request: CpuRequest, render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    let lease = CpuLease::acquire(request.duration, request.force).await?;
    // Refused once the profiler is known free, as every refusal of a valid request.
    if request.symbolize == crate::symbolize::Symbolize::None {
        return Err(CpuError::Unavailable(
            "`symbolize=none` needs code addresses, and the pprof crate's sampler (the one \
             this platform uses) keeps names instead: leave `symbolize` out",
        ));
    }
    let stop_early = lease.stop_early.clone();
    let CpuRequest {
        frequency,
        blocklist,
        ..
    } = request;
    // The lease goes with the start and comes back with the guard: a client that hangs
    // up meanwhile leaves both to the blocking task, which drops the guard (stopping the
    // crate's profiler) before the lease, so the next request never finds that profiler
    // still running.
    let (guard, lease) = blocking(move || Ok((start(frequency, blocklist)?, lease))).await?;
    lease.sampling(request.duration);
    tracing::Span::current().record("stack_reader", "the pprof crate's sampler");
    let mut running = Hold {
        sampler: Some(guard),
        lease: Some(lease),
    };
    tokio::select! {
        () = tokio::time::sleep(request.duration) => {}
        () = stop_early.notified() => {}
    }
    let (guard, lease) = (running.sampler.take(), running.lease.take());
    blocking(move || {
        let Some(guard) = guard else {
            return Err(CpuError::Failed("the sampler was gone".into()));
        };
        // The report is read while the timer still runs: the crate clears it on stop.
        let report = guard.report().build();
        drop(guard);
        drop(lease);
        let report = report
            .map_err(|err| CpuError::Failed(format!("the pprof crate's report failed: {err}")))?;
        render(report_profile(&report, frequency))
    })
    .await
}

/// Starts the `pprof` crate's sampler.
fn start(frequency: u32, blocklist: &[&str]) -> Result<ProfilerGuard<'static>, CpuError> {
    let frequency = i32::try_from(frequency)
        .map_err(|_| CpuError::Failed(format!("{frequency} Hz is out of range")))?;
    let builder = ProfilerGuardBuilder::default().frequency(frequency);
    // The crate reads library ranges for its blocklist on these architectures only.
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    ))]
    let builder = builder.blocklist(blocklist);
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    )))]
    let _ = blocklist;
    builder.build().map_err(|err| match err {
        // Someone else in the process (the app itself?) runs the crate's profiler.
        pprof::Error::Running => CpuError::Unavailable(
            "the pprof crate's CPU profiler is already running in this process (started \
                 by the application?); stop it to take CPU profiles here",
        ),
        err => CpuError::Failed(format!("the pprof crate's profiler did not start: {err}")),
    })
}

/// The pprof profile of a finished report: `samples/count` and `cpu/nanoseconds`, one
/// sample per distinct (thread, stack), and a `thread` label.
fn report_profile(report: &Report, frequency: u32) -> Profile {
    let period = 1_000_000_000 / i64::from(frequency);
    // Symbolized frames need no object table, and get no mappings: the crate's report
    // keeps names, files and lines, not the code addresses a mapping would place.
    let objects = Objects::default();
    let mut builder = ProfileBuilder::new(&objects);
    let mut samples = 0i64;
    for (frames, &count) in &report.data {
        let count = count as i64;
        if count <= 0 {
            continue;
        }
        samples += count;
        let handler = handler_frames(&frames.frames);
        let mut stack: Vec<Frame> = frames.frames[handler..]
            .iter()
            .map(|symbols| {
                Frame::Symbolized(
                    symbols
                        .iter()
                        .map(|symbol| FunctionLine {
                            name: symbol.name(),
                            system_name: symbol.sys_name().into_owned(),
                            filename: symbol
                                .filename
                                .as_ref()
                                .map(|file| file.to_string_lossy().into_owned())
                                .unwrap_or_default(),
                            line: i64::from(symbol.lineno.unwrap_or(0)),
                            start_line: 0,
                        })
                        .collect(),
                )
            })
            .collect();
        if stack.is_empty() {
            stack.push(Frame::Marker("[no frames: not unwound]".into()));
        }
        builder.add(
            stack,
            vec![count, count * period],
            vec![("thread".into(), LabelValue::Str(frames.thread_name_or_id()))],
        );
    }
    let timing = &report.timing;
    let comments = vec![
        format!(
            "krabka-pprof: {frequency} Hz through the pprof crate's sampler \
             (setitimer ITIMER_PROF on the process's CPU time)"
        ),
        format!("{samples} samples"),
        "labels are not recorded by the pprof crate's sampler: samples carry the thread's \
         name only"
            .to_owned(),
    ];
    builder.finish(
        &Meta {
            sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
            period_type: ("cpu", "nanoseconds"),
            period,
            time: timing.start_time,
            duration: timing.duration,
            default_sample_type: None,
            comments,
        },
        &|_| false,
    )
}

/// How deep into a stack (from its leaf) the `pprof` crate's handler frames may lie.
const HANDLER_DEPTH: usize = 16;

/// How many of a stack's leaf frames are the `pprof` crate's signal handler at work. The
/// crate unwinds from inside its handler (with the `backtrace` crate, from the handler's
/// own frame, not the interrupted context) and removes only the handler's frame and the
/// signal trampoline: the `backtrace` crate's tracing frames and the crate's `Trace` impl
/// stay at the leaf of every sample, where `go tool pprof -top` would put all the flat
/// time. The frames up to the last of those within [`HANDLER_DEPTH`] go.
fn handler_frames(frames: &[Vec<pprof::Symbol>]) -> usize {
    frames
        .iter()
        .take(HANDLER_DEPTH)
        .rposition(|symbols| {
            symbols.iter().any(|symbol| {
                let file = symbol
                    .filename
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""));
                is_handler_code(&symbol.name(), &file.to_string_lossy())
            })
        })
        .map_or(0, |last| last + 1)
}

/// Whether a function (by its demangled name or its source file) is the `pprof` crate's
/// or the `backtrace` crate's: code that runs in the crate's handler. Not a name that
/// merely ends in `pprof` (`krabka_pprof::…`).
fn is_handler_code(name: &str, file: &str) -> bool {
    name.starts_with("pprof::")
        || name.contains("<pprof::")
        || name.contains("perf_signal_handler")
        || name.starts_with("backtrace::")
        || name.contains("<backtrace::")
        || file.contains("/pprof-0.")
        || file.contains("/backtrace-0.")
}

/// What a request holds while the `pprof` crate's sampler (`S`) runs. If the request is dropped (the client hung up), the sampler is stopped and freed
/// on the blocking pool (stopping deletes timers or restores the signal disposition,
/// waits for handlers, frees buffers: no work for an async worker), and only then is the
/// lease freed, so the next request never finds the sampler still stopping. A request
/// that finishes takes both out first.
struct Hold<S: Send + 'static> {
    sampler: Option<S>,
    lease: Option<CpuLease>,
}

impl<S: Send + 'static> Drop for Hold<S> {
    fn drop(&mut self) {
        let (sampler, lease) = (self.sampler.take(), self.lease.take());
        if sampler.is_none() && lease.is_none() {
            return;
        }
        // A tuple drops its fields in order: the sampler stops before the lease frees.
        drop_off_the_async_worker((sampler, lease));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbol(name: &str, file: &str) -> pprof::Symbol {
        pprof::Symbol {
            name: Some(name.as_bytes().to_vec()),
            addr: None,
            lineno: Some(1),
            filename: Some(file.into()),
        }
    }

    fn frame(name: &str) -> Vec<pprof::Symbol> {
        vec![symbol(name, "/app/src/main.rs")]
    }

    #[test]
    fn handler_code_is_known_by_each_of_its_marks_alone() {
        let app = "/app/src/main.rs";
        for (name, file) in [
            ("pprof::profiler::Profiler::sample", app),
            (
                "<pprof::backtrace::backtrace_rs::Trace as Trace>::trace",
                app,
            ),
            ("perf_signal_handler", app),
            ("backtrace::backtrace::trace_unsynchronized", app),
            ("<backtrace::Frame as Clone>::clone", app),
            ("trace", "/registry/pprof-0.15.0/src/profiler.rs"),
            (
                "trace",
                "/registry/backtrace-0.3.77/src/backtrace/libunwind.rs",
            ),
        ] {
            assert!(is_handler_code(name, file), "{name} in {file}");
        }
        for (name, file) in [
            (
                "krabka_pprof::cpu::pprof_rs::render",
                "/work/krabka-pprof/src/cpu/pprof_rs.rs",
            ),
            ("app::pprof_view", app),
            ("trace", app),
        ] {
            assert!(!is_handler_code(name, file), "{name} in {file}");
        }
    }

    #[test]
    fn the_handlers_frames_are_cut_from_the_leaf_and_nothing_else() {
        // As the crate hands a sample over (debug build): `backtrace`'s tracing inlined
        // into its generic entry point, the crate's `Trace` impl, then the thread.
        let registry = "/root/.cargo/registry/src/index.crates.io-1/backtrace-0.3.77/src";
        let sampled = vec![
            vec![
                symbol("trace", &format!("{registry}/backtrace/libunwind.rs")),
                symbol(
                    "backtrace::backtrace::trace_unsynchronized<pprof::profiler::perf_signal_handler::{closure_env#0}>",
                    &format!("{registry}/backtrace/mod.rs"),
                ),
            ],
            frame("<pprof::backtrace::backtrace_rs::Trace as pprof::backtrace::Trace>::trace"),
            frame("core::iter::range::next"),
            frame("krabka_hot_spin"),
        ];
        assert_eq!(
            handler_frames(&sampled),
            2,
            "the thread's own frames start at `next`"
        );
        // A bare `trace` by its file alone; a vendored `backtrace`'s (another path) only
        // by its callers' names, as in `sampled`.
        let bare = |file: &str| vec![symbol("trace", file)];
        assert_eq!(
            handler_frames(&[bare(&format!("{registry}/backtrace/libunwind.rs"))]),
            1
        );
        assert_eq!(handler_frames(&[bare("/vendor/backtrace/src/x.rs")]), 0);
        // This crate's own code is not the pprof crate's.
        let ours = vec![
            frame("krabka_pprof::sampler::drain"),
            frame("krabka_pprof::cpu::pprof_rs::render"),
        ];
        assert_eq!(handler_frames(&ours), 0);
        // A frame of the crate's deep in the stack is the application's use of it.
        let mut deep: Vec<_> = (0..HANDLER_DEPTH).map(|_| frame("app::work")).collect();
        deep.push(frame("pprof::report::ReportBuilder::build"));
        assert_eq!(handler_frames(&deep), 0);
        assert_eq!(handler_frames(&[]), 0);
    }
}
