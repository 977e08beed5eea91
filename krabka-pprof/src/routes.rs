//! The HTTP contract, and the only room that knows HTTP: the builders, the route table,
//! and the handlers that run each request in one `tracing` span, access first, hand it to
//! its profile kind (`crate::cpu`, `heap`, `threads`, `tasks`) and its answer to
//! `crate::views`. Its rooms: [`access`] (token and guard), [`query`] (parameters,
//! defaults, clamping), [`response`] (what is sent back), [`answers`] (each kind's
//! failures as Go-shaped answers), [`index`] (the HTML index page).

mod access;
mod answers;
mod index;
mod query;
mod response;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::http::request::Parts;
use axum::response::Response;
use axum::routing::get;
use tracing::{Instrument as _, field};

use self::access::Access;
use self::query::{CpuQuery, HeapQuery, RecentQuery, ThreadsAnswer, ThreadsQuery, WallQuery};
use self::response::{bad_request, not_found, redirect};
use crate::config::{ConfigError, ProfilingConfig};
use crate::cpu::{self, CpuError, CpuRequest, RecentError, RecentRequest, RecorderSettings};
use crate::heap::{self, HeapError, HeapRequest, HeapRoute};
use crate::threads::{self, DumpRequest};
use crate::views::{self, View, ViewBody};

/// The profiling routes with the default [`ProfilingConfig`], to merge into an app or
/// serve on an internal listener.
///
/// ```
/// let internal: axum::Router = krabka_pprof::pprof_router();
/// ```
pub fn pprof_router<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    build(ProfilingConfig::new())
}

/// The profiling routes with `config`, after checking it.
///
/// ```
/// use std::time::Duration;
/// use krabka_pprof::{ProfilingConfig, pprof_router_with_config};
///
/// let config = ProfilingConfig::new().with_cpu_max(Duration::from_secs(120));
/// let router: axum::Router = pprof_router_with_config(config)?;
/// # Ok::<(), krabka_pprof::ConfigError>(())
/// ```
pub fn pprof_router_with_config<S>(config: ProfilingConfig) -> Result<Router<S>, ConfigError>
where
    S: Clone + Send + Sync + 'static,
{
    config.validate()?;
    Ok(build(config))
}

/// What every handler shares.
struct Shared {
    config: ProfilingConfig,
    access: Access,
}

pub(crate) fn build<S>(config: ProfilingConfig) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let shared = Arc::new(Shared {
        config,
        access: Access::from_config(&config),
    });
    // From now on, for the life of the process (on a thread of its own: no runtime needs
    // to exist yet).
    if let Some(settings) = recorder_settings(&config) {
        cpu::start_recorder(settings);
        if config.push() {
            start_pusher(&config, settings.keep);
        }
    }
    let prefix = config.prefix();
    let handler = |route: Route| {
        let shared = shared.clone();
        get(move |request: Request| handle(shared.clone(), route, request))
    };
    let mut router = Router::new()
        .route(prefix, handler(Route::Redirect))
        .route(&format!("{prefix}/"), handler(Route::Index))
        .route(&format!("{prefix}/profile"), handler(Route::Profile))
        .route(&format!("{prefix}/wall"), handler(Route::Wall))
        .route(&format!("{prefix}/blocking"), handler(Route::Blocking))
        // Always mounted: without `recent` it says which key turns it on.
        .route(&format!("{prefix}/recent"), handler(Route::Recent));
    if config.heap() {
        // Allocation counts start here, before the app serves anything.
        heap::prepare(config.alloc_stacks());
        // `/allocs` is where Parca and Grafana Alloy look for memory by default.
        router = router
            .route(&format!("{prefix}/heap"), handler(Route::Heap))
            .route(&format!("{prefix}/allocs"), handler(Route::Allocs));
    }
    if config.threads() {
        // `/goroutine` is where Parca and Grafana Alloy look by default.
        router = router
            .route(&format!("{prefix}/threads"), handler(Route::Threads))
            .route(&format!("{prefix}/goroutine"), handler(Route::Goroutine))
            .route(&format!("{prefix}/tasks"), handler(Route::Tasks));
    }
    // Always mounted: off, it says which key turns it on.
    let router = router.route(&format!("{prefix}/cmdline"), handler(Route::Cmdline));
    announce_open_routes(&config);
    router
}

