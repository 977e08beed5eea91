//! One CPU profiling session at a time: the busy slot (an RAII guard owned by the
//! request), starting the sampler, draining it while the window runs, stopping it, and
//! building the pprof `Profile`. Everything that can take more than microseconds runs on
//! the blocking pool.

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod sampler;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub(crate) use pprof::protos::Profile;

/// What one request asks of the CPU profiler, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuRequest {
    pub(crate) duration: Duration,
    pub(crate) frequency: u32,
    pub(crate) blocklist: &'static [&'static str],
    /// Stop a running profile early instead of answering 409.
    pub(crate) force: bool,
}

/// Why a CPU profile could not be produced.
#[derive(Debug)]
pub(crate) enum CpuError {
    /// Another profile is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// This target has no sampler.
    #[cfg_attr(
        all(
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64")
        ),
        expect(dead_code, reason = "constructed on other targets")
    )]
    Unsupported,
    /// The profiler itself failed.
    Failed(String),
}

/// The running profile, if any. Process-wide: there is one `SIGPROF` timer per process,
/// whatever the number of routers.
struct Running {
    ends_at: Instant,
    /// Notified by a `?force=true` request: the running profile stops early.
    stop_early: Arc<Notify>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
/// Notified every time the profiler is freed, for `?force=true` requests waiting on it.
static RELEASED: Notify = Notify::const_new();

/// Holds the process's CPU profiler for one request; dropping it frees the profiler, so
/// a client that hangs up (axum drops the handler future) frees it at once.
pub(crate) struct CpuSlot {
    stop_early: Arc<Notify>,
}

impl CpuSlot {
    fn try_acquire(duration: Duration) -> Result<CpuSlot, (CpuError, Arc<Notify>)> {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(current) = &*running {
            let busy = CpuError::Busy {
                retry_after: current.ends_at.saturating_duration_since(now),
            };
            return Err((busy, current.stop_early.clone()));
        }
        let stop_early = Arc::new(Notify::new());
        *running = Some(Running {
            ends_at: now + duration,
            stop_early: stop_early.clone(),
        });
        Ok(CpuSlot { stop_early })
    }

    /// Takes the profiler. With `force`, a running profile is asked to stop early (its
    /// caller still gets what it sampled) and this request waits for it to let go.
    pub(crate) async fn acquire(duration: Duration, force: bool) -> Result<CpuSlot, CpuError> {
        let deadline = tokio::time::Instant::now() + FORCE_WAIT;
        loop {
            let released = RELEASED.notified();
            tokio::pin!(released);
            // Registered before looking, so a release in between is not missed.
            released.as_mut().enable();
            match CpuSlot::try_acquire(duration) {
                Ok(slot) => return Ok(slot),
                Err((busy, _)) if !force => return Err(busy),
                Err((_, stop_early)) => {
                    stop_early.notify_one();
                    if tokio::time::timeout_at(deadline, released).await.is_err() {
                        return Err(CpuError::Failed(
                            "the running CPU profile did not stop when asked to".into(),
                        ));
                    }
                }
            }
        }
    }
}

/// How long a `?force=true` request waits for the running profile to stop: it stops at
/// its next scheduling point, then needs the blocking pool to stop the sampler.
const FORCE_WAIT: Duration = Duration::from_secs(10);

impl Drop for CpuSlot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(PoisonError::into_inner) = None;
        RELEASED.notify_waiters();
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub(crate) use sampling::profile;

/// The sampler's side of a request: everything here needs the Linux sampler.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod sampling {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{CpuError, CpuRequest, CpuSlot, Profile, sampler};

    /// Runs `f` on the blocking pool; a panic inside becomes a `Failed` error, never a crash.
    async fn blocking<T, F>(f: F) -> Result<T, CpuError>
    where
        F: FnOnce() -> Result<T, CpuError> + Send + 'static,
        T: Send + 'static,
    {
        crate::on_blocking_pool(f, CpuError::Failed).await
    }

