use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(heap = true, heap_max = "61m")]
fn app() -> Router {
    Router::new()
}

fn main() {}
