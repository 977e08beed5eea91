//! A separate process for tests that need a fresh environment at startup: it reports
//! jemalloc's configuration (`test_child config`), or serves on 127.0.0.1 until its stdin
//! closes an app with heap profiling (`test_child serve`) or one whose routes need the
//! bearer token in `KRABKA_PPROF_TEST_TOKEN` (`test_child serve-token`).

use std::io::Read as _;
use std::time::Duration;

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

#[pprof_routes(heap = true, heap_default = "2s", heap_max = "5s")]
fn app() -> Router {
    Router::new().route("/", get(|| async { "child" }))
}

#[pprof_routes(token_env = "KRABKA_PPROF_TEST_TOKEN", cpu_max = "10s", heap = true)]
fn token_app() -> Router {
    Router::new().route("/", get(|| async { "child" }))
}

fn serve(router: Router) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        // Exit when the test drops its end of stdin (or after a bound).
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
        });
        let _ = tokio::time::timeout(Duration::from_secs(120), stdin_closed).await;
    });
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("config") => {
            // One allocation so that jemalloc has initialised and read its configuration.
            std::hint::black_box(vec![1u8; 4096]);
            // SAFETY: documented jemalloc controls of these types.
            let (prof, active, lg_sample) = unsafe {
                (
                    tikv_jemalloc_ctl::raw::read::<bool>(b"opt.prof\0"),
                    tikv_jemalloc_ctl::raw::read::<bool>(b"prof.active\0"),
                    tikv_jemalloc_ctl::raw::read::<usize>(b"prof.lg_sample\0"),
                )
            };
            println!(
                "opt.prof={} prof.active={} prof.lg_sample={}",
                prof.map_or("error".into(), |v| v.to_string()),
                active.map_or("error".into(), |v| v.to_string()),
                lg_sample.map_or("error".into(), |v| v.to_string()),
            );
        }
        Some("serve") => serve(app()),
        Some("serve-token") => serve(token_app()),
        _ => {
            eprintln!("usage: test_child config|serve|serve-token");
            std::process::exit(2);
        }
    }
}
