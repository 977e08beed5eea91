use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(crate = "krabka pprof")]
fn app() -> Router {
    Router::new()
}

fn main() {}
