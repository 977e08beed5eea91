use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(recent = "10m", recent_memory = "100KiB")]
fn app() -> Router {
    Router::new()
}

fn main() {}
