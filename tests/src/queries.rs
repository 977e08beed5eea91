//! Arbitrary query strings for the routes' property tests, and what the HTTP contract
//! (`krabka-pprof/docs/http.md`) says of each: accepted, or refused with a 400.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

/// The parameters the routes read, and some they ignore (Go's `debug` and `gc`).
const KEYS: &[&str] = &[
    "seconds",
    "frequency",
    "format",
    "force",
    "symbolize",
    "lines",
    "sample_index",
    "deadline",
    "debug",
    "gc",
];

/// Values that sit on the contract's edges.
const VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "30",
    "59",
    "60",
    "61",
    "999",
    "1000",
    "1001",
    "-1",
    "+1",
    "1.5",
    " 1",
    "1e3",
    "0x10",
    "007",
    "true",
    "false",
    "TRUE",
    "svg",
    "text",
    "pprof",
    "proto",
    "top",
    "flamegraph",
    "SVG",
    "none",
    "full",
    "None",
    "alloc_space",
    "inuse_objects",
    "cpu",
    "\u{663}",
    "١٢",
    "2",
    "1ms",
    "0ms",
    "250ms",
    "10s",
    "11s",
    "1h",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
];

/// Raw pieces that are not well-formed pairs: stray separators, broken escapes, bytes
/// that decode to invalid UTF-8.
const RAW: &[&str] = &[
    "&", "&&", "=", "==", ";", "+", "%", "%zz", "%FF", "%C3%28", "%00",
];

/// Percent-encodes everything but unreserved characters, so the request line stays valid
/// HTTP whatever the text.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn piece() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z]{1,8}",
        1 => any::<String>(),
    ];
    let value = prop_oneof![
        3 => proptest::sample::select(VALUES).prop_map(str::to_owned),
        2 => any::<u64>().prop_map(|n| n.to_string()),
        1 => (0u32..2000).prop_map(|n| n.to_string()),
        1 => any::<String>(),
    ];
    prop_oneof![
        6 => (key.clone(), value).prop_map(|(k, v)| format!("{}={}", encode(&k), encode(&v))),
        1 => key.prop_map(|k| encode(&k)),
        1 => proptest::sample::select(RAW).prop_map(str::to_owned),
    ]
}

/// A query string of up to six pieces joined by `&`, as it goes on the request line.
pub fn query() -> impl Strategy<Value = String> {
    proptest::collection::vec(piece(), 0..6).prop_map(|pieces| pieces.join("&"))
}

/// The pairs a server decodes from `query` (`application/x-www-form-urlencoded`, invalid
/// UTF-8 replaced), in order.
pub fn decoded(query: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://127.0.0.1/?{query}"))
        .expect("a URL")
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Which route's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/profile`: `seconds`, `frequency`, `format`, `force`, `symbolize`, `lines`.
    Cpu,
    /// `/heap`, `/allocs`: the same, but `frequency` and `force` are not checked, and
    /// `sample_index` is.
    Heap,
    /// `/threads`, `/goroutine`: `debug`, `format`, `deadline`, `symbolize`, `lines`.
    Threads,
}

