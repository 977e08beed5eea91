use axum::Router;
use krabka_pprof::pprof_routes;

// The ui-tests crate depends on krabka-pprof without `heap-profiling`.
#[pprof_routes(heap = true)]
fn app() -> Router {
    Router::new()
}

fn main() {}
