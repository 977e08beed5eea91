//! The service for the heap figures (`krabka-pprof-bench` runs it): jemalloc as the global
//! allocator, heap profiling on, 64 MiB kept live from 16 call sites, a route that
//! allocates on every request (`/alloc`), and one that allocates 16–20 KiB along one of
//! 1,000 distinct stacks (`/stacks`), the stack picked by a hash of the request's number
//! (stacks in lockstep would meet jemalloc's per-thread sampling sequence in lockstep).
//! `heap_server [--cpu N] [--no-counts]`: `--no-counts` serves routes built with
//! `alloc_stacks = 0`; prints `addr=...`.

#[path = "../system.rs"]
#[allow(dead_code)]
mod system;

use std::hint::black_box;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

#[pprof_routes(heap = true)]
fn app() -> Router {
    routes()
}

#[pprof_routes(heap = true, alloc_stacks = 0)]
fn app_without_counts() -> Router {
    routes()
}

fn routes() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/alloc", get(allocating))
        .route(
            "/stacks",
            get(|| async { format!("{}\n", along_a_stack()) }),
        )
}

/// Requests served by `/stacks`.
static STACK_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// One of 1,000 stacks, `top::<I>` → `mid::<J>` → `leaf::<K>`, by a hash of the request's
/// number; returns the capacity allocated.
fn along_a_stack() -> usize {
    let n = STACK_REQUESTS.fetch_add(1, Ordering::Relaxed);
    let stack = (splitmix(n) % 1000) as usize;
    let (i, j, k) = (stack / 100, stack / 10 % 10, stack % 10);
    dispatch!(top, i, j, k)
}

fn splitmix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Calls `$f::<N>($args)` for the `N` (0..10) that `$x` names.
macro_rules! dispatch {
    ($f:ident, $x:expr, $($args:expr),*) => {
        match $x {
            0 => $f::<0>($($args),*), 1 => $f::<1>($($args),*), 2 => $f::<2>($($args),*),
            3 => $f::<3>($($args),*), 4 => $f::<4>($($args),*), 5 => $f::<5>($($args),*),
            6 => $f::<6>($($args),*), 7 => $f::<7>($($args),*), 8 => $f::<8>($($args),*),
            _ => $f::<9>($($args),*),
        }
    };
}
use dispatch;

// Each level adds its constant after the call (so no tail call) through `black_box` (so
// no two instances fold into one).
#[inline(never)]
fn leaf<const K: usize>() -> usize {
    let buffer: Vec<u8> = Vec::with_capacity(16 * 1024 + 400 * K);
    black_box(&buffer);
    buffer.capacity()
}

#[inline(never)]
fn mid<const J: usize>(k: usize) -> usize {
    dispatch!(leaf, k,) + black_box(J)
}

#[inline(never)]
fn top<const I: usize>(j: usize, k: usize) -> usize {
    dispatch!(mid, j, k) + black_box(I)
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
    // The routes first: building them starts the allocation counts.
    let app = if args.iter().any(|a| a == "--no-counts") {
        app_without_counts()
    } else {
        app()
    };
    LIVE.set(keep_live()).expect("set once");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
