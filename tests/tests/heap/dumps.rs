//! `/heap` and `/allocs`: a function that keeps 64 MiB alive is found, with that much
//! memory, as the first frame of its stacks; `go tool pprof` reads the same bytes; what
//! the heap routes' queries accept; a client that hangs up closes its window of
//! allocations.

use std::hint::black_box;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::queries::{self, Route};
use krabka_pprof_tests::{
    TestServer, assert_head_like_get, assert_valid_xml, client, column, decode, go_pprof_each,
    sample_types, serial, stacks, string,
};
use reqwest::StatusCode;

#[pprof_routes(heap = true)]
fn app() -> Router {
    Router::new()
}

const MIB: f64 = 1024.0 * 1024.0;

/// 256 blocks of 256 KiB: jemalloc samples each with probability 1 - e^(-1/2), so about
/// 100 samples carry the estimate, a standard error near 8%. It starts two lines below
/// [`KEEP_64_MIB_LINE`] and ends five lines below it.
const KEEP_64_MIB_LINE: i64 = line!() as i64;
#[inline(never)]
fn keep_64_mib() -> Vec<Vec<u8>> {
    (0..256)
        .map(|i| black_box(vec![i as u8; 256 * 1024]))
        .collect()
}

/// Bytes in use attributed to stacks whose first frame is `name`, and all first frames
/// seen.
fn attributed(profile: &krabka_pprof_tests::Profile, name: &str) -> (f64, Vec<String>) {
    let inuse = column(profile, "inuse_space");
    let mut leaves = Vec::new();
    let mut bytes = 0.0;
    for (frames, values) in stacks(profile) {
        let leaf = frames.first().cloned().unwrap_or_default();
        if leaf.contains(name) {
            bytes += values[inuse] as f64;
        }
        leaves.push(leaf);
    }
    (bytes, leaves)
}

