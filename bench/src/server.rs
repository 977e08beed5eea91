//! The service under test (`bench server`): a trivial route, with or without the
//! attribute, on either runtime flavour, pinned to one core.

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_max = "60s", frequency = 99)]
fn with_profiling() -> Router {
    plain()
}

fn plain() -> Router {
    Router::new().route("/hello", get(|| async { "hello\n" }))
}

/// Serves until killed; prints `addr=...` once listening.
pub fn serve(attribute: bool, current_thread: bool, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        crate::system::pin_to_cpu(cpu);
    }
    let mut builder = if current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(1);
        b
    };
    let runtime = builder.enable_all().build().expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        let app = if attribute { with_profiling() } else { plain() };
        axum::serve(listener, app).await.unwrap();
    });
}
