//! The pusher (`push = true`): the recorder's history sent, a window every
//! `push_interval`, to the destinations the environment names (`push/env.rs`): an
//! OpenTelemetry Collector as OTLP profiles (`push/otlp.rs`) and Grafana Pyroscope
//! through its push API (`push/pyroscope.rs`).
//!
//! The recorder is the buffer: each destination keeps a cursor over its slices, never a
//! queue of payloads. Windows are whole multiples of the interval on the wall clock,
//! contiguous, each slice in exactly one of them, each window sent once. A destination
//! that fails is sent the same window again with a backoff (`push/retry.rs`), honouring
//! `Retry-After`; one that refuses it (a 4xx, a 5xx but 502, 503 and 504) makes it dropped, said once in the log with
//! the server's sentence. After an outage, the windows missed are sent oldest first, as
//! far back as the recorder holds them and at most [`MAX_BACKFILL`]. Its memory is one
//! request at a time per destination.
//!
//! On a thread of its own (`krabka-push`), with a runtime of its own: never on the app's
//! workers, and working when the router is built before any runtime exists. Knows no
//! axum: the routes start it with the source of windows (`crate::cpu`'s recorder).

mod env;
mod otlp;
mod proto;
mod pyroscope;
mod retry;

use std::hash::{BuildHasher, Hasher};
use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use self::env::{Destination, Protocol};
use self::proto::Message;
use self::retry::Outcome;
use crate::profile::Profile;

/// The oldest window still sent after an outage: well inside Pyroscope's one-hour
/// `reject-older-than`, and never more than the recorder keeps.
pub(crate) const MAX_BACKFILL: Duration = Duration::from_secs(50 * 60);
/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a window not yet complete in the recorder is looked at again.
const COMPLETE_LOOK: Duration = Duration::from_millis(200);
/// The pause between two windows sent to catch up (at most 4 requests a second).
const CATCH_UP_PACE: Duration = Duration::from_millis(250);
/// The most the send of a window is put off after its end, spread by instance so that
/// a fleet does not send on the same second.
const MAX_SPREAD: Duration = Duration::from_secs(5);

/// A window of the recorder's history, as the source gives it.
pub(crate) struct Window {
    /// Its CPU profile, starting at the window's start; `None` when nothing was
    /// recorded in it.
    pub(crate) profile: Option<Profile>,
    /// Where the next window's slices begin: after this middle of a slice.
    pub(crate) last: Option<SystemTime>,
}

/// The recorder's windows: `(after, from, to)` to the window, `None` while it is not
/// complete (see `crate::cpu::recorded_window`).
pub(crate) type Source = fn(Option<SystemTime>, SystemTime, SystemTime) -> Option<Window>;

/// The heap profile of the window that just ended (see `crate::heap::for_push`).
pub(crate) type HeapSource = Box<dyn Fn() -> Option<Profile> + Send + Sync>;

/// The most distinct refusals a destination logs (each once): a server whose sentences
/// carry a request id would otherwise be logged at every window, and remembered.
const SAID_AT_MOST: usize = 16;

/// How long a destination whose task panicked waits before it starts again.
const AFTER_PANIC: Duration = Duration::from_secs(1);

/// The heap profiles of the newest windows, each taken once for every destination.
struct Heap {
    source: HeapSource,
    /// The windows they were taken for, and the profiles, newest last: at most
    /// [`HEAP_KEPT`], so that a destination a window behind another still gets its own.
    /// Held while a profile is taken: a second destination asking for the same window
    /// meanwhile waits for it, rather than taking another (whose reading of the counts
    /// would leave a gap in the windows the first was sent).
    taken: tokio::sync::Mutex<std::collections::VecDeque<(u64, Option<Arc<Profile>>)>>,
}

/// How many windows' heap profiles wait for the destinations that have not sent them.
const HEAP_KEPT: usize = 3;

impl Heap {
    /// The heap profile of window `index`, taken at the first call for it (on the
    /// runtime's blocking pool: a dump waits for jemalloc's lock): a destination sending
    /// an older window (catching up) gets none.
    async fn of(self: &Arc<Self>, index: u64, newest: u64) -> Option<Arc<Profile>> {
        let mut taken = self.taken.lock().await;
        if let Some((_, profile)) = taken.iter().find(|(window, _)| *window == index) {
            return profile.clone();
        }
        if index != newest {
            return None;
        }
        let heap = self.clone();
        let profile = tokio::task::spawn_blocking(move || (heap.source)().map(Arc::new))
            .await
            .ok()
            .flatten();
        taken.push_back((index, profile.clone()));
        if taken.len() > HEAP_KEPT {
            taken.pop_front();
        }
        profile
    }
}

