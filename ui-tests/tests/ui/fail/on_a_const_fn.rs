use axum::Router;
use krabka_pprof::pprof_routes;

#[pprof_routes]
const fn app() -> Router {
    panic!()
}

fn main() {}