/// Once per process, where neither a token nor a guard protects the routes: a `warn`
/// naming them, saying who can reach them and how to close them. Zero configuration
/// keeps working; it no longer does so silently.
fn announce_open_routes(config: &ProfilingConfig) {
    static ANNOUNCED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if config.token_env().is_some() || config.guard().is_some() {
        return;
    }
    if ANNOUNCED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let prefix = config.prefix();
    let mut routes = vec!["/", "/profile", "/wall", "/blocking", "/recent"];
    if config.heap() {
        routes.extend(["/heap", "/allocs"]);
    }
    if config.threads() {
        routes.extend(["/threads", "/goroutine", "/tasks"]);
    }
    if config.cmdline() {
        routes.push("/cmdline");
    }
    let routes = routes
        .iter()
        .map(|route| format!("{prefix}{route}"))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::warn!(
        routes = %routes,
        "the profiling routes are open to every client that reaches this listener: no \
         token_env and no guard; close them with `token_env = \"VAR\"`, a `guard`, or by \
         serving krabka_pprof::pprof_router() on an internal listener only (SECURITY.md)"
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Redirect,
    Index,
    Profile,
    Wall,
    Blocking,
    Recent,
    Heap,
    Allocs,
    Threads,
    Goroutine,
    Tasks,
    Cmdline,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Redirect => "",
            Route::Index => "/",
            Route::Profile => "/profile",
            Route::Wall => "/wall",
            Route::Blocking => "/blocking",
            Route::Recent => "/recent",
            Route::Heap => "/heap",
            Route::Allocs => "/allocs",
            Route::Threads => "/threads",
            Route::Goroutine => "/goroutine",
            Route::Tasks => "/tasks",
            Route::Cmdline => "/cmdline",
        }
    }
}

/// Every route: one span, access first, then the route's own work.
async fn handle(shared: Arc<Shared>, route: Route, request: Request) -> Response {
    let (parts, _body) = request.into_parts();
    let span = tracing::info_span!(
        "pprof",
        route = %format_args!("{}{}", shared.config.prefix(), route.name()),
        seconds_requested = field::Empty,
        seconds = field::Empty,
        frequency = field::Empty,
        format = field::Empty,
        symbolize = field::Empty,
        samples = field::Empty,
        bytes = field::Empty,
        outcome = field::Empty,
        stack_reader = field::Empty,
        threads_timed = field::Empty,
        foreign_signals = field::Empty,
        handler_p50_ns = field::Empty,
        handler_p99_ns = field::Empty,
        rate_capped = field::Empty,
        handler_replaced = field::Empty,
        windows = field::Empty,
    );
    async move {
        if let Some(refusal) = shared.access.refusal(&parts) {
            tracing::Span::current().record("outcome", "refused");
            return refusal;
        }
        if !crate::switch::is_on() {
            tracing::Span::current().record("outcome", "switched off");
            return response::error(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                crate::switch::SWITCHED_OFF,
            );
        }
        match route {
            Route::Redirect => redirect(&format!("{}/", shared.config.prefix())),
            Route::Index => index(&shared.config, &parts),
            Route::Profile => cpu_profile(&shared.config, &parts).await,
            Route::Wall => wall_profile(&shared.config, &parts, false).await,
            Route::Blocking => wall_profile(&shared.config, &parts, true).await,
            Route::Recent => recent_profile(&shared.config, &parts).await,
            Route::Heap => heap_profile(&shared.config, &parts, HeapRoute::Heap).await,
            Route::Allocs => heap_profile(&shared.config, &parts, HeapRoute::Allocs).await,
            Route::Threads => thread_dump(&shared.config, &parts, "threads").await,
            Route::Goroutine => thread_dump(&shared.config, &parts, "goroutine").await,
            Route::Tasks => match crate::tasks::dump().await {
                Ok(text) => response::dump_text(text),
                Err(error) => answers::task_dump(error),
            },
            Route::Cmdline if shared.config.cmdline() => {
                response::cmdline(crate::process::cmdline())
            }
            Route::Cmdline => not_found(
                "/cmdline is off: it shows this process's command line, which often carries \
                 secrets; turn it on with `cmdline = true` in #[pprof_routes] \
                 (ProfilingConfig::with_cmdline(true))",
            ),
        }
    }
    .instrument(span)
    .await
}

