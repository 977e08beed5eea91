use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[pprof_routes]
fn app() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn main() {
    let _: Router = app();
}
