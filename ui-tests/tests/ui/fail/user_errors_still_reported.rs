use axum::Router;
use krabka_pprof::pprof_routes;

// The attribute's mistake and the body's own type error are both reported.
#[pprof_routes(frequency = 0)]
fn app() -> Router {
    let count: u32 = "not a number";
    Router::new()
}

fn main() {
    let _ = app();
}
