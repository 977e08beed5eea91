use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_max = "3h", frequency = 0, prefix = "pprof", blocklist = [1])]
fn app() -> Router {
    Router::new()
}

fn main() {}