/// What the pusher runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) interval: Duration,
    /// How much history the recorder keeps: no window older is asked for.
    pub(crate) keep: Duration,
}

/// One destination's state, for the index page and the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TargetStatus {
    pub(crate) protocol: &'static str,
    pub(crate) url: String,
    pub(crate) windows_sent: u64,
    /// Refused by the destination (a 4xx), never sent again.
    pub(crate) windows_dropped: u64,
    /// Older than the backfill reaches when their turn came.
    pub(crate) windows_lost: u64,
    /// Windows with nothing recorded in them, not sent.
    pub(crate) windows_empty: u64,
    /// Windows sent with a heap profile.
    pub(crate) heap_sent: u64,
    pub(crate) retries: u64,
    pub(crate) bytes_sent: u64,
    /// The largest request body sent or tried, compressed: the pusher's memory per
    /// destination beside the window's profile.
    pub(crate) largest_request: usize,
    pub(crate) last_success: Option<SystemTime>,
    /// The newest failure, and when.
    pub(crate) last_error: Option<(SystemTime, String)>,
    /// Complete windows not yet sent.
    pub(crate) pending: u64,
    /// From the newest window sent's end to its acceptance.
    pub(crate) last_delay: Option<Duration>,
}

/// The pusher of this process, once started.
struct Pusher {
    settings: Settings,
    targets: Vec<Arc<Mutex<TargetStatus>>>,
    /// Why nothing is pushed, when nothing is: no destination, or all refused.
    idle: Option<String>,
}

static PUSHER: OnceLock<Pusher> = OnceLock::new();

