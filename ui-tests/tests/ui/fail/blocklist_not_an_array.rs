use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(blocklist = "libc")]
fn app() -> Router {
    Router::new()
}

fn main() {}
