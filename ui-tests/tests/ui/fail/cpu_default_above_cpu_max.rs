use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_default = "90s", cpu_max = "60s")]
fn app() -> Router {
    Router::new()
}

fn main() {}
