use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_max = "60")]
fn app() -> Router {
    Router::new()
}

fn main() {}
