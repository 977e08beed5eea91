use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(heap_max = "20s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
