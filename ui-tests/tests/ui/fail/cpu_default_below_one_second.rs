use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_default = "999ms")]
fn app() -> Router {
    Router::new()
}

fn main() {}
