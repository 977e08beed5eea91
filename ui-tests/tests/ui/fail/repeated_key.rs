use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(frequency = 99, cpu_max = "60s", frequency = 100)]
fn app() -> Router {
    Router::new()
}

fn main() {}
