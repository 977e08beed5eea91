use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(frequency = "99Hz")]
fn app() -> Router {
    Router::new()
}

fn main() {}
