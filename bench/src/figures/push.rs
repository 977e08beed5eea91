//! P: what the pusher (`push = true`, 15 s windows, beside `recent = "10m"` at 99 Hz)
//! costs the service it watches, and how soon its windows arrive. The service's busy
//! thread cycles through 4,000 distinct stacks (so each window holds thousands of
//! samples to encode), and pushes to both an OTLP and a Pyroscope receiver that the
//! benchmark serves on loopback, answering 200 at once. Measured: the `krabka-push`
//! thread's CPU per window (building each window's profile from the recorder,
//! symbolizing, encoding both wires, gzip, sending) by the kernel's clock
//! (`/proc/<pid>/task/*/schedstat`) and its share of a core; resident memory against
//! the same service with the recorder alone, scraped instead (`/recent` each window); from a window's end to its arrival at the
//! receiver (median and most); the bytes sent per hour.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::Options;
use crate::figures::recorder::thread_cpu;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Server, fetch};
use crate::stats::median;
use crate::system;

/// The pusher's window, the attribute's default.
const INTERVAL: Duration = Duration::from_secs(15);
/// The distinct stacks the service's busy thread cycles through.
const STACKS: u64 = 4_000;

/// One request the receiver took.
struct Arrival {
    at: SystemTime,
    bytes: usize,
}

pub fn push(options: &Options) -> Vec<Row> {
    // Quick: two windows, enough to see every part run.
    let windows = if options.quick { 2 } else { 8 };
    let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
    let receiver = serve_receiver(arrivals.clone());
    let url = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
        ("PYROSCOPE_SERVER_ADDRESS", url.as_str()),
        ("OTEL_SERVICE_NAME", "bench"),
    ];
    let pushing = Server::start_pushing(STACKS, &env);
    let recording = Server::start_recording(Some(STACKS));
    // The first window is partial (the process started in it): measured from the start
    // of the second on, by the wall clock's windows.
    let first = next_window_end(SystemTime::now());
    sleep_until(first);
    let cpu_from = thread_cpu(pushing.pid(), "krabka-push").unwrap_or_default();
    let measured_from = Instant::now();
    let end = first + INTERVAL * windows;
    // The service it is compared with is scraped instead: `/recent` asked for each
    // window, as a scraper of the recorder asks, so that both have symbolized their
    // stacks (about 1 MB of symbol tables, loaded by the first profile either way).
    for window in 1..=windows {
        sleep_until(first + INTERVAL * window + Duration::from_secs(1));
        let scraped = fetch(recording.addr, "/debug/pprof/recent?seconds=15");
        assert_eq!(scraped.status, 200, "the recorder answers");
    }
    sleep_until(end + Duration::from_secs(6));
    let cpu = thread_cpu(pushing.pid(), "krabka-push")
        .unwrap_or_default()
        .saturating_sub(cpu_from);
    let elapsed = measured_from.elapsed();
    let rss_pushing = system::rss(pushing.pid()) as f64;
    let rss_recording = system::rss(recording.pid()) as f64;
    let arrivals = arrivals.lock().unwrap();
    // Windows that ended within [first, end]: each a request per destination.
    let counted: Vec<&Arrival> = arrivals
        .iter()
        .filter(|a| a.at > first && a.at < end + Duration::from_secs(6))
        .collect();
    let delays: Vec<f64> = counted
        .iter()
        .map(|a| since_window_end(a.at).as_secs_f64())
        .collect();
    let bytes: usize = counted.iter().map(|a| a.bytes).sum();
    let per_window_ms = cpu.as_secs_f64() * 1e3 / f64::from(windows);
    let share = cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0;
    // No arrival at all is a miss of every figure below, not a panic.
    let (delay_median, delay_most) = if delays.is_empty() {
        (f64::INFINITY, f64::INFINITY)
    } else {
        (
            median(delays.clone()),
            delays.iter().copied().fold(0.0f64, f64::max),
        )
    };
    let per_hour = bytes as f64 * 3600.0 / (INTERVAL * windows).as_secs_f64();
    vec![
        Row {
            id: "P",
            figure: format!(
                "the pusher's CPU per 15 s window, {STACKS} distinct stacks, OTLP and \
                 Pyroscope both ({} windows, {} requests)",
                windows,
                counted.len()
            ),
            target: "≤ 15 ms",
            measured: format!("{per_window_ms:.1} ms"),
            verdict: Verdict::at_most(per_window_ms, 15.0),
        },
        Row {
            id: "P",
            figure: "the pusher's share of a core".to_owned(),
            target: "≤ 0.1 %",
            measured: format!("{share:.3} %"),
            verdict: Verdict::at_most(share, 0.1),
        },
        Row {
            id: "P",
            figure: "resident memory, pushing − the same service scraped (`/recent` each \
                     window) instead"
                .to_owned(),
            target: "≤ +1 MB",
            measured: format!("{:+.2} MB", (rss_pushing - rss_recording) / MB),
            verdict: Verdict::at_most((rss_pushing - rss_recording) / MB, 1.0),
        },
        Row {
            id: "P",
            figure: "a window's end → its arrival at the receiver: median (most)".to_owned(),
            target: "most ≤ 5.25 s (spread ≤ 4.25 s + 1 s)",
            measured: format!("{delay_median:.2} s ({delay_most:.2} s)"),
            verdict: Verdict::at_most(delay_most, 5.25),
        },
        Row {
            id: "P",
            figure: "bytes sent per hour, gzipped, both destinations".to_owned(),
            target: "—",
            measured: format!("{:.1} MB", per_hour / MB),
            verdict: Verdict::NoTarget,
        },
    ]
}

/// Serves both receivers on loopback (on a thread with a runtime of its own), answering
/// 200 at once and noting each request's arrival and size.
fn serve_receiver(arrivals: Arc<Mutex<Vec<Arrival>>>) -> SocketAddr {
    use axum::routing::post;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a receiver's port");
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let take = move |body: axum::body::Bytes| {
                let arrivals = arrivals.clone();
                async move {
                    arrivals.lock().unwrap().push(Arrival {
                        at: SystemTime::now(),
                        bytes: body.len(),
                    });
                    "{}"
                }
            };
            let app = axum::Router::new()
                .route("/v1development/profiles", post(take.clone()))
                .route("/push.v1.PusherService/Push", post(take));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = axum::serve(listener, app).await;
        });
    });
    addr
}

/// The end of the window `at` falls in.
fn next_window_end(at: SystemTime) -> SystemTime {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let windows = since.as_secs() / INTERVAL.as_secs() + 1;
    SystemTime::UNIX_EPOCH + INTERVAL * windows as u32
}

/// How long after the end of the window before it `at` is.
fn since_window_end(at: SystemTime) -> Duration {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    Duration::from_nanos((since.as_nanos() % INTERVAL.as_nanos()) as u64)
}

fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
}
