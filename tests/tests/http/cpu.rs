//! A real CPU profile, decoded and read by `go tool pprof`; one profile at a time;
//! clamping; a client that hangs up.

use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, Profile, SAMPLER_VAR, TestServer, assert_cpu_nanos, assert_sample_count, client,
    comments, decode, go_pprof_each, pprof_rs_sampler, profile_window, sample_types, serial,
    string, thread_samples, total, total_in,
};
use reqwest::StatusCode;

// One profile at a time: the 409 and its hand-over (windows.rs tests sharing).
#[pprof_routes(frequency = 99, max_windows = 1)]
fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

#[pprof_routes(cpu_max = "2s", cpu_default = "1s")]
fn short_app() -> Router {
    Router::new()
}

/// Whether a function (by its name or its source file) is the `pprof` crate's or the
/// `backtrace` crate's, whose code runs in the `pprof` crate's signal handler.
fn is_handler_code(name: &str, file: &str) -> bool {
    name.starts_with("pprof::")
        || name.contains("<pprof::")
        || name.contains("perf_signal_handler")
        || name.starts_with("backtrace::")
        || file.contains("/pprof-0.")
        || file.contains("/backtrace-0.")
}

/// The leaf functions (name and file) of the samples whose leaf location holds the
/// sampler's handler code.
fn samples_whose_leaf_is_the_samplers_handler(profile: &Profile) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for sample in &profile.sample {
        let Some(leaf) = sample.location_id.first() else {
            continue;
        };
        let location = profile.location.iter().find(|l| l.id == *leaf).unwrap();
        for line in &location.line {
            let function = profile
                .function
                .iter()
                .find(|f| f.id == line.function_id)
                .unwrap();
            let (name, file) = (
                string(profile, function.name),
                string(profile, function.filename),
            );
            if is_handler_code(name, file) {
                found.push((name.to_owned(), file.to_owned()));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[tokio::test]
async fn profile_is_gzipped_pprof_with_the_hot_function() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=3"))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"profile\""
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(
        headers.get("content-encoding").is_none(),
        "the gzip is the payload itself"
    );
    let body = response.bytes().await.unwrap();
    let profile = decode(&body);
    let handler_leaves = samples_whose_leaf_is_the_samplers_handler(&profile);
    assert!(
        handler_leaves.is_empty(),
        "a sample's leaf is where its thread was interrupted, not the sampler's own \
         handler unwinding it: {handler_leaves:?}"
    );

    assert_eq!(
        sample_types(&profile),
        [
            ("samples".into(), "count".into()),
            ("cpu".into(), "nanoseconds".into())
        ]
    );
    let period_type = profile.period_type.as_ref().expect("a period type");
    assert_eq!(string(&profile, period_type.ty), "cpu");
    assert_eq!(string(&profile, period_type.unit), "nanoseconds");
    assert_eq!(profile.period, 1_000_000_000 / 99);
    assert!(
        profile.duration_nanos >= 2_900_000_000,
        "{}",
        profile.duration_nanos
    );

    // ITIMER_PROF fires once per 1/99 s of process CPU time: the burner's CPU inside the
    // window, by its own clock, predicts its samples.
    let timeline = burner.finish();
    let (start, end) = profile_window(&profile);
    let burned = timeline.cpu_within(start, end);
    // Within 20 %; fewer only where the burner did not have its core (a machine busy with
    // other work), where the kernel folds its periods into fewer signals.
    let share = timeline.least_core_share(start, end);
    let in_burner = total_in(&profile, 0, "Burner") as f64;
    assert_sample_count("the burner", in_burner, burned, 99, share, 0.2);
    let samples = total(&profile, 0) as f64;
    // cpu/nanoseconds is CPU time: the burner's, by its own clock, within 20%.
    let burner_nanos = total_in(&profile, 1, "Burner") as f64;
    assert_cpu_nanos("the burner", burner_nanos, burned, 99, share, 0.2);

    let hot = total_in(&profile, 0, "krabka_hot_spin") as f64;
    assert!(
        hot > samples * 0.5,
        "the burner used most of the CPU, but krabka_hot_spin has {hot} of {samples} samples"
    );

    for (reader, top) in go_pprof_each(&["-top", "-nodecount=1000"], &body) {
        assert!(top.contains("krabka_hot_spin"), "{reader:?} -top:\n{top}");
    }
}

#[tokio::test]
async fn a_second_request_gets_409_at_once() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = client();
    let url = server.url("/debug/pprof/profile?seconds=2");
    let started = Instant::now();
    // Whichever arrives first runs; the other is refused at once, so its answer comes
    // back before the running profile's.
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let tag = |name: &'static str, request: reqwest::RequestBuilder| {
        let tx = order_tx.clone();
        async move {
            let response = request.send().await.unwrap();
            tx.send(name).unwrap();
            response
        }
    };
    let (a, b) = tokio::join!(tag("a", http.get(&url)), tag("b", http.get(&url)));
    let first_done = order_rx.recv().await.unwrap();
    let (ok, refused, refused_name) = match (a.status(), b.status()) {
        (StatusCode::OK, StatusCode::CONFLICT) => (a, b, "b"),
        (StatusCode::CONFLICT, StatusCode::OK) => (b, a, "a"),
        other => panic!("expected one 200 and one 409, got {other:?}"),
    };
    assert_eq!(
        first_done, refused_name,
        "the 409 must not wait for the running profile"
    );
    let headers = refused.headers().clone();
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["x-go-pprof"], "1");
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("already running") && text.ends_with('\n'),
        "{text:?}"
    );
    decode(&ok.bytes().await.unwrap());
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[tokio::test]
async fn seconds_above_cpu_max_are_clamped() {
    let _serial = serial().await;
    let server = TestServer::start(short_app);
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=100"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    let seconds = profile.duration_nanos as f64 / 1e9;
    assert!(
        (1.9..3.0).contains(&seconds),
        "a 100s request ran {seconds}s with cpu_max = 2s"
    );

    // No `seconds`: cpu_default.
    let response = client()
        .get(server.url("/debug/pprof/profile"))
        .send()
        .await
        .unwrap();
    let profile = decode(&response.bytes().await.unwrap());
    let seconds = profile.duration_nanos as f64 / 1e9;
    assert!(
        (0.9..1.9).contains(&seconds),
        "the default ran {seconds}s with cpu_default = 1s"
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_frees_the_profiler() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = client();
    let probe = server.url("/debug/pprof/profile?seconds=1");

    let hung_up = server.hold_profiler("seconds=30").await;
    drop(hung_up);

    // The server sees the EOF and drops the handler, and with it its window: the index
    // stops showing a profile (the event awaited here), the sampler stops on the blocking
    // pool, and the next request is accepted (it waits for the stop at most). A leaked
    // lease would keep answering 409 for the rest of the 30 s. How soon after the
    // hang-up this happens is a benchmark figure (F in bench/README.md), not a test's.
    server.wait_for_windows(0).await;
    let response = http.get(&probe).send().await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the profiler was still busy after its client hung up and its window left: {}",
        response.text().await.unwrap()
    );
    let profile = decode(&response.bytes().await.unwrap());
    assert!(profile.duration_nanos >= 1_000_000_000);
}

