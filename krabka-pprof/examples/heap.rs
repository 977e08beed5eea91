//! Heap profiling with zero configuration: jemalloc as the global allocator and
//! `heap = true` are all it takes. Serves on 127.0.0.1:6061, prints its own heap profile's
//! top allocation sites, then keeps serving until Ctrl-C.
//!
//! ```text
//! cargo run --example heap --features heap-profiling
//! ```

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

#[pprof_routes(heap = true)]
fn app() -> Router {
    Router::new().route(
        "/",
        get(|| async { "hello from the krabka-pprof heap example\n" }),
    )
}

static CACHE: OnceLock<(Vec<Vec<u8>>, Vec<String>)> = OnceLock::new();

/// The app's "real memory": 48 MiB of buffers and 200 000 small strings.
#[inline(never)]
fn fill_buffer_cache() -> Vec<Vec<u8>> {
    (0..192)
        .map(|i| black_box(vec![i as u8; 256 * 1024]))
        .collect()
}

#[inline(never)]
fn fill_name_index() -> Vec<String> {
    (0..200_000).map(|i| format!("customer-{i:08}")).collect()
}

#[tokio::main]
async fn main() {
    CACHE.get_or_init(|| (fill_buffer_cache(), fill_name_index()));
    let addr: SocketAddr = std::env::var("HEAP_EXAMPLE_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:6061".to_owned())
        .parse()
        .expect("HEAP_EXAMPLE_ADDR must be an address such as 127.0.0.1:6061");
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("cannot listen on {addr}: {err}\nset HEAP_EXAMPLE_ADDR to a free address");
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move { axum::serve(listener, app()).await });

    let url = format!("http://{addr}/debug/pprof/heap");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let text = client
        .get(format!("{url}?format=text"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("the heap profile");
    println!("GET {url}?format=text\n");
    for line in text.text().await.expect("a text body").lines().take(12) {
        println!("  {line}");
    }
    println!("\nviews of the same profile:");
    println!("  go tool pprof -top {url}");
    println!("  go tool pprof -http=127.0.0.1:8080 {url}");
    println!("  http://{addr}/debug/pprof/heap?format=svg   (a flamegraph, in a browser)");
    println!("\nstill serving on http://{addr}/ (Ctrl-C to stop)");
    tokio::select! {
        result = server => {
            if let Ok(Err(err)) = result {
                eprintln!("server error: {err}");
            }
        }
        _ = tokio::signal::ctrl_c() => println!("bye"),
    }
}
