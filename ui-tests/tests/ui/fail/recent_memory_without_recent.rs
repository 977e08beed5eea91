use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(recent_memory = "8MiB")]
fn app() -> Router {
    Router::new()
}

fn main() {}
