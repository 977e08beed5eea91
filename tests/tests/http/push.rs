//! `push = true`: a `test_child serve-push` process (one-second windows, a thread burning
//! CPU under the label `tenant=acme`) pushes to receivers this test serves on
//! 127.0.0.1: an OTLP profiles endpoint and Pyroscope's push API, each able to fail on
//! cue (an answer of the test's choosing, or no listener at all). What arrives is
//! decoded with decoders apart from the crate's: `opentelemetry-proto`'s messages for
//! OTLP, the `pprof` crate's for the profiles Pyroscope gets. Times are the test's and
//! the kernel's: when each request arrived, and the child's CPU clock from
//! `/proc/<pid>/stat`.

use std::collections::VecDeque;
use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::post;
use krabka_pprof_tests::{ChildServer, client};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::profiles::v1development::ProfilesData;
use prost::Message as _;

const EXE: &str = env!("CARGO_BIN_EXE_test_child");
const OTLP: &str = "/v1development/profiles";
const PYROSCOPE: &str = "/push.v1.PusherService/Push";

/// One request as it arrived.
#[derive(Clone)]
struct Arrival {
    path: String,
    at: SystemTime,
    headers: HeaderMap,
    /// Gunzipped.
    body: Vec<u8>,
    /// What it was answered.
    status: u16,
}

/// What the receiver answers the next requests, in order; then 200.
#[derive(Default)]
struct Receiving {
    arrivals: Mutex<Vec<Arrival>>,
    answers: Mutex<VecDeque<(u16, Option<&'static str>, &'static str)>>,
    arrived: tokio::sync::Notify,
}

/// The test's receiver, on 127.0.0.1.
struct Receiver {
    state: Arc<Receiving>,
    port: u16,
}

impl Receiver {
    /// Serves on `port` (0: any), answering the first requests with `answers` in order.
    async fn serve(port: u16, answers: &[(u16, Option<&'static str>, &'static str)]) -> Receiver {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Receiving::default());
        state.answers.lock().unwrap().extend(answers);
        let router = Router::new()
            .route(OTLP, post(receive))
            .route(PYROSCOPE, post(receive))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Receiver { state, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.state.arrivals.lock().unwrap().clone()
    }

    /// Waits (at most `limit`) until `done` holds of what arrived, and returns it.
    async fn wait_until(&self, limit: Duration, done: impl Fn(&[Arrival]) -> bool) -> Vec<Arrival> {
        let deadline = Instant::now() + limit;
        loop {
            let arrived = self.state.arrived.notified();
            let arrivals = self.arrivals();
            if done(&arrivals) {
                return arrivals;
            }
            assert!(
                Instant::now() < deadline,
                "not within {limit:?}; arrived: {:?}",
                arrivals
                    .iter()
                    .map(|a| (&a.path, a.status))
                    .collect::<Vec<_>>()
            );
            let _ = tokio::time::timeout(Duration::from_millis(500), arrived).await;
        }
    }
}

async fn receive(
    State(state): State<Arc<Receiving>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let gzipped = headers
        .get("content-encoding")
        .is_some_and(|value| value == "gzip");
    let body = if gzipped {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut plain)
            .expect("a gzipped body");
        plain
    } else {
        body.to_vec()
    };
    let (status, retry_after, sentence) = state
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((200, None, ""));
    state.arrivals.lock().unwrap().push(Arrival {
        path: uri.path().to_owned(),
        at: SystemTime::now(),
        headers,
        body,
        status,
    });
    state.arrived.notify_waiters();
    let mut answer_headers = HeaderMap::new();
    if let Some(seconds) = retry_after {
        answer_headers.insert("retry-after", seconds.parse().unwrap());
    }
    (
        StatusCode::from_u16(status).unwrap(),
        answer_headers,
        sentence,
    )
}

/// A `test_child serve-push` pushing OTLP alone to `endpoint`, as service `checkout`, with
/// `OTEL_RESOURCE_ATTRIBUTES` if given.
fn otlp_child(endpoint: &str, resource_attributes: Option<&str>) -> ChildServer {
    ChildServer::start_logged(
        EXE,
        "serve-push",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", Some(endpoint)),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", None),
            ("OTEL_SERVICE_NAME", Some("checkout")),
            ("OTEL_RESOURCE_ATTRIBUTES", resource_attributes),
            ("PYROSCOPE_SERVER_ADDRESS", None),
        ],
    )
}

