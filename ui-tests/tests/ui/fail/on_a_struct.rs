use krabka_pprof::pprof_routes;

#[pprof_routes]
struct App;

fn main() {}
