use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(recent = "5s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
