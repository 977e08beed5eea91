use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(guard = "crate::allow")]
fn app() -> Router {
    Router::new()
}

fn allow(_: &axum::http::request::Parts) -> bool {
    true
}

fn main() {}
