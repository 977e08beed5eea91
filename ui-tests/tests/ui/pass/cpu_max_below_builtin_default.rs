use axum::Router;
use krabka_pprof::pprof_routes;

// `cpu_default` is 30s unless set; with a shorter maximum it follows the maximum.
#[pprof_routes(cpu_max = "10s")]
fn app() -> Router {
    Router::new()
}

fn main() {
    let _ = app();
}