async fn cpu_profile(config: &ProfilingConfig, parts: &Parts) -> Response {
    let span = tracing::Span::current();
    let query = match CpuQuery::parse(parts.uri.query(), config) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    span.record("seconds", query.duration.as_secs_f64());
    span.record("frequency", query.frequency);
    span.record("format", query.format.name());
    span.record("symbolize", query.naming.symbolize.name());
    if let Some(requested) = query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    let request = CpuRequest {
        duration: query.duration,
        frequency: query.frequency,
        blocklist: config.blocklist(),
        force: query.force,
        max_windows: config.max_windows(),
        symbolize: query.naming.symbolize,
        split: cpu::Split {
            thread_ids: query.thread_ids,
        },
    };
    let format = query.format;
    let lines = query.naming.lines;
    let group = query.group;
    let subtitle = format!("{} s at {} Hz", query.duration.as_secs(), query.frequency);
    let rendered = cpu::profile(request, move |profile| {
        views::render(
            &profile,
            format,
            (lines, group.as_deref()),
            "CPU",
            &subtitle,
        )
        .map_err(CpuError::Failed)
    });
    match rendered.await {
        Ok(view) => response::view(view, "profile"),
        Err(error) => answers::cpu(error),
    }
}

/// `/wall`: a wall-clock profile of the threads doing work; `/blocking` (`blocking`), its
/// view of the time threads slept inside an async task's poll. A window of the CPU
/// sampler's session gives the time on a CPU (so the CPU route's lease and 409s hold),
/// and a sweep opened with it the time off the CPU (`crate::wall`).
async fn wall_profile(config: &ProfilingConfig, parts: &Parts, blocking: bool) -> Response {
    let span = tracing::Span::current();
    let parsed = if blocking {
        // Every thread's poll is looked at: `threads` does not apply.
        CpuQuery::parse(parts.uri.query(), config).map(|cpu| WallQuery {
            cpu,
            every_thread: false,
        })
    } else {
        WallQuery::parse(parts.uri.query(), config)
    };
    let query = match parsed {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    let cpu_query = query.cpu;
    span.record("seconds", cpu_query.duration.as_secs_f64());
    span.record("frequency", cpu_query.frequency);
    span.record("format", cpu_query.format.name());
    span.record("symbolize", cpu_query.naming.symbolize.name());
    if let Some(requested) = cpu_query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    #[cfg(sampler)]
    {
        use crate::wall::{Sweeper, WallOptions, WallParts, WallView};

        if !cpu::shares_windows() {
            return answers::cpu(CpuError::Unavailable(crate::wall::NEEDS_OWN_SAMPLER));
        }
        let request = CpuRequest {
            duration: cpu_query.duration,
            frequency: cpu_query.frequency,
            blocklist: config.blocklist(),
            force: cpu_query.force,
            max_windows: config.max_windows(),
            symbolize: cpu_query.naming.symbolize,
            split: cpu::Split::default(),
        };
        let options = WallOptions {
            view: if blocking {
                WallView::Blocking
            } else {
                WallView::Wall
            },
            every_thread: query.every_thread,
            thread_ids: cpu_query.thread_ids,
        };
        let (format, lines, group) = (cpu_query.format, cpu_query.naming.lines, cpu_query.group);
        let (title, subtitle) = if blocking {
            (
                "Blocking",
                format!(
                    "{} s of time asleep inside async tasks' polls, looked at {} times a second",
                    cpu_query.duration.as_secs(),
                    cpu_query.frequency
                ),
            )
        } else {
            (
                "Wall clock",
                format!(
                    "{} s, threads {}, looked at {} times a second",
                    cpu_query.duration.as_secs(),
                    if query.every_thread {
                        "all"
                    } else {
                        "doing work"
                    },
                    cpu_query.frequency
                ),
            )
        };
        let (frequency, blocklist) = (cpu_query.frequency, config.blocklist());
        let rendered = cpu::window(
            request,
            move || Sweeper::start(frequency, blocklist),
            Sweeper::stop,
            move |closed: cpu::Closed, sweeper: Sweeper| {
                let parts = WallParts {
                    collected: closed.collected,
                    shared_with: closed.shared_with,
                    symbolize: closed.symbolize,
                    before: closed.before,
                    swept: sweeper.finish(),
                };
                let profile = crate::wall::wall_profile(parts, options);
                let rendered = views::render(
                    &profile,
                    format,
                    (lines, group.as_deref()),
                    title,
                    &subtitle,
                )
                .map_err(CpuError::Failed);
                (rendered, false)
            },
        );
        match rendered.await {
            Ok(view) => response::view(view, "profile"),
            Err(error) => answers::cpu(error),
        }
    }
    #[cfg(not(sampler))]
    answers::cpu(CpuError::Unavailable(
        crate::wall::UNAVAILABLE.unwrap_or_default(),
    ))
}

/// What the recorder runs with, if `config` turns it on.
fn recorder_settings(config: &ProfilingConfig) -> Option<RecorderSettings> {
    Some(RecorderSettings {
        keep: config.recent()?,
        budget: config.recent_memory(),
        frequency: config.frequency(),
        blocklist: config.blocklist(),
        push_interval: config.push().then(|| config.push_interval()),
    })
}

/// Starts this process's pusher over the recorder (`push = true`), where both can run.
fn start_pusher(config: &ProfilingConfig, keep: std::time::Duration) {
    if let Some(why) = cpu::recorder_unavailable() {
        tracing::warn!(
            reason = why,
            "krabka-pprof: `push` is on but nothing is pushed"
        );
        return;
    }
    #[cfg(feature = "push")]
    crate::push::start(
        crate::push::Settings {
            interval: config.push_interval(),
            keep,
        },
        |after, from, to| {
            cpu::recorded_window(after, from, to).map(|recorded| crate::push::Window {
                profile: recorded.profile,
                last: recorded.last,
            })
        },
        config.heap().then(|| {
            let alloc_stacks = config.alloc_stacks();
            Box::new(move || heap::for_push(alloc_stacks)) as crate::push::HeapSource
        }),
    );
    #[cfg(not(feature = "push"))]
    {
        let _ = (config, keep);
        tracing::warn!(
            "krabka-pprof: `push` is on but this build has no `push` feature: nothing is pushed"
        );
    }
}

/// `/recent`: the CPU profile of a window of the past, at once, from the recorder.
async fn recent_profile(config: &ProfilingConfig, parts: &Parts) -> Response {
    let Some(settings) = recorder_settings(config) else {
        return answers::recorder_off();
    };
    let span = tracing::Span::current();
    let query = match RecentQuery::parse(
        parts.uri.query(),
        settings.keep,
        std::time::SystemTime::now(),
    ) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    span.record("seconds", query.duration.as_secs_f64());
    span.record("frequency", settings.frequency);
    span.record("format", query.format.name());
    span.record("symbolize", query.naming.symbolize.name());
    if let Some(requested) = query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    let request = RecentRequest {
        seconds: query.duration,
        end: query.end,
        symbolize: query.naming.symbolize,
    };
    let (format, lines, group) = (query.format, query.naming.lines, query.group);
    let rendered = cpu::recent_profile(settings, request, move |profile| {
        let subtitle = format!(
            "{:.0} s recorded at {} Hz",
            profile.duration_nanos as f64 / 1e9,
            settings.frequency
        );
        views::render(
            &profile,
            format,
            (lines, group.as_deref()),
            "CPU, recorded",
            &subtitle,
        )
        .map_err(RecentError::Failed)
    });
    match rendered.await {
        Ok(view) => response::view(view, "profile"),
        Err(error) => answers::recent(error),
    }
}

async fn heap_profile(config: &ProfilingConfig, parts: &Parts, route: HeapRoute) -> Response {
    let span = tracing::Span::current();
    let query = match HeapQuery::parse(parts.uri.query(), config) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    span.record("format", query.format.name());
    span.record("symbolize", query.naming.symbolize.name());
    if let Some(requested) = query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    let format = query.format;
    let lines = query.naming.lines;
    let sample_index = query.sample_index;
    let rendered = heap::profile(
        HeapRequest {
            route,
            window: query.window,
            seconds_given: query.seconds_requested.is_some(),
            symbolize: query.naming.symbolize,
            alloc_stacks: config.alloc_stacks(),
            sample_index,
        },
        move |profile| {
            let shown = sample_index.unwrap_or_else(|| profile.string(profile.default_sample_type));
            let (title, what) = if shown.starts_with("alloc_") {
                ("Allocations", "memory allocated")
            } else {
                ("Heap in use", "live memory")
            };
            let subtitle = if profile.duration_nanos > 0 {
                format!(
                    "{what}, sampled over {} s",
                    (profile.duration_nanos + 500_000_000) / 1_000_000_000
                )
            } else if title == "Allocations" {
                "memory allocated since the counts began".to_owned()
            } else {
                "live memory, sampled since the process started".to_owned()
            };
            views::render_with(
                &profile,
                format,
                (lines, None),
                sample_index,
                title,
                &subtitle,
            )
            .map_err(HeapError::BadRequest)
        },
    );
    match rendered.await {
        Ok(view) => response::view(view, "heap"),
        Err(error) => answers::heap(error),
    }
}

/// `/threads` and `/goroutine`: every thread's stack now.
async fn thread_dump(config: &ProfilingConfig, parts: &Parts, filename: &'static str) -> Response {
    let span = tracing::Span::current();
    let query = match ThreadsQuery::parse(parts.uri.query()) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    let answer = query.answer;
    span.record("symbolize", query.naming.symbolize.name());
    span.record(
        "format",
        match answer {
            ThreadsAnswer::Profile(format) => format.name(),
            ThreadsAnswer::Grouped => "debug=1",
            ThreadsAnswer::Every => "debug=2",
        },
    );
    let request = DumpRequest {
        deadline: query.deadline,
        blocklist: config.blocklist(),
        symbolize: query.naming.symbolize,
    };
    let lines = query.naming.lines;
    let rendered = threads::dump(request, move |dump| {
        let samples = dump.threads.len() as i64;
        let text = |body: String| View {
            body: ViewBody::Text(body),
            samples,
        };
        match answer {
            ThreadsAnswer::Profile(format) => {
                let subtitle = format!("{samples} threads, {} answered", dump.answered);
                views::render(&dump.profile, format, (lines, None), "Threads", &subtitle)
            }
            ThreadsAnswer::Grouped => Ok(text(threads::grouped_text(&dump))),
            ThreadsAnswer::Every => Ok(text(threads::every_thread_text(&dump))),
        }
    });
    match rendered.await {
        Ok(view) => response::view(view, filename),
        Err(error) => answers::thread_dump(error),
    }
}

/// The index page: every route this app serves, the settings in force, ready links.
fn index(config: &ProfilingConfig, parts: &Parts) -> Response {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("HOST");
    response::index(index::index_html(
        config,
        host,
        cpu::status(),
        cpu::recorder_status(),
    ))
}