    /// Takes one CPU profile and hands it to `render` on the blocking pool.
    pub(crate) async fn profile<R, F>(request: CpuRequest, render: F) -> Result<R, CpuError>
    where
        F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
        R: Send + 'static,
    {
        use sampler::{DRAIN_EVERY, Sampler, StartError};

        let slot = CpuSlot::acquire(request.duration, request.force).await?;
        let stop_early = slot.stop_early.clone();
        let sampler = blocking(move || {
            Sampler::start(request.frequency, request.blocklist).map_err(|err| match err {
                // A cancelled request's sampler may still be stopping on the blocking pool.
                StartError::Running => CpuError::Busy {
                    retry_after: Duration::from_secs(1),
                },
                StartError::System(call, error) => {
                    CpuError::Failed(format!("{call} failed: {error}"))
                }
            })
        })
        .await?;
        // Shared with the drains, which run on the blocking pool like the rest of the work.
        let sampler = Arc::new(sampler);
        let deadline = tokio::time::Instant::now() + request.duration;
        let mut drain =
            tokio::time::interval_at(deadline - request.duration + DRAIN_EVERY, DRAIN_EVERY);
        let mut draining: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                () = stop_early.notified() => break,
                _ = drain.tick() => {
                    // One drain at a time; a slow one just makes the next fold more.
                    if draining.as_ref().is_none_or(|d| d.is_finished()) {
                        let sampler = sampler.clone();
                        draining = Some(tokio::task::spawn_blocking(move || sampler.drain()));
                    }
                }
            }
        }
        if let Some(draining) = draining {
            let _ = draining.await;
        }
        let Ok(sampler) = Arc::try_unwrap(sampler) else {
            return Err(CpuError::Failed(
                "a drain of the sampler did not finish".into(),
            ));
        };
        blocking(move || {
            let collected = sampler.stop();
            drop(slot);
            render(report(collected))
        })
        .await
    }

    /// The pprof profile of a finished session: `samples/count` and `cpu/nanoseconds`, one
    /// sample per distinct (thread, stack).
    fn report(collected: sampler::Collected) -> Profile {
        use crate::profile::{Frame, LabelValue, Meta, ProfileBuilder};
        use sampler::{FLAG_BLOCKLISTED, FLAG_NO_SCRATCH, FLAG_NO_STACK_READ};
        use std::collections::HashMap;

        let period = 1_000_000_000 / i64::from(collected.frequency);
        let weight = sample_weight(&collected, period);
        let mut builder = ProfileBuilder::new(&collected.objects);
        let mut thread_names: HashMap<u32, String> = HashMap::new();
        for (stack, count) in &collected.stacks {
            let mut frames: Vec<Frame> = stack
                .frames
                .iter()
                .enumerate()
                // Return addresses point after the call; minus one lands inside it.
                .map(|(i, &address)| Frame::Code(if i == 0 { address } else { address - 1 }))
                .collect();
            if stack.flags & FLAG_BLOCKLISTED != 0 {
                let library = stack
                    .frames
                    .first()
                    .and_then(|pc| collected.objects.find(*pc))
                    .map_or("a blocklisted library", |(_, o)| o.short_name());
                frames.push(Frame::Marker(format!(
                    "[{library}: blocklisted, not unwound]"
                )));
            }
            if stack.flags & FLAG_NO_SCRATCH != 0 {
                frames.push(Frame::Marker(
                    "[not unwound: sampler busy on other threads]".into(),
                ));
            }
            if stack.flags & FLAG_NO_STACK_READ != 0 {
                frames.push(Frame::Marker(
                    "[not unwound: process_vm_readv is not allowed here]".into(),
                ));
            }
            let name = thread_names
                .entry(stack.tid)
                .or_insert_with(|| thread_name(stack.tid))
                .clone();
            let count = *count as i64;
            builder.add(
                frames,
                vec![count, (count as f64 * weight).round() as i64],
                vec![
                    ("thread", LabelValue::Str(name)),
                    ("thread_id", LabelValue::Num(i64::from(stack.tid))),
                ],
            );
        }
        if collected.lost > 0 {
            let lost = collected.lost as i64;
            builder.add(
                vec![Frame::Marker("[lost: sample buffer full]".into())],
                vec![lost, (lost as f64 * weight).round() as i64],
                Vec::new(),
            );
        }
        let time_nanos = collected
            .started
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        builder.finish(
            &Meta {
                sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
                period_type: ("cpu", "nanoseconds"),
                period,
                time_nanos,
                duration_nanos: collected.duration.as_nanos() as i64,
                default_sample_type: None,
            },
            &|_| false,
        )
    }

    /// CPU nanoseconds one sample stands for: the period, unless the timer could not keep up.
    ///
    /// `ITIMER_PROF` expires at most once per scheduler tick on each CPU (`CONFIG_HZ`, often
    /// 250), so above that rate the kernel delivers fewer signals than asked. Then each sample
    /// stands for the process's measured CPU time divided by the samples taken, so that
    /// `cpu/nanoseconds` still adds up to the CPU the process really used.
    fn sample_weight(collected: &sampler::Collected, period: i64) -> f64 {
        let samples = collected.stacks.values().sum::<u64>() + collected.lost;
        let expected = collected.cpu_time.as_secs_f64() * f64::from(collected.frequency);
        if samples > 0 && (samples as f64) < expected * 0.8 {
            collected.cpu_time.as_nanos() as f64 / samples as f64
        } else {
            period as f64
        }
    }

    /// A thread's name while it lives; its id once it has exited.
    fn thread_name(tid: u32) -> String {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .map(|name| name.trim_end().to_owned())
            .unwrap_or_else(|_| format!("thread {tid}"))
    }
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
/// Without a sampler for this target, every request is a 503.
pub(crate) async fn profile<R, F>(_request: CpuRequest, _render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    Err(CpuError::Unsupported)
}
