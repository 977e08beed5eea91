use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes(token_env = "PPROF-TOKEN")]
fn app() -> Router {
    Router::new()
}

fn main() {}
