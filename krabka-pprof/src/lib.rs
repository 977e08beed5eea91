//! Go-compatible pprof endpoints for axum services, from one attribute.
//!
//! ```toml
//! [dependencies]
//! krabka-pprof = "0.1"   # Rust 1.88 or later; axum 0.8 (0.8.9 or later)
//! ```
//!
//! ```
//! use axum::{Router, routing::get};
//! use krabka_pprof::pprof_routes;
//!
//! #[pprof_routes(cpu_max = "60s")]
//! fn app() -> Router {
//!     Router::new().route("/", get(|| async { "hello" }))
//! }
//! // app() now also answers GET /debug/pprof/profile?seconds=N
//! ```
//!
//! Then `go tool pprof http://127.0.0.1:PORT/debug/pprof/profile?seconds=5` reads a CPU
//! profile of the running service, and Parca or Grafana Alloy can scrape it.
//!
//! The attribute's settings are checked when the app compiles (see [`pprof_routes`] for
//! the keys). Without the attribute, [`pprof_router`] and [`pprof_router_with_config`]
//! build the same routes, for example to serve them on an internal listener.
//!
//! Before it reaches production: with neither `token_env` nor `guard`, the routes are
//! open to every client that reaches the listener, and building them logs a `warn` that
//! says so. A token, a guard, or an internal listener closes them; which to choose, and
//! what each route reveals, is in
//! [SECURITY.md](https://github.com/krabka/krabka-pprof/blob/main/SECURITY.md). Release
//! builds keep their symbols and take `debug = "line-tables-only"` for source lines
//! ([release builds](guide::release_builds)); what the routes cost, how to switch them
//! off and what a sandbox must allow is in [operating it](guide::operating).
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `flamegraph` | on | `?format=svg`: flamegraphs drawn by inferno |
//! | `heap-profiling` | off | `/heap` and `/allocs` through jemalloc's sampling, and `Jemalloc`, the global allocator that turns it on; heap profiles are served on Linux with glibc, and answer 503 elsewhere ([heap profiling](guide::heap)) |
//! | `opentelemetry` | off | [`labels::layer`] labels samples with the OpenTelemetry span and trace ids of the local root span |
//! | `ebpf-labels` | off | the labels active on each thread also where eBPF profilers (the OpenTelemetry eBPF profiler, parca-agent) read them: Polar Signals' custom-labels ABI v1, on Linux on x86_64 and aarch64; the executable must export two symbols ([labels](guide::labels)) |
//! | `push` | off | `push = true`: the recorder's history pushed to an OpenTelemetry Collector (OTLP profiles) and Grafana Pyroscope, over plain HTTP ([pushing profiles](guide::push)) |
//! | `task-dump` | off | `/tasks`, tokio's task dump, when the app is also built with `RUSTFLAGS="--cfg tokio_unstable"` on Linux ([thread and task dumps](guide::threads)) |
//!
//! The HTTP contract follows; the [`guide`] has a page for each of the rest:
//! [how the CPU sampler works](guide::cpu), [wall-clock profiles and what blocks the
//! runtime](guide::wall), [labels on samples](guide::labels),
//! [profiles of the past](guide::recent) (the `recent` recorder), [heap profiling](guide::heap),
//! [thread and task dumps](guide::threads), [scraping with Parca and Grafana
//! Alloy](guide::scraping), [good stacks in release builds](guide::release_builds),
//! [platforms](guide::platforms), [limits](guide::limits) and [operating
//! it](guide::operating).
//!
//! # The HTTP contract
//!
#![doc = include_str!("../docs/http.md")]
// docs.rs builds with `--cfg docsrs` (Cargo.toml's `[package.metadata.docs.rs]`): its
// nightly rustdoc then labels each item with the features it needs. No effect elsewhere.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The platform conditions (`sampler`, `pprof_rs`, `procfs`, `elf`, `jemalloc`,
// `heap_dumps`, `task_dumps`) are named once, in build.rs. The rooms and the one way their
// imports point are in ARCHITECTURE.md.

mod config;
mod cpu;
pub mod guide;
mod heap;
pub mod labels;
// Loaded objects, their symbols and the profiles built from them exist for the Linux
// sampler and heap dumps; profiles are built everywhere a profile route works. Each is
// partly unused elsewhere.
#[cfg_attr(not(sampler), allow(dead_code))]
mod objects;
mod offload;
mod process;
#[cfg_attr(not(sampler), allow(dead_code))]
mod profile;
#[cfg(feature = "push")]
mod push;
mod routes;
#[cfg(sampler)]
mod sampler;
mod switch;
#[cfg_attr(not(sampler), allow(dead_code))]
mod symbolize;
pub mod task_hooks;
mod tasks;
mod threads;
mod views;
mod wall;