/// The child's CPU time so far (user + system, all its threads, the dead ones too), by
/// the kernel's clock.
fn child_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // utime and stime are the stat line's 14th and 15th fields, in clock ticks.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / per_second)
}

/// The next whole second of the wall clock at least `after` from now.
fn whole_second_after(after: Duration) -> SystemTime {
    let at = SystemTime::now() + after;
    let since = at.duration_since(UNIX_EPOCH).unwrap();
    UNIX_EPOCH + Duration::from_secs(since.as_secs() + 1)
}

async fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

fn nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// An accepted OTLP export's CPU profile: its window's start, and its Σ `cpu/nanoseconds`.
fn otlp_window(data: &ProfilesData) -> (u64, i64) {
    let dictionary = data.dictionary.as_ref().unwrap();
    let profiles = &data.resource_profiles[0].scope_profiles[0].profiles;
    let cpu = profiles
        .iter()
        .find(|profile| {
            let ty = profile.sample_type.unwrap();
            dictionary.string_table[ty.type_strindex as usize] == "cpu"
        })
        .expect("a cpu/nanoseconds profile");
    let start = profiles[0].time_unix_nano;
    assert!(profiles.iter().all(|p| p.time_unix_nano == start));
    (start, cpu.samples.iter().map(|s| s.values[0]).sum())
}

/// The rules profcheck holds an OTLP body to (its `check.go`, rewritten from its list:
/// the tool itself is not served here): resources, scopes and profiles present, every
/// table's zero value first, every index in range, attribute keys once per list, link ids
/// of 16 and 8 bytes, one value per sample without timestamps, and (its
/// `-check-dupes`) no table entry twice.
fn assert_conforms(data: &ProfilesData) {
    let d = data.dictionary.as_ref().expect("a dictionary");
    assert!(!data.resource_profiles.is_empty());
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], Default::default());
    assert_eq!(d.location_table[0], Default::default());
    assert_eq!(d.function_table[0], Default::default());
    assert_eq!(d.stack_table[0], Default::default());
    // Its value absent, or present and empty (as the Collector writes it again).
    let zero = &d.attribute_table[0];
    assert_eq!((zero.key_strindex, zero.unit_strindex), (0, 0));
    assert!(
        zero.value
            .as_ref()
            .is_none_or(|value| value.value.is_none())
    );
    let in_range = |at: i32, len: usize, what: &str| {
        assert!((0..len as i32).contains(&at), "{what} index {at} of {len}");
    };
    let strings = d.string_table.len();
    let keys_once = |indices: &[i32], what: &str| {
        let mut keys: Vec<i32> = indices
            .iter()
            .map(|&at| {
                in_range(at, d.attribute_table.len(), what);
                d.attribute_table[at as usize].key_strindex
            })
            .collect();
        keys.sort_unstable();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "{what}: a key twice");
    };
    for (at, link) in d.link_table.iter().enumerate() {
        let lengths = (link.trace_id.len(), link.span_id.len());
        // The zero link may be empty (the Collector writes it so) or zero bytes.
        assert!(
            lengths == (16, 8) || (at == 0 && lengths == (0, 0)),
            "link {at}: {lengths:?}"
        );
    }
    for mapping in &d.mapping_table {
        in_range(mapping.filename_strindex, strings, "mapping filename");
        assert!(
            mapping.memory_start < mapping.memory_limit
                || (mapping.memory_start, mapping.memory_limit) == (0, 0)
        );
        keys_once(&mapping.attribute_indices, "mapping");
    }
    for location in &d.location_table {
        in_range(location.mapping_index, d.mapping_table.len(), "mapping");
        keys_once(&location.attribute_indices, "location");
        for line in &location.lines {
            in_range(line.function_index, d.function_table.len(), "function");
            assert!(line.line >= 0 && line.column >= 0);
        }
    }
    for function in &d.function_table {
        for at in [
            function.name_strindex,
            function.system_name_strindex,
            function.filename_strindex,
        ] {
            in_range(at, strings, "function string");
        }
        assert!(function.start_line >= 0);
    }
    for stack in &d.stack_table {
        for &at in &stack.location_indices {
            in_range(at, d.location_table.len(), "location");
        }
    }
    for attribute in &d.attribute_table {
        in_range(attribute.key_strindex, strings, "attribute key");
    }
    fn no_dupes<T: PartialEq + std::fmt::Debug>(table: &[T], what: &str) {
        for (at, entry) in table.iter().enumerate() {
            assert!(!table[..at].contains(entry), "{what}: {entry:?} twice");
        }
    }
    no_dupes(&d.string_table, "strings");
    no_dupes(&d.mapping_table, "mappings");
    no_dupes(&d.location_table, "locations");
    no_dupes(&d.function_table, "functions");
    no_dupes(&d.stack_table, "stacks");
    no_dupes(&d.attribute_table, "attributes");
    no_dupes(&d.link_table, "links");
    for resource in &data.resource_profiles {
        assert!(!resource.scope_profiles.is_empty());
        for scope in &resource.scope_profiles {
            assert!(!scope.profiles.is_empty());
            for profile in &scope.profiles {
                keys_once(&profile.attribute_indices, "profile");
                for sample in &profile.samples {
                    in_range(sample.stack_index, d.stack_table.len(), "stack");
                    in_range(sample.link_index, d.link_table.len(), "link");
                    keys_once(&sample.attribute_indices, "sample");
                    assert!(sample.timestamps_unix_nano.is_empty());
                    assert_eq!(sample.values.len(), 1);
                }
            }
        }
    }
}

