use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(prefix = "/tenants/{id}/pprof")]
fn app() -> Router {
    Router::new()
}

fn main() {}