#[tokio::test]
async fn heap_shows_the_function_keeping_64_mib_as_its_first_frame() {
    let _serial = serial().await;
    let kept = keep_64_mib();
    let server = TestServer::start(app);
    let response = client()
        .get(server.url("/debug/pprof/heap"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"heap\""
    );
    let body = response.bytes().await.unwrap();
    let profile = decode(&body);
    assert_eq!(
        sample_types(&profile),
        [
            ("alloc_objects".into(), "count".into()),
            ("alloc_space".into(), "bytes".into()),
            ("inuse_objects".into(), "count".into()),
            ("inuse_space".into(), "bytes".into())
        ]
    );
    assert_eq!(string(&profile, profile.default_sample_type), "inuse_space");
    let period = profile.period_type.as_ref().unwrap();
    assert_eq!(
        (string(&profile, period.ty), string(&profile, period.unit)),
        ("space", "bytes")
    );
    assert_eq!(profile.period, 1 << 19);

    let (bytes, leaves) = attributed(&profile, "keep_64_mib");
    assert!(
        (bytes / MIB - 64.0).abs() <= 64.0 * 0.3,
        "keep_64_mib holds 64 MiB; the profile says {:.1} MiB",
        bytes / MIB
    );

    for leaf in &leaves {
        for allocator in [
            "prof_backtrace",
            "_rjem_",
            "malloc",
            "__rust_alloc",
            "alloc::raw_vec",
        ] {
            assert!(
                !leaf.starts_with(allocator),
                "stacks must start at the allocation site, one starts at {leaf}"
            );
        }
    }

    for (reader, top) in go_pprof_each(&["-top", "-nodecount=1000"], &body) {
        assert!(top.contains("keep_64_mib"), "{reader:?} -top:\n{top}");
    }

    // The allocation site has its file and line (this test binary has line tables).
    let sites: Vec<(String, i64, i64)> = profile
        .location
        .iter()
        .flat_map(|location| &location.line)
        .filter_map(|line| {
            let function = profile.function.iter().find(|f| f.id == line.function_id)?;
            string(&profile, function.name)
                .ends_with("keep_64_mib")
                .then(|| {
                    let file = string(&profile, function.filename).to_owned();
                    (file, function.start_line, line.line)
                })
        })
        .collect();
    assert!(!sites.is_empty(), "no line of keep_64_mib");
    for (file, start_line, line) in &sites {
        assert!(file.ends_with("tests/tests/heap/dumps.rs"), "{sites:?}");
        assert_eq!(*start_line, KEEP_64_MIB_LINE + 2, "{sites:?}");
        assert!(
            (KEEP_64_MIB_LINE + 2..=KEEP_64_MIB_LINE + 6).contains(line),
            "{sites:?}"
        );
    }
    drop(black_box(kept));
}

#[tokio::test]
async fn allocs_is_the_same_profile_for_scrapers() {
    let _serial = serial().await;
    let kept = keep_64_mib();
    let server = TestServer::start(app);
    let http = client();
    let response = http
        .get(server.url("/debug/pprof/allocs"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    let profile = decode(&response.bytes().await.unwrap());
    let (bytes, _) = attributed(&profile, "keep_64_mib");
    assert!(
        (bytes / MIB - 64.0).abs() <= 64.0 * 0.3,
        "{:.1} MiB",
        bytes / MIB
    );

    let text = http
        .get(server.url("/debug/pprof/heap?format=text"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("Type: inuse_space\n"), "{text}");
    assert!(text.contains("keep_64_mib"), "{text}");

    let svg = http
        .get(server.url("/debug/pprof/heap?format=svg"))
        .send()
        .await
        .unwrap();
    assert_eq!(svg.headers()["content-type"], "image/svg+xml");
    let svg = svg.text().await.unwrap();
    assert_valid_xml(&svg);
    assert!(
        svg.contains("keep_64_mib") && svg.contains("bytes"),
        "heap flamegraph"
    );
    drop(black_box(kept));
}

#[tokio::test]
async fn bad_seconds_are_400_even_when_sampling_is_active() {
    let server = TestServer::start(app);
    let response = client()
        .get(server.url("/debug/pprof/heap?seconds=ten"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()["x-go-pprof"], "1");
    assert!(response.text().await.unwrap().contains("above 30 means 30"));
}

/// `HEAD` on the heap routes: what `GET` answers, without the body.
#[tokio::test]
async fn head_answers_the_heap_routes_like_get_without_a_body() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    for path in [
        "/debug/pprof/heap",
        "/debug/pprof/allocs",
        "/debug/pprof/heap?format=text",
        #[cfg(feature = "flamegraph")]
        "/debug/pprof/heap?format=svg",
    ] {
        assert_eq!(
            assert_head_like_get(&server.url(path)).await,
            StatusCode::OK,
            "{path}"
        );
    }
    assert_eq!(
        assert_head_like_get(&server.url("/debug/pprof/heap?seconds=x")).await,
        StatusCode::BAD_REQUEST
    );
}

/// Any query string on `/heap`: what the contract accepts gets a profile, everything else
/// a 400 with a sentence, never a 5xx. Sampling is active, so an accepted `seconds` would
/// wait out a window of allocations (`windows_of_allocations…` below): those queries are
/// left out, and `seconds` is still drawn in the ones refused for another reason.
#[test]
fn any_query_on_the_heap_route_gets_the_contracts_answer() {
    use proptest::prelude::*;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _serial = runtime.block_on(serial());
    let server = TestServer::start(app);
    queries::check_routes_answers(
        &runtime,
        server.addr,
        "/debug/pprof/heap",
        queries::query().prop_filter("an accepted seconds waits out a window", |query| {
            !(queries::contract_accepts(query, Route::Heap)
                && queries::decoded(query).iter().any(|(k, _)| k == "seconds"))
        }),
        256,
        |query, answer| {
            let accepted = queries::contract_accepts(query, Route::Heap);
            if !accepted {
                prop_assert_eq!(answer.status, 400, "{}: {}", query, answer.text());
                prop_assert!(answer.is_a_sentence(), "{:?}", answer.text());
                return Ok(false);
            }
            prop_assert_eq!(answer.status, 200, "{}: {}", query, answer.text());
            let content_type = answer
                .headers
                .iter()
                .find(|(k, _)| k == "content-type")
                .map_or("", |(_, v)| v.as_str());
            match content_type {
                "application/octet-stream" => drop(decode(&answer.body)),
                "image/svg+xml" => assert_valid_xml(&answer.text()),
                "text/plain; charset=utf-8" => prop_assert!(answer.text().contains("flat%")),
                other => prop_assert!(false, "{}: {}", query, other),
            }
            Ok(true)
        },
    );
}

#[pprof_routes(heap = true, heap_max = "30s")]
fn long_windows() -> Router {
    Router::new()
}

/// Eight windows of allocations at once, then 409 with `Retry-After` for a ninth; the
/// eight clients hang up, and their windows close at once (a window left open would hold
/// its place for its 30 s).
#[tokio::test]
async fn windows_of_allocations_are_eight_at_once_and_close_when_their_clients_hang_up() {
    use tokio::io::AsyncWriteExt as _;
    let _serial = serial().await;
    let server = TestServer::start(long_windows);
    let http = krabka_pprof_tests::unpooled_client();
    let open_raw = || async {
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let request = format!(
            "GET /debug/pprof/allocs?seconds=30 HTTP/1.1\r\nHost: {}\r\n\r\n",
            server.addr
        );
        raw.write_all(request.as_bytes()).await.unwrap();
        raw
    };
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(open_raw().await);
    }
    // A probe of 1 s is refused once the eight hold their windows. One that comes first
    // gets a window of its own (over a second later), and a held request may then have
    // been refused: that one is sent again.
    let mut refused = None;
    for _ in 0..20 {
        let probe = http
            .get(server.url("/debug/pprof/allocs?seconds=1"))
            .send()
            .await
            .unwrap();
        if probe.status() == StatusCode::CONFLICT {
            refused = Some(probe);
            break;
        }
        assert_eq!(probe.status(), StatusCode::OK);
        for raw in &mut held {
            let mut answer = [0u8; 12];
            let read = tokio::time::timeout(
                std::time::Duration::from_millis(10),
                tokio::io::AsyncReadExt::read(raw, &mut answer),
            )
            .await;
            if let Ok(read) = read {
                assert!(answer.starts_with(b"HTTP/1.1 409"), "{read:?} {answer:?}");
                *raw = open_raw().await;
            }
        }
    }
    let refused = refused.expect("a ninth window is refused");
    assert_eq!(held.len(), 8);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");
    let text = refused.text().await.unwrap();
    assert!(text.contains("8 windows of allocations are open"), "{text}");
    drop(held);
    // Every window is let go as its client hangs up, long before their 30 s end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = http
            .get(server.url("/debug/pprof/allocs?seconds=1"))
            .send()
            .await
            .unwrap();
        if answer.status() == StatusCode::OK {
            let profile = decode(&answer.bytes().await.unwrap());
            assert!(
                profile.duration_nanos >= 1_000_000_000,
                "a window of its own"
            );
            break;
        }
        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert!(
            std::time::Instant::now() < deadline,
            "the windows of clients that hung up are still open"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