#[tokio::test]
async fn go_tool_pprof_shows_the_409_sentence() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let running = server.hold_profiler("seconds=10").await;
    let url = server.url("/debug/pprof/profile?seconds=1");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("go")
            .args(["tool", "pprof", "-top", &url])
            .env("HOME", std::env::temp_dir())
            .env("PPROF_TMPDIR", std::env::temp_dir())
            .output()
            .expect("run go tool pprof (Debian: apt-get install golang-go)")
    })
    .await
    .unwrap();
    drop(running);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("409 Conflict") && stderr.contains("a CPU profile is already running"),
        "go tool pprof should print our sentence:\n{stderr}"
    );
}

/// What Parca and `go tool pprof` read beyond the stacks, from whichever sampler this run
/// chose ([`SAMPLER_VAR`]): the comment naming it, a `thread` label on every sample, and
/// the hot function's mapping (the test binary's file, its addresses) from krabka-pprof's
/// sampler, or its file and line (from the debug info) from the `pprof` crate's.
#[tokio::test]
async fn the_profile_names_its_sampler_threads_and_mappings() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    drop(burner);

    let pprof_rs = pprof_rs_sampler();
    let notes = comments(&profile);
    let named = notes
        .iter()
        .any(|c| c.contains("through the pprof crate's sampler"));
    assert_eq!(
        named, pprof_rs,
        "{SAMPLER_VAR} chose the pprof crate's sampler: {pprof_rs}; comments: {notes:?}"
    );
    let own = notes.iter().any(|c| c.contains("per-thread CPU timers"));
    assert_eq!(
        own, !pprof_rs,
        "krabka-pprof's own sampler names itself unless the pprof crate's was chosen: {notes:?}"
    );
    if pprof_rs {
        // Its count of samples is the profile's.
        let samples: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        assert!(
            notes.contains(&format!("{samples} samples").as_str()),
            "{samples} samples; comments: {notes:?}"
        );
    }

    for sample in &profile.sample {
        let thread = sample
            .label
            .iter()
            .find(|l| string(&profile, l.key) == "thread")
            .map(|l| string(&profile, l.str));
        assert!(
            thread.is_some_and(|t| !t.is_empty()),
            "a sample without a thread label: {sample:?}"
        );
    }
    assert!(
        thread_samples(&profile, "burner-0") > 0,
        "no sample labelled with the burner's thread name"
    );

    // The hot function's location: its function by name, its mapping by file.
    let hot_function = profile
        .function
        .iter()
        .find(|f| string(&profile, f.name).contains("krabka_hot_spin"))
        .expect("krabka_hot_spin is in the profile");
    let location = profile
        .location
        .iter()
        .find(|l| {
            l.line
                .iter()
                .any(|line| line.function_id == hot_function.id)
        })
        .expect("a location in krabka_hot_spin");
    if pprof_rs {
        // That sampler's report keeps symbols, not code addresses: no mapping to give.
        assert_eq!(
            (location.mapping_id, location.address),
            (0, 0),
            "a frame of the pprof crate's sampler has no address"
        );
    } else {
        let mapping = profile
            .mapping
            .iter()
            .find(|m| m.id == location.mapping_id)
            .unwrap_or_else(|| panic!("the hot location has a mapping: {location:?}"));
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            std::path::Path::new(string(&profile, mapping.filename)).file_name(),
            exe.file_name(),
            "the hot function lies in this test binary"
        );
        assert!(
            (mapping.memory_start..mapping.memory_limit).contains(&location.address),
            "{:#x} outside its mapping {:#x}..{:#x}",
            location.address,
            mapping.memory_start,
            mapping.memory_limit
        );
        // What Parca and `go tool pprof` match binaries and addresses by: the build ID
        // (the linker's 20-byte GNU one, as hex), and the file offset of memory_start, as
        // the kernel maps it.
        let build_id = string(&profile, mapping.build_id);
        assert!(
            build_id.len() == 40 && build_id.bytes().all(|b| b.is_ascii_hexdigit()),
            "build ID {build_id:?}"
        );
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = exe.to_string_lossy();
        let (range, offset) = maps
            .lines()
            .filter(|line| line.ends_with(&*exe))
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let (start, end) = fields.next()?.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                let offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
                (start..end)
                    .contains(&location.address)
                    .then_some((start..end, offset))
            })
            .expect("the kernel maps the hot address from this binary");
        assert!(range.start <= mapping.memory_start && mapping.memory_limit <= range.end);
        assert_eq!(
            mapping.file_offset,
            offset + (mapping.memory_start - range.start),
            "file_offset of memory_start {:#x}, as /proc/self/maps maps it",
            mapping.memory_start
        );
    }
    if pprof_rs {
        let line = location
            .line
            .iter()
            .find(|line| line.function_id == hot_function.id)
            .unwrap();
        assert!(
            string(&profile, hot_function.filename).ends_with("tests/src/hot.rs"),
            "the hot function's file: {:?}",
            string(&profile, hot_function.filename)
        );
        assert!(line.line > 0, "the hot loop's line number");
    }
}

/// `symbolize=none` from whichever sampler this run chose: krabka-pprof's answers with
/// code addresses in mappings and no names; the `pprof` crate's keeps names, not
/// addresses, so it refuses with a 503 saying what to do, and the next profile is served.
#[tokio::test]
async fn symbolize_none_is_addresses_or_a_503_saying_to_leave_it_out() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=1&symbolize=none"))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.bytes().await.unwrap();
    if pprof_rs_sampler() {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("`symbolize=none` needs code addresses")
                && text.contains("leave `symbolize` out"),
            "the 503 says why and what to do: {text}"
        );
        let next = client()
            .get(server.url("/debug/pprof/profile?seconds=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            next.status(),
            StatusCode::OK,
            "the profiler is usable after"
        );
        return;
    }
    drop(burner);
    assert_eq!(status, StatusCode::OK);
    let profile = decode(&body);
    assert!(!profile.location.is_empty(), "the burner was sampled");
    for location in &profile.location {
        if location.mapping_id != 0 {
            assert!(location.line.is_empty(), "no names: {location:?}");
            assert_ne!(location.address, 0, "{location:?}");
        }
    }
    assert!(
        profile.location.iter().any(|l| l.mapping_id != 0),
        "code addresses in mappings"
    );
}
