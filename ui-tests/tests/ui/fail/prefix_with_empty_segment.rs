use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(prefix = "/debug//pprof")]
fn app() -> Router {
    Router::new()
}

fn main() {}
