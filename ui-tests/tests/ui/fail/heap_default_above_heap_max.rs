use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(heap = true, heap_default = "40s", heap_max = "30s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
