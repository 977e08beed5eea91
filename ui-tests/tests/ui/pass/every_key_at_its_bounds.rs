//! Both ends of every bound are accepted by the attribute and by the runtime's const
//! checks, which run in the expansion's `static` initializer.
use axum::Router;
use krabka_pprof::pprof_routes;

fn admit(parts: &axum::http::request::Parts) -> bool {
    parts.headers.contains_key("x-internal")
}

#[pprof_routes(
    cpu_default = "1s",
    cpu_max = "1s",
    frequency = 1,
    max_windows = 1,
    blocklist = [],
    heap = false,
    threads = false,
    recent = "10s",
    recent_memory = "256KiB",
    prefix = "/p",
    guard = admit,
    token_env = "PPROF_TOKEN",
    crate = "::krabka_pprof",
)]
fn low() -> Router {
    Router::new()
}

#[pprof_routes(
    cpu_default = "1h",
    cpu_max = "1h",
    frequency = 1000,
    max_windows = 64,
    blocklist = ["libc"],
    threads = true,
    recent = "1h",
    recent_memory = "1GiB"
)]
fn high() -> Router {
    Router::new()
}

#[pprof_routes(
    cpu_default = "1m 30s",
    cpu_max = "2m",
    prefix = "/internal/debug/pprof",
    recent = "1m 30s",
    recent_memory = "1536 KiB"
)]
fn humantime_forms() -> Router {
    Router::new()
}

fn main() {
    let _ = (low(), high(), humantime_forms());
}