/// Starts the pusher with `settings` over `source`, once per process, reading the
/// destinations from the environment. With none named, one `warn` and nothing else.
pub(crate) fn start(settings: Settings, source: Source, heap: Option<HeapSource>) {
    PUSHER.get_or_init(|| {
        let executable = std::env::current_exe()
            .ok()
            .and_then(|path| path.file_name().map(|name| name.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "rust".to_owned());
        let found = env::destinations(&|name| std::env::var(name).ok(), &executable);
        for why in &found.refused {
            tracing::warn!(reason = %why, "krabka-pprof: a push destination is not usable; profiles are not pushed there");
        }
        if found.ready.is_empty() {
            let why = if found.refused.is_empty() {
                "neither OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT) \
                 nor PYROSCOPE_SERVER_ADDRESS is set"
                    .to_owned()
            } else {
                format!("no usable destination: {}", found.refused.join("; "))
            };
            tracing::warn!(reason = %why, "krabka-pprof: `push` is on but nothing is pushed");
            return Pusher {
                settings,
                targets: Vec::new(),
                idle: Some(why),
            };
        }
        let instance = random();
        let resource = resource(instance, &executable);
        let targets: Vec<(Destination, Arc<Mutex<TargetStatus>>)> = found
            .ready
            .into_iter()
            .map(|destination| {
                let status = TargetStatus {
                    protocol: destination.protocol.name(),
                    url: destination.url.clone(),
                    ..TargetStatus::default()
                };
                (destination, Arc::new(Mutex::new(status)))
            })
            .collect();
        let statuses = targets.iter().map(|(_, status)| status.clone()).collect();
        let spread = spread(instance, settings.interval);
        let spawned = std::thread::Builder::new()
            .name("krabka-push".to_owned())
            .spawn(move || run(settings, source, heap, targets, instance, resource, spread));
        let idle = spawned
            .err()
            .map(|error| format!("its thread could not start: {error}"));
        if let Some(why) = &idle {
            tracing::warn!(reason = %why, "krabka-pprof: profiles are not pushed");
        }
        Pusher {
            settings,
            targets: statuses,
            idle,
        }
    });
}

/// The pusher's state, if one was started: its interval, why it is idle if it is, and
/// each destination's state.
pub(crate) fn status() -> Option<(Duration, Option<String>, Vec<TargetStatus>)> {
    let pusher = PUSHER.get()?;
    let targets = pusher
        .targets
        .iter()
        .map(|status| {
            status
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
        .collect();
    Some((pusher.settings.interval, pusher.idle.clone(), targets))
}

/// The pusher's thread: a runtime of its own, one task per destination.
fn run(
    settings: Settings,
    source: Source,
    heap: Option<HeapSource>,
    targets: Vec<(Destination, Arc<Mutex<TargetStatus>>)>,
    instance: u64,
    resource: Vec<(String, String)>,
    spread: Duration,
) {
    // Not looked at by the wall-clock sweep: it is the profiler's own.
    #[cfg(procfs)]
    let _own = crate::process::OwnThread::register();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::warn!(%error, "krabka-pprof: the pusher's runtime could not start; profiles are not pushed");
            return;
        }
    };
    let client = match reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(REQUEST_TIMEOUT / 2)
        .user_agent(concat!("krabka-pprof/", env!("CARGO_PKG_VERSION")))
        .no_proxy()
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "krabka-pprof: the pusher's HTTP client could not start; profiles are not pushed");
            return;
        }
    };
    let heap = heap.map(|source| {
        Arc::new(Heap {
            source,
            taken: tokio::sync::Mutex::new(std::collections::VecDeque::new()),
        })
    });
    runtime.block_on(async move {
        let tasks: Vec<_> = targets
            .into_iter()
            .map(|(destination, status)| {
                // The environment's attributes win over the ones found here.
                let mut resource: Vec<(String, String)> = resource
                    .iter()
                    .filter(|(key, _)| destination.resource.iter().all(|(own, _)| own != key))
                    .cloned()
                    .collect();
                resource.insert(
                    0,
                    ("service.name".to_owned(), destination.service_name.clone()),
                );
                resource.extend(destination.resource.iter().cloned());
                let target = Arc::new(Target {
                    destination,
                    status,
                    origin: otlp::Origin { resource, instance },
                    client: client.clone(),
                    heap: heap.clone(),
                });
                tokio::spawn(async move {
                    // A panic ends the destination's task, not its pushing: it starts
                    // again from the window under way (the windows between are lost).
                    loop {
                        let running = target.clone();
                        let ended =
                            tokio::spawn(async move { running.run(settings, source, spread).await })
                                .await;
                        match ended {
                            Err(error) if error.is_panic() => {
                                tracing::error!(destination = %target.destination.url, "krabka-pprof: the pusher failed; it starts again");
                                target.failed("the pusher failed and started again");
                                tokio::time::sleep(AFTER_PANIC).await;
                            }
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
}

/// One destination and what it needs to be sent to.
struct Target {
    destination: Destination,
    status: Arc<Mutex<TargetStatus>>,
    origin: otlp::Origin,
    client: reqwest::Client,
    heap: Option<Arc<Heap>>,
}

impl Target {
    fn status(&self) -> std::sync::MutexGuard<'_, TargetStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends every window from the one under way at start, for the life of the process.
    async fn run(self: Arc<Self>, settings: Settings, source: Source, spread: Duration) {
        let interval = settings.interval;
        let backfill = settings.keep.min(MAX_BACKFILL);
        let mut next = window_of(SystemTime::now(), interval);
        // Slices of earlier windows are not this run's: at the process's start there are
        // none, and after a restart (a panic) they were sent by the run before.
        let mut after: Option<SystemTime> = Some(window_start(next, interval));
        // Said once each: what a destination refuses, and that it is failing.
        let mut refusals_said: Vec<String> = Vec::new();
        let mut failing = false;
        loop {
            let (from, to) = (
                window_start(next, interval),
                window_start(next + 1, interval),
            );
            sleep_until(to + spread).await;
            let now = SystemTime::now();
            self.status().pending = window_of(now, interval).saturating_sub(next + 1);
            if to + backfill < now {
                // Its turn came too late (a long outage): the recorder no longer holds
                // it all, or the destination would refuse it as too old.
                self.status().windows_lost += 1;
                after = Some(after.map_or(to, |after| after.max(to)));
                next += 1;
                continue;
            }
            let window = loop {
                if let Some(window) = source(after, from, to) {
                    break window;
                }
                tokio::time::sleep(COMPLETE_LOOK).await;
            };
            if let Some(last) = window.last {
                after = Some(last);
            }
            let heap = match &self.heap {
                // Taken only with a CPU profile to send it with: a reading of the counts
                // for an empty window would leave its allocations out of every window.
                Some(heap) if window.profile.is_some() => {
                    let newest = window_of(SystemTime::now(), interval).saturating_sub(1);
                    heap.of(next, newest).await
                }
                _ => None,
            };
            next += 1;
            let Some(profile) = window.profile else {
                self.status().windows_empty += 1;
                continue;
            };
            let body = self.encode(&profile, heap.as_deref());
            if heap.is_some() {
                self.status().heap_sent += 1;
            }
            drop((profile, heap));
            // Symbolizing and encoding took a few megabytes for a moment, in this
            // thread's own allocator arena: given back, not kept for the next window.
            crate::profile::give_back_freed_memory();
            let mut failures = 0;
            loop {
                if to + backfill < SystemTime::now() {
                    self.status().windows_lost += 1;
                    break;
                }
                let outcome = self.send(&body).await;
                match outcome {
                    Outcome::Accepted { rejected } => {
                        let mut status = self.status();
                        status.windows_sent += 1;
                        status.bytes_sent += body.len() as u64;
                        status.last_success = Some(SystemTime::now());
                        status.last_delay = SystemTime::now().duration_since(to).ok();
                        drop(status);
                        if failing {
                            failing = false;
                            tracing::info!(destination = %self.destination.url, "krabka-pprof: pushing works again");
                        }
                        if let Some(why) = rejected
                            && !refusals_said.contains(&why)
                            && refusals_said.len() < SAID_AT_MOST
                        {
                            tracing::warn!(destination = %self.destination.url, reason = %why, "krabka-pprof: the destination kept back part of a pushed profile");
                            refusals_said.push(why);
                        }
                        break;
                    }
                    Outcome::Refused { why } => {
                        self.status().windows_dropped += 1;
                        self.failed(&why);
                        if !refusals_said.contains(&why) && refusals_said.len() < SAID_AT_MOST {
                            tracing::warn!(destination = %self.destination.url, reason = %why, "krabka-pprof: the destination refused a pushed profile; that window is dropped, and this is said once");
                            refusals_said.push(why);
                        }
                        break;
                    }
                    Outcome::Retry { after: wait, why } => {
                        failures += 1;
                        self.status().retries += 1;
                        self.failed(&why);
                        if !failing {
                            failing = true;
                            tracing::warn!(destination = %self.destination.url, reason = %why, "krabka-pprof: pushing failed; the window is sent again, and the windows after it once it works");
                        }
                        // `Retry-After: 0` is no reason to send again at once.
                        let wait = wait
                            .unwrap_or_else(|| retry::backoff(failures, jitter()))
                            .max(retry::FIRST_BACKOFF);
                        tokio::time::sleep(wait).await;
                    }
                }
            }
            // Behind (an outage, a slow destination): the next window is complete
            // already; sent at a pace, not at once.
            if window_start(next + 1, interval) + spread <= SystemTime::now() {
                tokio::time::sleep(CATCH_UP_PACE).await;
            }
        }
    }

    fn failed(&self, why: &str) {
        self.status().last_error = Some((SystemTime::now(), why.to_owned()));
    }

    /// The request body for `profile` (and `heap`), gzipped.
    fn encode(&self, profile: &Profile, heap: Option<&Profile>) -> Vec<u8> {
        let bytes = match self.destination.protocol {
            Protocol::Otlp => {
                let mut window = vec![profile];
                window.extend(heap);
                otlp::export(&window, &self.origin).encode_to_vec()
            }
            Protocol::Pyroscope => pyroscope::push_request(
                profile,
                heap,
                &self.destination.service_name,
                &self.destination.labels,
                self.origin.instance,
            )
            .encode_to_vec(),
        };
        let mut gzip = flate2::write::GzEncoder::new(
            Vec::with_capacity(bytes.len() / 4),
            flate2::Compression::default(),
        );
        let body = match gzip.write_all(&bytes) {
            Ok(()) => gzip.finish().unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let mut status = self.status();
        status.largest_request = status.largest_request.max(body.len());
        body
    }

    /// Posts `body` once.
    async fn send(&self, body: &[u8]) -> Outcome {
        let content_type = match self.destination.protocol {
            Protocol::Otlp => "application/x-protobuf",
            Protocol::Pyroscope => "application/proto",
        };
        let mut request = self
            .client
            .post(&self.destination.url)
            .header("content-type", content_type)
            .header("content-encoding", "gzip")
            .body(body.to_vec());
        for (name, value) in &self.destination.headers {
            request = request.header(name, value);
        }
        if let Some((user, password)) = &self.destination.basic_auth {
            request = request.basic_auth(user, Some(password));
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                return Outcome::Retry {
                    after: None,
                    why: describe(&error),
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        // The start of the answer is enough for its sentence or a partial success.
        let mut answer = Vec::new();
        let mut response = response;
        while let Ok(Some(chunk)) = response.chunk().await {
            answer.extend_from_slice(&chunk[..chunk.len().min(65_536 - answer.len())]);
            if answer.len() >= 65_536 {
                break;
            }
        }
        retry::judge(
            self.destination.protocol,
            status,
            retry_after.as_deref(),
            &answer,
        )
    }
}

/// A failed request in a sentence, its cause's cause included (reqwest's own says only
/// "error sending request").
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())
    } else if error.is_connect() {
        "could not connect".to_owned()
    } else {
        error.to_string()
    };
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The index of the window `at` falls in: windows are whole multiples of `interval`
/// since the epoch.
fn window_of(at: SystemTime, interval: Duration) -> u64 {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_nanos() / interval.as_nanos().max(1)) as u64
}

/// Where window `index` starts.
fn window_start(index: u64, interval: Duration) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(interval.as_nanos() as u64 * index)
}

/// How long after a window's end this instance sends it: drawn from the instance's id,
/// below a quarter of the interval and [`MAX_SPREAD`], and at least half a second (the
/// recorder's last slice of the window is cut on the second).
fn spread(instance: u64, interval: Duration) -> Duration {
    let range = (interval / 4).min(MAX_SPREAD);
    Duration::from_millis(500) + Duration::from_nanos(instance % (range.as_nanos() as u64).max(1))
}

/// Sleeps until the wall clock reaches `at` (a step of the wall clock is followed within
/// a second).
async fn sleep_until(at: SystemTime) {
    loop {
        let Ok(left) = at.duration_since(SystemTime::now()) else {
            return;
        };
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            Instant::now() + left.min(Duration::from_secs(1)),
        ))
        .await;
    }
}

/// A random number (std's per-process random hash keys, drawn anew each call).
fn random() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

/// A jitter in 0 ..= 1.
fn jitter() -> f64 {
    (random() >> 11) as f64 / (1u64 << 53) as f64
}

/// The resource attributes every OTLP export carries (the service's name comes first,
/// per destination), as the semantic conventions name them.
fn resource(instance: u64, executable: &str) -> Vec<(String, String)> {
    let mut attributes = vec![
        ("service.instance.id".to_owned(), format!("{instance:016x}")),
        ("process.pid".to_owned(), std::process::id().to_string()),
        ("process.executable.name".to_owned(), executable.to_owned()),
        ("telemetry.sdk.name".to_owned(), "krabka-pprof".to_owned()),
        ("telemetry.sdk.language".to_owned(), "rust".to_owned()),
        (
            "telemetry.sdk.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
    ];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        attributes.push(("host.name".to_owned(), host.trim().to_owned()));
    }
    attributes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_whole_multiples_of_the_interval_on_the_wall_clock() {
        let interval = Duration::from_secs(15);
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_007_500);
        let index = window_of(at, interval);
        assert_eq!(
            window_start(index, interval),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
        );
        assert_eq!(
            window_start(index + 1, interval),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_015)
        );
        assert_eq!(
            window_of(window_start(index + 1, interval), interval),
            index + 1
        );
    }

    #[test]
    fn the_spread_stays_within_a_quarter_of_the_interval_and_five_seconds() {
        for instance in [0, 1, 7, u64::MAX, 123_456_789_012_345] {
            for interval in [1, 4, 15, 60] {
                let spread = spread(instance, Duration::from_secs(interval));
                assert!(spread >= Duration::from_millis(500));
                let bound = (Duration::from_secs(interval) / 4).min(MAX_SPREAD);
                assert!(spread < Duration::from_millis(500) + bound, "{spread:?}");
            }
        }
        assert_ne!(
            spread(1, Duration::from_secs(60)),
            spread(2_000_000_000, Duration::from_secs(60)),
            "instances spread apart"
        );
    }
}
