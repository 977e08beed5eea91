use krabka_pprof::pprof_routes;

#[pprof_routes]
fn app() -> String {
    String::new()
}

fn main() {}
