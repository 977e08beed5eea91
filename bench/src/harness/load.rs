//! The load generator: closed-loop HTTP/1.1 keep-alive clients on blocking sockets, one
//! thread per connection, bounded by time. Runs as its own process (`bench load`), pinned
//! to its own core, so its cost never lands on the server's core.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one load run measured.
pub struct LoadResult {
    pub requests: u64,
    pub elapsed: Duration,
    /// `(start offset, latency)` of every request, when asked for.
    pub latencies: Vec<(Duration, Duration)>,
}

/// Sends `GET path` on `connections` keep-alive connections for `duration`.
pub fn run(
    addr: SocketAddr,
    path: &str,
    connections: usize,
    duration: Duration,
    record: bool,
) -> LoadResult {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes();
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let stop = stop.clone();
            let request = request.clone();
            std::thread::spawn(move || {
                let mut stream = connect(addr);
                let mut buf = vec![0u8; 64 * 1024];
                let mut count = 0u64;
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    stream.write_all(&request).expect("send a request");
                    read_response(&mut stream, &mut buf);
                    count += 1;
                    if record {
                        latencies.push((sent - started, sent.elapsed()));
                    }
                }
                (count, latencies)
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut result = LoadResult {
        requests: 0,
        elapsed,
        latencies: Vec::new(),
    };
    for worker in workers {
        let (count, latencies) = worker.join().expect("a load worker");
        result.requests += count;
        result.latencies.extend(latencies);
    }
    result.latencies.sort_by_key(|(at, _)| *at);
    result
}

/// A keep-alive connection as every load worker uses it.
fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to the server");
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Reads one response with a `content-length` body.
fn read_response(stream: &mut TcpStream, buf: &mut [u8]) {
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buf[filled..]).expect("read a response");
        assert!(n > 0, "the server closed the connection");
        filled += n;
        if let Some(end) = find(&buf[..filled], b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).expect("ASCII headers");
            assert!(
                head.starts_with("HTTP/1.1 200"),
                "unexpected response: {head}"
            );
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content-length");
            let total = end + 4 + length;
            while filled < total {
                let n = stream.read(&mut buf[filled..]).expect("read the body");
                assert!(n > 0, "the server closed the connection mid-body");
                filled += n;
            }
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Alternates the load between `a` and `b` in windows of `window`: `connections`
/// keep-alive connections to each, and only one side sends at a time. Returns requests
/// completed per `(a, b)` window pair, each request counted in the window it was sent in.
/// One process and persistent connections make the windows short and the pairs many,
/// which is what lets a ratio of a few tenths of a percent show through a noisy machine.
pub fn run_alternating(
    a: SocketAddr,
    b: SocketAddr,
    path: &str,
    connections: usize,
    window: Duration,
    pairs: usize,
) -> Vec<(u64, u64)> {
    let windows = pairs * 2;
    let started = Instant::now();
    let end = window * windows as u32;
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..windows).map(|_| AtomicU64::new(0)).collect());
    let workers: Vec<_> = [(a, 0usize), (b, 1usize)]
        .into_iter()
        .flat_map(|(addr, side)| (0..connections).map(move |_| (addr, side)))
        .map(|(addr, side)| {
            let counts = counts.clone();
            let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes();
            std::thread::spawn(move || {
                let mut stream = connect(addr);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let elapsed = started.elapsed();
                    if elapsed >= end {
                        break;
                    }
                    let index = (elapsed.as_nanos() / window.as_nanos()) as usize;
                    // Pair i is windows 2i and 2i+1; the side that goes first alternates
                    // between pairs so neither always follows the other.
                    let pair = index / 2;
                    let first = if pair.is_multiple_of(2) { 0 } else { 1 };
                    let active = if index.is_multiple_of(2) {
                        first
                    } else {
                        1 - first
                    };
                    if active != side {
                        let next = window * (index as u32 + 1);
                        std::thread::sleep(
                            next.saturating_sub(elapsed).min(Duration::from_millis(1)),
                        );
                        continue;
                    }
                    stream.write_all(&request).expect("send a request");
                    read_response(&mut stream, &mut buf);
                    counts[index].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a load worker");
    }
    (0..pairs)
        .map(|pair| {
            let (w0, w1) = (
                counts[2 * pair].load(Ordering::Relaxed),
                counts[2 * pair + 1].load(Ordering::Relaxed),
            );
            if pair % 2 == 0 { (w0, w1) } else { (w1, w0) }
        })
        .collect()
}
