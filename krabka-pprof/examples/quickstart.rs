//! Serves a small app with profiling routes on 127.0.0.1:6060, profiles itself over HTTP,
//! prints the busiest functions and the `go tool pprof` commands to try, asks the
//! recorder for the last seconds (answered at once), then keeps serving until Ctrl-C.
//!
//! ```text
//! cargo run --example quickstart
//! QUICKSTART_ADDR=127.0.0.1:7070 cargo run --example quickstart
//! ```

use std::hint::black_box;
use std::io::Read as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use pprof::protos::Message as _;

#[pprof_routes(cpu_default = "10s", cpu_max = "60s", recent = "10m")]
fn app() -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { "hello from the krabka-pprof quickstart\n" }),
        )
        .route(
            "/primes",
            get(|| async { format!("{}\n", count_primes(200_000)) }),
        )
}

/// The app's "real work": what the profile should show at the top.
#[inline(never)]
fn count_primes(limit: u64) -> u64 {
    (2..limit)
        .filter(|&n| (2..).take_while(|d| d * d <= n).all(|d| n % d != 0))
        .count() as u64
}

/// Keeps one core about 40% busy with `count_primes`, like a service under load, for two
/// tenants: three quarters of it labelled `tenant=acme`, a quarter `tenant=globex`.
fn background_load() {
    std::thread::Builder::new()
        .name("quickstart-load".into())
        .spawn(|| {
            loop {
                for (tenant, millis) in [("acme", 30), ("globex", 10)] {
                    krabka_pprof::labels::scope(&[("tenant", tenant)], || {
                        let started = Instant::now();
                        while started.elapsed() < Duration::from_millis(millis) {
                            black_box(count_primes(black_box(20_000)));
                        }
                    });
                }
                std::thread::sleep(Duration::from_millis(60));
            }
        })
        .expect("spawn the load thread");
}

#[tokio::main]
async fn main() {
    let addr: SocketAddr = std::env::var("QUICKSTART_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:6060".to_owned())
        .parse()
        .expect("QUICKSTART_ADDR must be an address such as 127.0.0.1:6060");
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "cannot listen on {addr}: {err}\nset QUICKSTART_ADDR to a free address, e.g. QUICKSTART_ADDR=127.0.0.1:7070"
            );
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move { axum::serve(listener, app()).await });
    background_load();
    println!("serving http://{addr}/ with profiling routes under /debug/pprof");

    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let window = 5;
    let url = format!("http://{addr}/debug/pprof/profile?seconds={window}");
    println!("profiling this process for {window}s: GET {url}");
    for round in ["first", "second"] {
        let sent = Instant::now();
        let response = client.get(&url).send().await.expect("profile request");
        let status = response.status();
        let body = response.bytes().await.expect("profile body");
        let finished = sent.elapsed();
        if !status.is_success() {
            eprintln!("{status}: {}", String::from_utf8_lossy(&body));
            std::process::exit(1);
        }
        let after_window = finished.saturating_sub(Duration::from_secs(window));
        println!(
            "{round} profile: {} bytes of gzipped pprof, last byte {:.1} ms after the {window}s window closed",
            body.len(),
            after_window.as_secs_f64() * 1e3
        );
        if round == "first" {
            print_top(&body, 10);
            let path = std::env::temp_dir().join("krabka-quickstart-cpu.pb.gz");
            std::fs::write(&path, &body).expect("save the profile");
            println!("\nsaved to {}", path.display());
            println!("\nnext, with Go installed (Debian: apt-get install golang-go):");
            println!("  go tool pprof -top {}", path.display());
            println!(
                "  go tool pprof -tags {}    # the CPU per tenant",
                path.display()
            );
            println!("  go tool pprof -top {url}");
            println!("  go tool pprof -http=127.0.0.1:8080 {url}");
            println!("  curl '{url}&format=text&group=tenant'");
        }
    }
    // The recorder has sampled since the app started: the past needs no waiting.
    let recent = format!("http://{addr}/debug/pprof/recent?seconds=10");
    let sent = Instant::now();
    let response = client.get(&recent).send().await.expect("recent request");
    let status = response.status();
    let body = response.bytes().await.expect("recent body");
    println!(
        "\nthe last 10 s from the recorder (recent = \"10m\"): {status}, {} bytes in {:.1} ms",
        body.len(),
        sent.elapsed().as_secs_f64() * 1e3
    );
    println!("  go tool pprof -top {recent}");
    println!("  http://{addr}/debug/pprof/recent?seconds=60&format=svg");
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

/// Decodes the gzipped profile and prints its heaviest leaf functions.
fn print_top(gzipped: &[u8], rows: usize) {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut raw)
        .expect("the body is gzip");
    let profile = pprof::protos::Profile::decode(raw.as_slice()).expect("the body is pprof");
    let name = |id: u64| {
        let function = profile.function.iter().find(|f| f.id == id);
        function.map_or("?", |f| profile.string_table[f.name as usize].as_str())
    };
    let mut flat: Vec<(String, i64)> = Vec::new();
    let mut total = 0;
    for sample in &profile.sample {
        let count = sample.value[0];
        total += count;
        let leaf = sample
            .location_id
            .first()
            .and_then(|id| profile.location.iter().find(|l| l.id == *id))
            .and_then(|l| l.line.first())
            .map_or("?", |line| name(line.function_id));
        match flat.iter_mut().find(|(n, _)| n == leaf) {
            Some((_, c)) => *c += count,
            None => flat.push((leaf.to_owned(), count)),
        }
    }
    flat.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    println!("{total} samples; top functions by samples where they were running:");
    for (name, count) in flat.iter().take(rows) {
        println!(
            "  {:>6.2}%  {count:>5}  {name}",
            *count as f64 * 100.0 / total.max(1) as f64
        );
    }
}
