//! CPU sampling and jemalloc sampling at the same time, under allocation load: 50 heap
//! dumps interleaved with 10 CPU profiles, none stuck, none failing, the process alive.

use std::time::Duration;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Burner, TestServer, client, decode, serial, total_in};
use reqwest::StatusCode;

#[pprof_routes(heap = true)]
fn app() -> Router {
    Router::new()
}

/// Allocates and frees blocks of varied sizes: every jemalloc sample takes a backtrace
/// while SIGPROF keeps arriving.
#[inline(never)]
fn churn() {
    let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(64);
    for i in 0..512usize {
        let size = 64 + (i * 7919) % (256 * 1024);
        blocks.push(std::hint::black_box(vec![i as u8; size]));
        if blocks.len() == 64 {
            blocks.clear();
        }
    }
}

#[tokio::test]
async fn fifty_heap_dumps_during_cpu_profiles_under_allocation_load() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    // Bounded by what the rounds' own timeouts allow (ten of 5 × 20 s and 20 s), not by a
    // minute: ten rounds took longer on a machine busy with two other loops, and the
    // last CPU profile found no allocating thread. Dropped at the end, they stop.
    let load = Burner::start_with(2, Duration::from_secs(1200), churn);
    let http = client();
    let mut dumps = 0;
    for round in 0..10 {
        let cpu = tokio::spawn({
            let (http, url) = (http.clone(), server.url("/debug/pprof/profile?seconds=1"));
            async move { http.get(url).send().await.unwrap() }
        });
        for _ in 0..5 {
            let heap = tokio::time::timeout(
                Duration::from_secs(20),
                http.get(server.url("/debug/pprof/heap")).send(),
            )
            .await
            .expect("a heap dump must not hang while the CPU is sampled")
            .unwrap();
            assert_eq!(heap.status(), StatusCode::OK, "round {round}");
            decode(&heap.bytes().await.unwrap());
            dumps += 1;
        }
        let cpu = tokio::time::timeout(Duration::from_secs(20), cpu)
            .await
            .expect("a CPU profile must not hang while the heap is sampled")
            .unwrap();
        assert_eq!(cpu.status(), StatusCode::OK, "round {round}");
        let profile = decode(&cpu.bytes().await.unwrap());
        assert!(
            total_in(&profile, 0, "churn") > 0,
            "round {round}: the CPU profile sees the allocating threads"
        );
    }
    drop(load);
    assert_eq!(dumps, 50);
}
