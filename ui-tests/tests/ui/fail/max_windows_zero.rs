use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(max_windows = 0)]
fn app() -> Router {
    Router::new()
}

fn main() {}
