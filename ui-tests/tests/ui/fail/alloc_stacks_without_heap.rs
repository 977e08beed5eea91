use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(alloc_stacks = 0)]
fn app() -> Router {
    Router::new()
}

fn main() {}