pub use config::{
    ConfigError, DEFAULT_PUSH_INTERVAL, DEFAULT_RECENT_MEMORY, DurationField, Guard,
    MAX_ALLOC_STACKS, MAX_DURATION, MAX_FREQUENCY, MAX_PUSH_INTERVAL, MAX_RECENT,
    MAX_RECENT_MEMORY, MAX_WINDOWS, MIN_ALLOC_STACKS, MIN_DURATION, MIN_FREQUENCY,
    MIN_PUSH_INTERVAL, MIN_RECENT, MIN_RECENT_MEMORY, MIN_WINDOWS, PUSH_HISTORY_MARGIN,
    ProfilingConfig,
};
#[cfg(jemalloc)]
pub use heap::Jemalloc;
#[doc(inline)]
pub use krabka_pprof_macros::pprof_routes;
pub use routes::{pprof_router, pprof_router_with_config};

/// Switches profiling on or off for the whole process, at once, without a restart: off,
/// every profiling route answers 503 (after its token and guard, so that a stranger
/// learns nothing), saying it is switched off, and the recorder (`recent`) stops sampling
/// before this returns (it waits at most a second for the recorder's thread) and keeps
/// its history; on again, the routes answer and the recorder
/// samples again within a second, its next slice saying why a gap came before it. A CPU
/// window already open runs to its end. On unless switched off. An incident runbook's
/// lever, or a feature flag's: see the guide's *Operating it* page.
pub fn set_profiling_enabled(on: bool) {
    switch::set(on);
    if !on {
        // Returns once the recorder has stopped (at most a second).
        cpu::recorder_switched_off();
    }
}

/// Whether profiling is on: see [`set_profiling_enabled`].
pub fn profiling_enabled() -> bool {
    switch::is_on()
}

/// Replaces, at once and without a restart, the bearer token of every router built with
/// `token_env`: from now on requests must carry `token`, and the value the variable had at
/// startup no longer opens the routes (a router whose variable was unset at startup, and
/// so locked, opens with it). For rotating a token that a service reads from a file (a
/// Kubernetes Secret mounted as a volume is replaced in place): read the file when it
/// changes and call this. An empty `token` locks the routes (503), never opens them.
/// Routers without `token_env` are unaffected: a token is never required where none was
/// asked for.
pub fn set_profiling_token(token: &str) {
    switch::set_token(token.trim().as_bytes());
}

/// What `#[pprof_routes]` expansions call. Not a stable API: it changes with the attribute,
/// and only the exact matching version of `krabka-pprof-macros` may use it.
#[doc(hidden)]
pub mod __private {
    use crate::config::{Guard, ProfilingConfig};

    /// For this workspace's tests only.
    pub use crate::offload::{ProfilerThreadHold, hold_profiler_thread};

