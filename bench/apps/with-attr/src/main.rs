//! M6: the attribute's build cost, against `../by-hand`, which registers the same routes.
use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[pprof_routes(
    cpu_default = "30s",
    cpu_max = "60s",
    frequency = 99,
    prefix = "/debug/pprof"
)]
fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello\n" }))
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    axum::serve(listener, app()).await.unwrap();
}