/// The string attributes of an OTLP sample, as `(key, value)`.
fn sample_attributes(
    data: &ProfilesData,
    sample: &opentelemetry_proto::tonic::profiles::v1development::Sample,
) -> Vec<(String, String)> {
    let d = data.dictionary.as_ref().unwrap();
    sample
        .attribute_indices
        .iter()
        .map(|&at| {
            let attribute = &d.attribute_table[at as usize];
            let value = match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(text)) => text.clone(),
                other => format!("{other:?}"),
            };
            (
                d.string_table[attribute.key_strindex as usize].clone(),
                value,
            )
        })
        .collect()
}

/// Through an outage (no listener for the first seconds, then one answering 503 with
/// `Retry-After`), the windows arrive once each, contiguous, the missed ones sent oldest
/// first when the Collector is back; over six whole windows their Σ `cpu/nanoseconds` is
/// the child's CPU clock over the same span (±10 %); each body passes profcheck's rules
/// and carries the resource and labels configured; the index page says how it went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_windows_arrive_once_each_contiguous_across_an_outage_and_hold_the_cpu() {
    // A port nothing listens on yet: the Collector is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let child = otlp_child(
        &endpoint,
        Some("deployment.environment.name=test,team=perf"),
    );
    let started = SystemTime::now();
    // Down for three windows at least, then up, first answering "unavailable".
    tokio::time::sleep(Duration::from_secs(3)).await;
    let receiver =
        Receiver::serve(port, &[(503, Some("1"), "busy"), (503, None, "still busy")]).await;
    // Six whole windows after the outage, each judged by the child's CPU clock.
    let from = whole_second_after(Duration::from_millis(500));
    sleep_until(from).await;
    let cpu_from = child_cpu(child.pid());
    let to = from + Duration::from_secs(6);
    sleep_until(to).await;
    let cpu_to = child_cpu(child.pid());
    let arrivals = receiver
        .wait_until(Duration::from_secs(20), |arrivals| {
            arrivals.iter().any(|a| {
                a.status == 200
                    && otlp_window(&ProfilesData::decode(&*a.body).unwrap()).0
                        == nanos(to) - 1_000_000_000
            })
        })
        .await;
    let accepted: Vec<ProfilesData> = arrivals
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| ProfilesData::decode(&*a.body).expect("an OTLP profiles body"))
        .collect();
    assert!(arrivals.iter().all(|a| a.path == OTLP));
    assert!(arrivals.iter().all(|a| {
        a.headers
            .get("content-type")
            .is_some_and(|v| v == "application/x-protobuf")
    }));
    // The windows refused with 503 came again, and were taken once.
    let refused: Vec<u64> = arrivals
        .iter()
        .filter(|a| a.status == 503)
        .map(|a| otlp_window(&ProfilesData::decode(&*a.body).unwrap()).0)
        .collect();
    assert_eq!(refused.len(), 2, "both 503s were answered to a push");
    let starts: Vec<u64> = accepted.iter().map(|data| otlp_window(data).0).collect();
    for start in &refused {
        assert_eq!(
            starts.iter().filter(|s| *s == start).count(),
            1,
            "the window refused with 503 arrives once when taken"
        );
    }
    // Every window from the first sent to the last, once, in order: nothing missed while
    // the Collector was down, nothing twice.
    for pair in starts.windows(2) {
        assert_eq!(pair[1], pair[0] + 1_000_000_000, "windows {starts:?}");
    }
    assert!(
        starts[0] <= nanos(started) + 2_000_000_000,
        "the windows of the outage were sent once it ended: the first is {} s after the \
         child started",
        (starts[0] as f64 - nanos(started) as f64) / 1e9
    );
    // Σ cpu/nanoseconds over [from, to) against the child's CPU clock over it.
    let pushed: i64 = accepted
        .iter()
        .map(otlp_window)
        .filter(|(start, _)| (nanos(from)..nanos(to)).contains(start))
        .map(|(_, cpu)| cpu)
        .sum();
    let clock = cpu_to - cpu_from;
    let ratio = pushed as f64 / clock.as_nanos() as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "pushed {:.3} s of CPU over 6 windows, the child's clock {:.3} s",
        pushed as f64 / 1e9,
        clock.as_secs_f64()
    );
    for data in &accepted {
        assert_conforms(data);
    }
    // The resource as the environment says, inline; the burner's samples labelled.
    let last = accepted.last().unwrap();
    let resource: Vec<(String, String)> = last.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(text)) => text.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect();
    for expected in [
        ("service.name", "checkout"),
        ("deployment.environment.name", "test"),
        ("team", "perf"),
        ("telemetry.sdk.language", "rust"),
        ("process.pid", &child.pid().to_string()),
    ] {
        assert!(
            resource
                .iter()
                .any(|(k, v)| (k.as_str(), v.as_str()) == expected),
            "{expected:?} in {resource:?}"
        );
    }
    let profile = &last.resource_profiles[0].scope_profiles[0].profiles[0];
    assert!(
        profile.samples.iter().any(|sample| {
            let attributes = sample_attributes(last, sample);
            attributes.contains(&("tenant".into(), "acme".into()))
                && attributes.contains(&("thread.name".into(), "child-burner".into()))
        }),
        "the burner's samples carry tenant=acme and thread.name"
    );
    // The index page says how it went.
    let index = child.text("/debug/pprof/").await;
    assert!(index.contains("otlp to <code>"), "{index}");
    assert!(index.contains("windows sent"), "{index}");
    assert!(index.contains("last error"), "{index}");
    let log = child.log();
    assert_eq!(
        log.matches("pushing failed").count(),
        1,
        "one warning for the outage: {log}"
    );
    assert!(log.contains("pushing works again"), "{log}");
}