/// Whether the HTTP contract accepts `query` on `route`: each parameter the route reads
/// given at most once; `seconds` a whole number of digits that fits 64 bits; `frequency`
/// 1 to 1000; `format` one of the views this build has; `force` and `lines` true, false,
/// 1 or 0; `symbolize` full or none; `symbolize=none` only with the pprof format, and
/// `lines` true only with the text format; on the heap routes, `sample_index` one of Go's
/// four heap types; on the thread routes, `debug` 0, 1 or 2 (1 and 2 with none of
/// `format`, `symbolize` and `lines`) and `deadline` a duration from 1 ms to 10 s. Others
/// are ignored.
pub fn contract_accepts(query: &str, route: Route) -> bool {
    let read: &[&str] = match route {
        Route::Threads => &["debug", "format", "deadline", "symbolize", "lines"],
        Route::Cpu => &[
            "seconds",
            "frequency",
            "format",
            "force",
            "symbolize",
            "lines",
        ],
        Route::Heap => &[
            "seconds",
            "frequency",
            "format",
            "force",
            "symbolize",
            "lines",
            "sample_index",
        ],
    };
    let pairs = decoded(query);
    let value_of = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    if route == Route::Threads
        && matches!(value_of("debug"), Some("1" | "2"))
        && ["format", "symbolize", "lines"]
            .iter()
            .any(|key| value_of(key).is_some())
    {
        return false;
    }
    let format = value_of("format").unwrap_or("pprof");
    if value_of("symbolize") == Some("none") && !matches!(format, "pprof" | "proto") {
        return false;
    }
    if matches!(value_of("lines"), Some("true" | "1")) && !matches!(format, "text" | "top") {
        return false;
    }
    for key in read {
        let values: Vec<&str> = pairs
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect();
        let Some(&value) = values.first() else {
            continue;
        };
        if values.len() > 1 {
            return false;
        }
        let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        let ok = match *key {
            "seconds" => digits && value.parse::<u64>().is_ok(),
            "frequency" => {
                route == Route::Heap
                    || (digits
                        && value
                            .parse::<u64>()
                            .is_ok_and(|hz| (1..=1000).contains(&hz)))
            }
            "format" => {
                matches!(value, "pprof" | "proto" | "text" | "top")
                    || (cfg!(feature = "flamegraph") && matches!(value, "svg" | "flamegraph"))
            }
            "force" => route == Route::Heap || matches!(value, "true" | "false" | "1" | "0"),
            "lines" => matches!(value, "true" | "false" | "1" | "0"),
            "symbolize" => matches!(value, "full" | "none"),
            "debug" => matches!(value, "0" | "1" | "2"),
            "deadline" => humantime::parse_duration(value).is_ok_and(|deadline| {
                (Duration::from_millis(1)..=Duration::from_secs(10)).contains(&deadline)
            }),
            "sample_index" => matches!(
                value,
                "alloc_objects" | "alloc_space" | "inuse_objects" | "inuse_space"
            ),
            _ => unreachable!(),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether `query` asks a CPU profile to stop the running one.
pub fn forces(query: &str) -> bool {
    decoded(query)
        .iter()
        .any(|(k, v)| k == "force" && matches!(v.as_str(), "true" | "1"))
}

/// One answer of a route: status, headers (lowercased names) and body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A refusal in Go's error format: `X-Go-Pprof: 1` and a sentence ending in a newline.
    pub fn is_a_sentence(&self) -> bool {
        let text = self.text();
        self.headers
            .iter()
            .any(|(k, v)| k == "x-go-pprof" && v == "1")
            && text.len() > 20
            && text.ends_with('\n')
    }
}

/// Sends `cases` of `queries` to `GET {path}?{query}` on `addr` (raw HTTP, so the request
/// line is exactly what was drawn), and checks each answer with `check`, which says whether
/// the query was accepted. Both answers must come at least 40 times in 256 (5 in 32), or
/// the strategy has gone lopsided and proves little.
pub fn check_routes_answers(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    path: &str,
    queries: impl Strategy<Value = String>,
    cases: u32,
    check: impl Fn(&str, &Answer) -> Result<bool, TestCaseError>,
) {
    let counts = [AtomicUsize::new(0), AtomicUsize::new(0)];
    TestRunner::new(ProptestConfig::with_cases(cases))
        .run(&queries, |query| {
            let request =
                format!("GET {path}?{query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let (status, headers, body) = runtime.block_on(crate::raw_request(addr, &request));
            let accepted = check(
                &query,
                &Answer {
                    status,
                    headers,
                    body,
                },
            )?;
            counts[usize::from(accepted)].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
    let [refused, accepted] = counts.map(AtomicUsize::into_inner);
    let least = cases as usize * 5 / 32;
    assert!(
        accepted >= least && refused >= least,
        "{accepted} accepted and {refused} refused of {cases}"
    );
}
