use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(heap = true, alloc_stacks = 10)]
fn app() -> Router {
    Router::new()
}

fn main() {}
