use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(recent = "10m", push = true, push_interval = "45s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
