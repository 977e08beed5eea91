//! M6: the same app as `../with-attr`, with the routes registered by hand.
use std::time::Duration;

use axum::{Router, routing::get};
use krabka_pprof::{ProfilingConfig, pprof_router_with_config};

static CONFIG: ProfilingConfig = ProfilingConfig::new()
    .with_cpu_default(Duration::from_secs(30))
    .with_cpu_max(Duration::from_secs(60))
    .with_frequency(99)
    .with_prefix("/debug/pprof")
    .checked();

fn app() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .merge(pprof_router_with_config(CONFIG).unwrap())
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    axum::serve(listener, app()).await.unwrap();
}
