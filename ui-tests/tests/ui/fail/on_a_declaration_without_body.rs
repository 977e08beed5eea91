use axum::Router;
use krabka_pprof::pprof_routes;

trait Service {
    #[pprof_routes]
    fn router(&self) -> Router;
}

fn main() {}
