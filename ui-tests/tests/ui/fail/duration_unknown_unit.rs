use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_default = "5 parsecs")]
fn app() -> Router {
    Router::new()
}

fn main() {}
