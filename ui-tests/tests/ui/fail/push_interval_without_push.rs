use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(recent = "10m", push_interval = "15s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
