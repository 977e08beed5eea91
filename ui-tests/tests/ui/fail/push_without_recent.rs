use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(push = true)]
fn app() -> Router {
    Router::new()
}

fn main() {}
