use krabka_pprof::pprof_routes;

struct Router;

#[pprof_routes]
fn app() -> Router {
    Router
}

fn main() {}
