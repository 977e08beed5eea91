use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(threads = "false")]
fn app() -> Router {
    Router::new()
}

fn main() {}