/// Decoded Pyroscope push requests: `PushRequest` → `RawProfileSeries` → `LabelPair`,
/// `RawSample` (grafana/pyroscope's `push.proto`), written here apart from the crate's.
mod pyroscope {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub id: String,
    }
}

/// A pprof profile as Pyroscope receives it (not gzipped), by the `pprof` crate's decoder.
fn pprof_of(bytes: &[u8]) -> pprof::protos::Profile {
    use pprof::protos::Message as _;
    pprof::protos::Profile::decode(bytes).expect("a pprof profile")
}

/// Pyroscope gets one series per window, named and labelled, with the profile as pprof
/// (decoded by the `pprof` crate) and its credentials; a 503 with `Retry-After: 1` is
/// sent again, the same window with the same id, no sooner than a second later; a 400 is
/// tried once, its sentence logged once, and the windows after it still arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyroscope_series_are_labelled_retried_on_503_and_dropped_on_400() {
    let receiver = Receiver::serve(
        0,
        &[
            (
                503,
                Some("1"),
                "{\"code\":\"unavailable\",\"message\":\"ingester busy\"}",
            ),
            (200, None, "{}"),
            (
                400,
                None,
                "{\"code\":\"invalid_argument\",\"message\":\"profile rejected by the test\"}",
            ),
        ],
    )
    .await;
    let child = ChildServer::start_logged(
        EXE,
        "serve-push",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", None),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", None),
            ("PYROSCOPE_SERVER_ADDRESS", Some(&receiver.url())),
            ("PYROSCOPE_APPLICATION_NAME", Some("checkout")),
            ("PYROSCOPE_LABELS", Some("env=test,region=eu-1")),
            ("PYROSCOPE_BASIC_AUTH_USER", Some("user")),
            ("PYROSCOPE_BASIC_AUTH_PASSWORD", Some("secret")),
            ("PYROSCOPE_TENANT_ID", Some("team-a")),
        ],
    );
    let arrivals = receiver
        .wait_until(Duration::from_secs(20), |arrivals| arrivals.len() >= 6)
        .await;
    let decoded: Vec<(Arrival, pyroscope::PushRequest)> = arrivals
        .iter()
        .map(|a| (a.clone(), pyroscope::PushRequest::decode(&*a.body).unwrap()))
        .collect();
    let window = |request: &pyroscope::PushRequest| -> (i64, String) {
        let sample = &request.series[0].samples[0];
        let profile = pprof_of(&sample.raw_profile);
        (profile.time_nanos, sample.id.clone())
    };
    // The 503'd window again, the same id, a second later at least.
    let (first, second) = (&decoded[0], &decoded[1]);
    assert_eq!(first.0.status, 503);
    assert_eq!(
        window(&first.1),
        window(&second.1),
        "the same window, the same id"
    );
    let waited = second.0.at.duration_since(first.0.at).unwrap();
    assert!(
        waited >= Duration::from_secs(1),
        "Retry-After: 1 honoured: {waited:?}"
    );
    // The 400'd window is never sent again, and the later windows follow.
    let refused = window(&decoded[2].1);
    assert_eq!(decoded[2].0.status, 400);
    assert_eq!(
        decoded.iter().filter(|(_, r)| window(r) == refused).count(),
        1,
        "a refused window is tried once"
    );
    let starts: Vec<i64> = decoded[1..].iter().map(|(_, r)| window(r).0).collect();
    for pair in starts.windows(2) {
        assert_eq!(pair[1], pair[0] + 1_000_000_000, "windows {starts:?}");
    }
    // Labels, headers, and the profile itself.
    for (arrival, request) in &decoded {
        assert_eq!(arrival.path, PYROSCOPE);
        assert_eq!(arrival.headers["content-type"], "application/proto");
        assert_eq!(arrival.headers["authorization"], "Basic dXNlcjpzZWNyZXQ=");
        assert_eq!(arrival.headers["x-scope-orgid"], "team-a");
        assert_eq!(request.series.len(), 1);
        let labels: Vec<(&str, &str)> = request.series[0]
            .labels
            .iter()
            .map(|pair| (pair.name.as_str(), pair.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("__name__", "process_cpu"),
                ("service_name", "checkout"),
                ("env", "test"),
                ("region", "eu-1")
            ]
        );
    }
    let profile = pprof_of(&decoded[5].1.series[0].samples[0].raw_profile);
    let text = |at: i64| profile.string_table[at as usize].as_str();
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|ty| (text(ty.ty), text(ty.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert!(
        profile.sample.iter().any(|sample| sample
            .label
            .iter()
            .any(|label| text(label.key) == "tenant" && text(label.str) == "acme")),
        "the burner's samples carry tenant=acme"
    );
    let log = child.log();
    assert_eq!(
        log.matches("profile rejected by the test").count(),
        1,
        "the server's sentence, once: {log}"
    );
}

/// Destinations the pusher cannot use are named in the log with what to do, and the
/// service goes on serving: its routes answer, the index page says why nothing is
/// pushed. So does a pusher with no destination at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_destinations_are_said_and_the_service_keeps_serving() {
    // A port nothing listens on: refused connections are retried, not fatal.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused_url = format!("http://127.0.0.1:{closed}");
    for (env, says_log, says_index) in [
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", Some("collector:4318")),
                (
                    "PYROSCOPE_SERVER_ADDRESS",
                    Some("https://pyroscope.example"),
                ),
            ],
            vec!["is not a URL: write it as http://host:port", "needs TLS"],
            "nothing is pushed: no usable destination",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", None),
                ("PYROSCOPE_SERVER_ADDRESS", None),
            ],
            vec!["neither OTEL_EXPORTER_OTLP_ENDPOINT"],
            "nothing is pushed: neither",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", Some(refused_url.as_str())),
                ("PYROSCOPE_SERVER_ADDRESS", None),
            ],
            vec!["pushing failed", "could not connect"],
            "last error",
        ),
    ] {
        let mut env = env;
        env.push(("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", None));
        let mut child = ChildServer::start_logged(EXE, "serve-push", &env);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let log = child.log();
            if says_log.iter().all(|says| log.contains(says)) {
                break;
            }
            assert!(Instant::now() < deadline, "{says_log:?} not in {log}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let index = client()
            .get(child.url("/debug/pprof/"))
            .send()
            .await
            .unwrap();
        assert_eq!(index.status(), StatusCode::OK);
        let index = index.text().await.unwrap();
        assert!(index.contains(says_index), "{says_index}: {index}");
        // The recorder records on: its first slice may not be cut yet (a 404 that says
        // so), then it answers.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let recent = client()
                .get(child.url("/debug/pprof/recent?seconds=1"))
                .send()
                .await
                .unwrap();
            if recent.status() == StatusCode::OK {
                break;
            }
            let status = recent.status();
            let said = recent.text().await.unwrap();
            assert!(
                status == StatusCode::NOT_FOUND && Instant::now() < deadline,
                "the recorder does not answer: {status} {said}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(child.is_running());
    }
}

/// The OpenTelemetry Collector's own OTLP receiver (`tests/collector`, built by
/// `scripts/build-collector` from the Collector's modules at v0.165.0) takes every
/// window pushed: each request decodes with the Collector's pdata, is handed on with
/// its samples, passes profcheck's rules as the Collector marshals it again, and carries
/// the service's name; the child's index page counts them sent, none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collectors_receiver_takes_every_window() {
    use std::io::BufRead as _;
    let collector = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/test-tools/bin/krabka-collector"
    );
    assert!(
        std::path::Path::new(collector).exists(),
        "{collector} is missing: run scripts/build-collector (scripts/test does)"
    );
    let dir = std::env::temp_dir().join(format!("krabka-collector-{}", std::process::id()));
    let mut receiver = std::process::Command::new(collector)
        .arg("-dir")
        .arg(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the collector");
    let mut line = String::new();
    std::io::BufReader::new(receiver.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("addr=").expect("addr=").to_owned();
    let endpoint = format!("http://{addr}");
    let child = otlp_child(&endpoint, None);
    let requests = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "pb"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while requests(&dir).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the Collector was handed {} requests in 20 s; the child says: {}",
            requests(&dir).len(),
            child.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut starts = Vec::new();
    for file in requests(&dir) {
        let data = ProfilesData::decode(&*std::fs::read(&file).unwrap()).unwrap();
        assert_conforms(&data);
        let d = data.dictionary.as_ref().unwrap();
        // The Collector writes resource attributes' keys into the string table.
        let named = data.resource_profiles[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .any(|kv| {
                let key = if kv.key.is_empty() {
                    d.string_table[kv.key_strindex as usize].as_str()
                } else {
                    kv.key.as_str()
                };
                key == "service.name"
            });
        assert!(named, "{file:?} names its service");
        let (start, cpu) = otlp_window(&data);
        assert!(cpu > 0, "{file:?} holds CPU");
        starts.push(start);
    }
    for pair in starts.windows(2) {
        assert_eq!(pair[1], pair[0] + 1_000_000_000, "windows {starts:?}");
    }
    let index = child.text("/debug/pprof/").await;
    assert!(index.contains(" 0 dropped"), "{index}");
    drop(receiver.stdin.take());
    assert!(
        receiver.wait().unwrap().success(),
        "the collector exits cleanly"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `heap = true`, each window also carries the heap (`test_child serve-push-heap`:
/// 64 MiB kept at one site, 64 KiB allocated and freed at another about 450 times a
/// second): to Pyroscope a `memory` series saying `__delta__="false"`, whose
/// `alloc_space` is what was allocated in its window (the windows contiguous, their sum
/// at the churning site the child's own count of what it churned, ±25 %: jemalloc
/// samples one allocation in about 512 KiB) and whose `inuse_space` holds the 64 MiB;
/// to OTLP, four more profiles on the same dictionary.
#[cfg(all(feature = "heap-profiling", not(target_env = "musl")))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_profiles_go_with_their_windows_as_deltas() {
    let receiver = Receiver::serve(0, &[]).await;
    let child = ChildServer::start_logged(
        EXE,
        "serve-push-heap",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", Some(&receiver.url())),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", None),
            ("PYROSCOPE_SERVER_ADDRESS", Some(&receiver.url())),
            ("PYROSCOPE_APPLICATION_NAME", Some("checkout")),
        ],
    );
    let churned = || async {
        let text = child.text("/churned").await;
        (Instant::now(), text.trim().parse::<u64>().unwrap())
    };
    let first = churned().await;
    let heaps = |arrivals: &[Arrival]| -> Vec<pprof::protos::Profile> {
        arrivals
            .iter()
            .filter(|a| a.path == PYROSCOPE)
            .filter_map(|a| {
                let request = pyroscope::PushRequest::decode(&*a.body).unwrap();
                let memory = request.series.get(1)?;
                let names: Vec<(&str, &str)> = memory
                    .labels
                    .iter()
                    .map(|pair| (pair.name.as_str(), pair.value.as_str()))
                    .collect();
                assert_eq!(
                    names,
                    [
                        ("__name__", "memory"),
                        ("service_name", "checkout"),
                        ("__delta__", "false")
                    ]
                );
                Some(pprof_of(&memory.samples[0].raw_profile))
            })
            .collect()
    };
    let arrivals = receiver
        .wait_until(Duration::from_secs(20), |arrivals| {
            heaps(arrivals).len() >= 5
        })
        .await;
    let last = churned().await;
    let heaps = heaps(&arrivals);
    for heap in &heaps {
        let text = |at: i64| heap.string_table[at as usize].as_str();
        let types: Vec<&str> = heap.sample_type.iter().map(|ty| text(ty.ty)).collect();
        assert_eq!(
            types,
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space"
            ]
        );
    }
    // Each heap profile's window begins where the one before ended.
    for pair in heaps.windows(2) {
        let end = pair[0].time_nanos + pair[0].duration_nanos;
        assert!(
            (end - pair[1].time_nanos).abs() < 50_000_000,
            "a gap or an overlap of {} ms between two heap windows",
            (pair[1].time_nanos - end) / 1_000_000
        );
    }
    let column = |profile: &pprof::protos::Profile, name: &str| -> i64 {
        krabka_pprof_tests::total_in(profile, 1, name)
    };
    let allocated: i64 = heaps.iter().map(|heap| column(heap, "churn_64_kib")).sum();
    let spanned: i64 = heaps.iter().map(|heap| heap.duration_nanos).sum();
    let rate = (last.1 - first.1) as f64 / last.0.duration_since(first.0).as_secs_f64();
    let expected = rate * spanned as f64 / 1e9;
    let ratio = allocated as f64 / expected;
    assert!(
        (0.75..=1.25).contains(&ratio),
        "alloc_space at the churning site: {allocated} bytes over {:.1} s of windows, the \
         child churned {expected:.0} at its own count ({ratio:.2})",
        spanned as f64 / 1e9
    );
    let held = krabka_pprof_tests::total_in(heaps.last().unwrap(), 3, "retain_64_mib");
    assert!(
        (held as f64 / (64 << 20) as f64 - 1.0).abs() < 0.15,
        "inuse_space holds the 64 MiB kept: {held}"
    );
    // OTLP: the same window's heap as four more profiles on one dictionary.
    let otlp = arrivals
        .iter()
        .filter(|a| a.path == OTLP)
        .map(|a| ProfilesData::decode(&*a.body).unwrap())
        .find(|data| data.resource_profiles[0].scope_profiles[0].profiles.len() == 6)
        .expect("an OTLP request with the heap");
    assert_conforms(&otlp);
    let d = otlp.dictionary.as_ref().unwrap();
    let types: Vec<&str> = otlp.resource_profiles[0].scope_profiles[0]
        .profiles
        .iter()
        .map(|p| d.string_table[p.sample_type.unwrap().type_strindex as usize].as_str())
        .collect();
    assert_eq!(
        types,
        [
            "samples",
            "cpu",
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
}
