//! The service for the heap figures (`krabka-pprof-bench` runs it): jemalloc as the global
//! allocator, heap profiling on, 64 MiB kept live from 16 call sites, and a route that
//! allocates on every request. `heap_server [--cpu N]`; prints `addr=...`.

#[path = "../system.rs"]
#[allow(dead_code)]
mod system;

use std::hint::black_box;
use std::sync::OnceLock;

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

#[pprof_routes(heap = true)]
fn app() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/alloc", get(allocating))
}

/// A request that allocates like a typical handler: a buffer, a string, a small map.
async fn allocating() -> String {
    let buffer = black_box(vec![7u8; 4096]);
    let mut text = String::with_capacity(64);
    for (i, byte) in buffer.iter().take(8).enumerate() {
        text.push_str(&format!("{i}:{byte} "));
    }
    let map: std::collections::HashMap<usize, String> = (0..4).map(|i| (i, text.clone())).collect();
    format!("{}\n", black_box(map).len())
}

macro_rules! call_sites {
    ($($name:ident),*) => {
        $(
            #[inline(never)]
            fn $name() -> Vec<Vec<u8>> {
                (0..512).map(|i| black_box(vec![i as u8; 8 * 1024])).collect()
            }
        )*
        fn keep_live() -> Vec<Vec<Vec<u8>>> {
            vec![$($name()),*]
        }
    };
}
call_sites!(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5
);

static LIVE: OnceLock<Vec<Vec<Vec<u8>>>> = OnceLock::new();

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(cpu) = args
        .iter()
        .position(|a| a == "--cpu")
        .and_then(|i| args.get(i + 1))
    {
        system::pin_to_cpu(cpu.parse().expect("--cpu N"));
    }
    LIVE.set(keep_live()).expect("set once");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        axum::serve(listener, app()).await.unwrap();
    });
}