    /// Implemented for `axum::Router<S>` only, so that a function returning anything else
    /// gets a message naming the attribute rather than a trait-bound puzzle.
    #[diagnostic::on_unimplemented(
        message = "`#[pprof_routes]` needs the function to return `axum::Router` or `axum::Router<S>`, but it returns `{Self}`",
        label = "not `axum::Router`",
        note = "the attribute merges the profiling routes into the router this function returns"
    )]
    pub trait Routes: Sized {
        /// Adds the profiling routes for `config`.
        fn with_profiling_routes(self, config: &'static ProfilingConfig) -> Self;
    }

    impl<S> Routes for axum::Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        fn with_profiling_routes(self, config: &'static ProfilingConfig) -> Self {
            let routes = crate::routes::build::<S>(*config);
            // axum panics on a route registered twice with a message that names the
            // path but not why it is there twice; the cause is almost always one of two
            // mistakes, which this message names.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.merge(routes)))
                .unwrap_or_else(|axum| panic!("{}", overlap_message(config.prefix(), &*axum)))
        }
    }

    /// The startup panic's message when the profiling routes collide with a route of the
    /// router they are merged into.
    fn overlap_message(prefix: &str, axum: &(dyn std::any::Any + Send)) -> String {
        let axum = crate::offload::panic_message(axum).unwrap_or("a route collided");
        format!(
            "#[pprof_routes]: the router this function returns already has a route where the \
             profiling routes go, under `{prefix}` ({axum}). Either the function returns a \
             router that another `#[pprof_routes]` function already annotated (annotate only \
             the outermost one), or the app has its own route under `{prefix}` (move it, or \
             give the attribute another `prefix = \"...\"`)"
        )
    }

    /// Merges the profiling routes into the router the annotated function built, unless
    /// its returned expression already placed them under its layers
    /// ([`merge_under_layers`]).
    pub fn merge<R: Routes>(
        router: R,
        config: &'static ProfilingConfig,
        placed: &core::cell::Cell<bool>,
    ) -> R {
        if placed.get() {
            router
        } else {
            router.with_profiling_routes(config)
        }
    }

    /// Merges the profiling routes into the router the function returns at the point of
    /// its returned expression where the function's own layers will cover them: before
    /// its first `.layer(…)` or `.route_layer(…)`. Notes that it did, so that [`merge`]
    /// does not merge them twice.
    pub fn merge_under_layers<R: Routes>(
        router: R,
        config: &'static ProfilingConfig,
        placed: &core::cell::Cell<bool>,
    ) -> R {
        if placed.replace(true) {
            router
        } else {
            router.with_profiling_routes(config)
        }
    }

    /// Makes this process take CPU profiles with the `pprof` crate's sampler instead of
    /// this crate's own, for the tests that prove that backend on Linux. Call it before
    /// the first profile.
    #[cfg(all(sampler, pprof_rs))]
    pub fn use_pprof_rs_sampler() {
        crate::cpu::pprof_rs::choose();
    }

    /// Gives a `guard = path` its type, so a wrong signature is reported at the path.
    pub const fn guard(guard: Guard) -> Guard {
        guard
    }

    pub use crate::__krabka_pprof_require_heap_profiling as require_heap_profiling;
    pub use crate::__krabka_pprof_require_push as require_push;

    /// Implemented only when the `push` feature is on.
    #[diagnostic::on_unimplemented(
        message = "`push = true` needs krabka-pprof's `push` feature",
        label = "pushing is compiled out",
        note = "in Cargo.toml write `krabka-pprof = {{ version = \"…\", features = [\"push\"] }}`, or remove `push = true`"
    )]
    pub trait PushFeature {}

    #[cfg(feature = "push")]
    impl PushFeature for bool {}

    /// Fails to type-check on the user's `true` when the feature is off.
    pub fn push_feature<T: PushFeature>(_on: T) {}

    /// Implemented only when the `heap-profiling` feature is on.
    #[diagnostic::on_unimplemented(
        message = "`heap = true` needs krabka-pprof's `heap-profiling` feature",
        label = "heap profiling is compiled out",
        note = "in Cargo.toml write `krabka-pprof = {{ version = \"…\", features = [\"heap-profiling\"] }}`, or remove `heap = true`"
    )]
    pub trait HeapProfilingFeature {}

    #[cfg(feature = "heap-profiling")]
    impl HeapProfilingFeature for bool {}

    /// Fails to type-check on the user's `true` when the feature is off.
    pub fn heap_profiling_feature<T: HeapProfilingFeature>(_on: T) {}
}

/// `heap = true` compiles only with the `heap-profiling` feature. Defined twice so that the
/// macro crate never needs to know this crate's features; the expansion always calls it
/// with the user's own `true` token, so the error points there.
#[cfg(feature = "heap-profiling")]
#[doc(hidden)]
#[macro_export]
macro_rules! __krabka_pprof_require_heap_profiling {
    ($on:expr) => {};
}

/// See the `heap-profiling` variant above. Without the feature, nothing implements
/// [`__private::HeapProfilingFeature`], so the bound fails on the user's token with the
/// trait's message.
#[cfg(not(feature = "heap-profiling"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __krabka_pprof_require_heap_profiling {
    ($on:expr) => {
        $crate::__private::heap_profiling_feature($on)
    };
}

/// `push = true` compiles only with the `push` feature, as `heap = true` with
/// `heap-profiling` (above).
#[cfg(feature = "push")]
#[doc(hidden)]
#[macro_export]
macro_rules! __krabka_pprof_require_push {
    ($on:expr) => {};
}

/// See the `push` variant above.
#[cfg(not(feature = "push"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __krabka_pprof_require_push {
    ($on:expr) => {
        $crate::__private::push_feature($on)
    };
}
