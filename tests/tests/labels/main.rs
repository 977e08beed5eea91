//! The labels suite: labels on CPU samples, read back the way users read them: `go tool pprof -tags` and
//! `-tagfocus` on the pprof body, the text view's `group=`, and the decoded profile. Each
//! workload's truth is its own CPU clock, read around the work it labels.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use krabka_pprof::labels::{self, LabelsExt};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Profile, Reader, TestServer, client, comments, decode, go_pprof, hot, pprof_rs_sampler, says,
    serial, skip, stacks, string, thread_cpu_time,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "15s")]
fn app() -> Router {
    Router::new()
}

/// The pprof body of a CPU profile of `seconds` at `frequency` Hz, with `extra` query
/// parameters, taken while the caller's workload runs.
async fn profile_body(server: &TestServer, query: &str) -> Vec<u8> {
    let response = client()
        .get(server.url(&format!("/debug/pprof/profile?{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.bytes().await.unwrap().to_vec()
}

/// Each sample's labels (string labels; a key given twice keeps its last value) and
/// its function names, leaf first, and its sample count.
fn labelled_stacks(profile: &Profile) -> Vec<(BTreeMap<String, String>, Vec<String>, i64)> {
    profile
        .sample
        .iter()
        .zip(stacks(profile))
        .map(|(sample, (names, values))| {
            let labels = sample
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| {
                    (
                        string(profile, l.key).to_owned(),
                        string(profile, l.str).to_owned(),
                    )
                })
                .collect();
            (labels, names, values[0])
        })
        .collect()
}

/// With the pprof crate's sampler, samples carry no labels, and the profile says so.
/// Returns whether the caller should stop there.
fn labels_not_recorded(profile: &Profile) -> bool {
    if !pprof_rs_sampler() {
        return false;
    }
    assert!(
        says(profile, "labels are not recorded"),
        "{:?}",
        comments(profile)
    );
    true
}

/// `pprof -tags`'s shares of `key`'s values, in percent of the samples that carry `key`,
/// as `reader` prints them. Readers differ in what their percentages are of: Go 1.19's
/// are of the key's total, Go 1.26's (google/pprof since 2023) of the whole profile's,
/// with "Total X of Y (Z%)" above them. Each value's percentage over their sum is the
/// same share in both.
fn tag_shares(reader: Reader, body: &[u8], key: &str) -> BTreeMap<String, f64> {
    let report = reader.run(&["-tags", &format!("-tagshow=^{key}$")], body);
    // " tenant: Total 4.52s\n          3.16s (69.91%): acme\n ..." (1.19) or
    // " tenant: Total 4.52s of 5.10s (88.63%)\n          3.16s (61.96%): acme" (1.26)
    let mut printed = BTreeMap::new();
    let mut inside = false;
    for line in report.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(&format!("{key}:")) {
            inside = rest.trim_start().starts_with("Total");
            continue;
        }
        if !inside || line.is_empty() {
            inside = inside && !line.is_empty();
            continue;
        }
        let Some((number, value)) = line.split_once("%): ") else {
            continue;
        };
        let share: f64 = number
            .rsplit('(')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{reader:?}: a -tags line: {line:?}\n{report}"));
        printed.insert(value.to_owned(), share);
    }
    let sum: f64 = printed.values().sum();
    assert!(sum > 0.0, "{reader:?}: no shares of {key}:\n{report}");
    printed
        .into_iter()
        .map(|(value, share)| (value, share * 100.0 / sum))
        .collect()
}

/// Shuts a workload's runtime down off the test's own (which may not block).
async fn shut_down(runtime: tokio::runtime::Runtime) {
    tokio::task::spawn_blocking(move || runtime.shutdown_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
}

/// Per tenant: CPU nanoseconds its labelled work used, by the polling thread's clock.
static TENANT_CPU: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// One tenant's task: chunks of work in its own function, each timed by the polling
/// thread's CPU clock, then a wake from outside the runtime, so that the next poll may
/// happen on either worker. Notes the threads that polled it.
async fn tenant_task(
    tenant: usize,
    stop: Arc<AtomicBool>,
    wakes: std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
    pollers: Arc<Mutex<[HashSet<std::thread::ThreadId>; 2]>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let before = thread_cpu_time();
        match tenant {
            0 => black_box(hot::split_fifty(black_box(20_000))),
            _ => black_box(hot::split_thirty(black_box(20_000))),
        };
        let used = thread_cpu_time() - before;
        TENANT_CPU[tenant].fetch_add(used.as_nanos() as u64, Ordering::Relaxed);
        pollers.lock().unwrap()[tenant].insert(std::thread::current().id());
        let (woken, wait) = tokio::sync::oneshot::channel();
        if wakes.send(woken).is_err() {
            break;
        }
        let _ = wait.await;
    }
}

#[tokio::test]
async fn two_tenants_split_by_tags_as_their_cpu_clocks_did_across_workers() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let pollers = Arc::new(Mutex::new([HashSet::new(), HashSet::new()]));
    let (wakes, wake_queue) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
    // Wakes each task from a thread outside the runtime: the task goes to the runtime's
    // shared queue, which both workers take from.
    let waker = std::thread::spawn(move || {
        for woken in wake_queue {
            let _ = woken.send(());
        }
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tenant-worker")
        .build()
        .unwrap();
    // Seven tasks of one tenant, three of the other: about 70 % and 30 % of the CPU.
    for i in 0..10 {
        let (tenant, name) = if i < 7 { (0, "acme") } else { (1, "globex") };
        runtime.spawn(
            tenant_task(tenant, stop.clone(), wakes.clone(), pollers.clone())
                .with_labels(&[("tenant", name)]),
        );
    }
    drop(wakes);
    let before = TENANT_CPU.each_ref().map(|c| c.load(Ordering::Relaxed));
    let body = profile_body(&server, "seconds=5&frequency=250").await;
    let after = TENANT_CPU.each_ref().map(|c| c.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    shut_down(runtime).await;
    waker.join().unwrap();
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }

    let pollers = pollers.lock().unwrap().clone();
    assert!(
        pollers[0].len() == 2 && pollers[1].len() == 2,
        "each tenant's tasks were polled on both workers: {pollers:?}"
    );
    let used = [0, 1].map(|t| (after[t] - before[t]) as f64);
    let truth = used[0] * 100.0 / (used[0] + used[1]);
    assert!(
        (truth - 70.0).abs() <= 10.0,
        "the workload itself is off: acme used {truth:.1}% where about 70% was meant"
    );
    // Enough samples that ±5 points means something. A machine busy with other work
    // gives fewer: it folds the tenants' periods into fewer signals, or leaves the
    // tenants too little CPU to have 1000 periods at all; then the shares cannot be
    // judged to 5 points, and the test says so (both tenants' labels are required
    // below).
    let labelled: i64 = labelled_stacks(&profile)
        .iter()
        .filter(|(labels, _, _)| labels.contains_key("tenant"))
        .map(|(_, _, n)| n)
        .sum();
    let periods = (used[0] + used[1]) / profile.period.max(1) as f64;
    if labelled <= 1000 {
        skip(
            "two_tenants_split_by_tags_as_their_cpu_clocks_did_across_workers (its shares)",
            &if periods > 1000.0 {
                format!(
                    "{labelled} labelled samples stand for {periods:.0} periods of the \
                     tenants' CPU: a busy machine folded them into too few signals to judge \
                     5 points"
                )
            } else {
                format!(
                    "the tenants had only {periods:.0} periods of CPU ({labelled} labelled \
                     samples): a busy machine left them too little to judge 5 points"
                )
            },
        );
    }
    // Each reader of pprof's text: the share of the labelled CPU each tenant's label
    // has, against the share of the tenants' CPU each one's clock counted.
    for reader in Reader::TEXT {
        let shares = tag_shares(reader, &body, "tenant");
        eprintln!("{reader:?} -tags tenant: {shares:?}; CPU clocks: acme {truth:.1}%");
        assert_eq!(
            shares.keys().map(String::as_str).collect::<Vec<_>>(),
            ["acme", "globex"],
            "{reader:?}: {shares:?}"
        );
        if labelled > 1000 {
            assert!(
                (shares["acme"] - truth).abs() <= 5.0,
                "{reader:?} -tags says acme {:.1}% of the labelled CPU, its CPU clock \
                 {truth:.1}%",
                shares["acme"]
            );
            assert!(
                (shares["globex"] - (100.0 - truth)).abs() <= 5.0,
                "{reader:?} -tags says globex {:.1}% of the labelled CPU, its CPU clock \
                 {:.1}%",
                shares["globex"],
                100.0 - truth
            );
        }

        // -tagfocus keeps one tenant's samples: its function, never the other's.
        let top = reader.run(&["-top", "-nodecount=200", "-tagfocus=tenant=acme"], &body);
        assert!(top.contains("split_fifty"), "{reader:?}: {top}");
        assert!(!top.contains("split_thirty"), "{reader:?}: {top}");
        let top = reader.run(
            &["-top", "-nodecount=200", "-tagfocus=tenant=globex"],
            &body,
        );
        assert!(top.contains("split_thirty"), "{reader:?}: {top}");
        assert!(!top.contains("split_fifty"), "{reader:?}: {top}");
    }
}

/// Burns in `work` until `stop`, inside `labels::scope(labels)` on a thread named `name`.
fn scoped_burner(
    name: &str,
    stop: Arc<AtomicBool>,
    work: impl Fn() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                work();
            }
        })
        .unwrap()
}

#[tokio::test]
async fn threads_in_nested_scopes_carry_the_merged_labels_and_the_text_view_groups_them() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let odd = "a=b, \"quoted\" 'x' ünïcödé ☃";
    let burners = [
        scoped_burner("scoped-outer", stop.clone(), || {
            labels::scope(&[("job", "reindex"), ("route", "/a")], || {
                black_box(hot::split_fifty(black_box(20_000)));
                labels::scope(&[("route", "/b"), ("step", "inner")], || {
                    black_box(hot::split_thirty(black_box(20_000)));
                });
            });
        }),
        scoped_burner("scoped-odd", stop.clone(), move || {
            labels::scope(&[("job", odd)], || {
                black_box(hot::split_twenty(black_box(20_000)));
            });
        }),
    ];
    let body = profile_body(&server, "seconds=3&frequency=250").await;
    let text = client()
        .get(server.url("/debug/pprof/profile?seconds=2&frequency=250&format=text&group=job"))
        .send()
        .await
        .unwrap();
    assert_eq!(text.status(), StatusCode::OK);
    let text = text.text().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    for burner in burners {
        burner.join().unwrap();
    }
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }

    let samples = labelled_stacks(&profile);
    let in_function = |name: &str| -> Vec<&BTreeMap<String, String>> {
        samples
            .iter()
            .filter(|(_, names, _)| names.first().is_some_and(|leaf| leaf.contains(name)))
            .map(|(labels, _, _)| labels)
            .collect()
    };
    let expect = |name: &str, wanted: &[(&str, &str)]| {
        let found = in_function(name);
        assert!(!found.is_empty(), "no sample in {name}");
        for labels in found {
            let mut wanted: BTreeMap<String, String> = wanted
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            wanted.insert("thread".into(), labels["thread"].clone());
            assert_eq!(labels, &wanted, "the labels of a sample in {name}");
        }
    };
    expect("split_fifty", &[("job", "reindex"), ("route", "/a")]);
    // The inner scope's value wins on `route`; the outer's `job` stays.
    expect(
        "split_thirty",
        &[("job", "reindex"), ("route", "/b"), ("step", "inner")],
    );
    expect("split_twenty", &[("job", odd)]);
    assert!(
        in_function("split_thirty")
            .iter()
            .all(|labels| labels["thread"] == "scoped-outer"),
        "the thread's name, not its id"
    );
    assert!(
        samples
            .iter()
            .all(|(labels, _, _)| !labels.contains_key("thread_id")),
        "no thread id unless asked"
    );
    // pprof reads the odd value back whole.
    for reader in Reader::TEXT {
        let shares = tag_shares(reader, &body, "job");
        assert!(shares.contains_key(odd), "{reader:?}: {shares:?}");
    }

    // The text view, grouped by `job`: one group per value, each with its functions.
    eprintln!("{text}");
    assert!(text.contains("Grouped by label job"), "{text}");
    let reindex = text
        .split("\njob=reindex: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no job=reindex section: {text}"));
    let reindex = reindex.split("\n\n").next().unwrap();
    assert!(
        reindex.contains("split_fifty") && reindex.contains("split_thirty"),
        "{reindex}"
    );
    assert!(!reindex.contains("split_twenty"), "{reindex}");
    assert!(text.contains(&format!("job={odd}")), "{text}");
    assert!(
        text.contains("[no job]"),
        "the unlabelled CPU is a group too: {text}"
    );
}

#[tokio::test]
async fn a_dropped_labelled_future_leaves_its_labels_behind() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = stop.clone();
    // One thread: a labelled future that burns until it is dropped half-way, then the
    // same thread burns unlabelled in another function.
    let burner = std::thread::Builder::new()
        .name("drops-future".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let burning = async {
                    loop {
                        black_box(hot::split_fifty(black_box(20_000)));
                        tokio::task::yield_now().await;
                    }
                }
                .with_labels(&[("tenant", "dropped")]);
                // Dropped by the timeout, mid-work, after 1.5 s of CPU.
                let _ = tokio::time::timeout(Duration::from_millis(1500), burning).await;
            });
            let started = Instant::now();
            while !thread_stop.load(Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(30)
            {
                black_box(hot::split_twenty(black_box(20_000)));
            }
        })
        .unwrap();
    let body = profile_body(&server, "seconds=3&frequency=250").await;
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }
    let samples = labelled_stacks(&profile);
    let tenants = |function: &str| -> BTreeSet<Option<String>> {
        samples
            .iter()
            .filter(|(_, names, _)| names.iter().any(|n| n.contains(function)))
            .map(|(labels, _, _)| labels.get("tenant").cloned())
            .collect()
    };
    assert_eq!(
        tenants("split_fifty"),
        BTreeSet::from([Some("dropped".to_owned())])
    );
    assert_eq!(
        tenants("split_twenty"),
        BTreeSet::from([None]),
        "the future's labels ended with it"
    );
}

#[tokio::test]
async fn a_blocking_pool_churning_a_thousand_threads_makes_few_label_sets() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(8)
        .thread_keep_alive(Duration::from_millis(1))
        .thread_name("churn-pool")
        .enable_time()
        .build()
        .unwrap();
    let tids = Arc::new(Mutex::new(HashSet::new()));
    let churn = {
        let tids = tids.clone();
        runtime.spawn(async move {
            let started = Instant::now();
            // Waves of blocking tasks; between waves the idle threads time out and exit,
            // so the next wave gets new threads. Bounded in threads and in time.
            while tids.lock().unwrap().len() < 1000 && started.elapsed() < Duration::from_secs(12) {
                let wave: Vec<_> = (0..8)
                    .map(|i| {
                        let tids = tids.clone();
                        tokio::task::spawn_blocking(move || {
                            // SAFETY: gettid has no preconditions.
                            tids.lock().unwrap().insert(unsafe { libc::gettid() });
                            let tenant = if i % 2 == 0 { "even" } else { "odd" };
                            labels::scope(&[("tenant", tenant)], || {
                                black_box(hot::krabka_short_lived(black_box(200_000)));
                            });
                        })
                    })
                    .collect();
                for task in wave {
                    task.await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
        })
    };
    let body = profile_body(&server, "seconds=10&frequency=250").await;
    churn.await.unwrap();
    let churned = tids.lock().unwrap().len();
    shut_down(runtime).await;
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }
    let samples = labelled_stacks(&profile);
    let sets: BTreeSet<&BTreeMap<String, String>> = samples.iter().map(|(l, _, _)| l).collect();
    let names: BTreeSet<&str> = sets
        .iter()
        .filter_map(|l| l.get("thread").map(String::as_str))
        .collect();
    let user_sets: BTreeSet<BTreeMap<&String, &String>> = sets
        .iter()
        .map(|l| l.iter().filter(|(k, _)| *k != "thread").collect())
        .collect();
    eprintln!(
        "{churned} threads churned; {} label sets, {} thread names {names:?}, {} user sets",
        sets.len(),
        names.len(),
        user_sets.len()
    );
    assert!(
        churned >= 500,
        "only {churned} threads churned: the workload did not churn"
    );
    let churn_samples = samples
        .iter()
        .filter(|(labels, _, _)| labels.contains_key("tenant"))
        .count();
    assert!(churn_samples > 0, "no sample of the churning threads");
    assert!(
        sets.len() <= names.len() * user_sets.len(),
        "{} label sets from {} names and {} user sets",
        sets.len(),
        names.len(),
        user_sets.len()
    );
    assert!(
        names.len() < 20,
        "a series per thread: {} thread names for {churned} threads",
        names.len()
    );
    assert!(
        samples
            .iter()
            .all(|(labels, _, _)| !labels.contains_key("thread_id"))
    );
}

#[tokio::test]
async fn thread_ids_are_labels_when_asked_as_strings_tagfocus_can_match() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU64::new(0));
    let burner = {
        let (stop, tid) = (stop.clone(), tid.clone());
        std::thread::Builder::new()
            .name("asks-ids".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid.store(unsafe { libc::gettid() } as u64, Ordering::Relaxed);
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                    black_box(hot::split_fifty(black_box(20_000)));
                }
            })
            .unwrap()
    };
    let body = profile_body(&server, "seconds=2&frequency=250&thread_ids=true").await;
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }
    let tid = tid.load(Ordering::Relaxed).to_string();
    let top = go_pprof(&["-top", &format!("-tagfocus=thread_id=^{tid}$")], &body);
    assert!(top.contains("split_fifty"), "{top}");
    let samples = labelled_stacks(&profile);
    assert!(
        samples
            .iter()
            .filter(|(labels, _, _)| labels.get("thread").is_some_and(|t| t == "asks-ids"))
            .all(|(labels, _, _)| labels.get("thread_id") == Some(&tid)),
        "every sample of the thread carries its id"
    );
}

/// The labels layer as this binary's global subscriber (worker threads of any runtime
/// see it), naming the `tenant` field.
fn install_the_layer() {
    use tracing_subscriber::prelude::*;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing_subscriber::registry()
            .with(labels::layer().with_fields(["tenant"]))
            .try_init()
            .expect("the only global subscriber of this binary");
    });
}

#[tokio::test]
async fn samples_inside_a_span_carry_its_local_roots_name_and_id_across_workers() {
    use tracing::Instrument as _;
    let _serial = serial().await;
    install_the_layer();
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for _ in 0..4 {
        let stop = stop.clone();
        let root = tracing::info_span!("checkout", tenant = "acme");
        runtime.spawn(
            async move {
                while !stop.load(Ordering::Relaxed) {
                    black_box(hot::split_fifty(black_box(20_000)));
                    // A child span: its samples carry the root's name and id.
                    tracing::info_span!("charge").in_scope(|| {
                        black_box(hot::split_thirty(black_box(20_000)));
                    });
                    tokio::task::yield_now().await;
                }
            }
            .instrument(root),
        );
    }
    // Outside any span: no span labels.
    let outside = scoped_burner("no-span", stop.clone(), || {
        black_box(hot::split_twenty(black_box(20_000)));
    });
    let body = profile_body(&server, "seconds=3&frequency=250").await;
    stop.store(true, Ordering::Relaxed);
    outside.join().unwrap();
    shut_down(runtime).await;
    let profile = decode(&body);
    if labels_not_recorded(&profile) {
        return;
    }
    let samples = labelled_stacks(&profile);
    let in_leaf = |name: &str| -> Vec<&BTreeMap<String, String>> {
        samples
            .iter()
            .filter(|(_, names, _)| names.first().is_some_and(|leaf| leaf.contains(name)))
            .map(|(labels, _, _)| labels)
            .collect()
    };
    let mut ids = BTreeSet::new();
    for function in ["split_fifty", "split_thirty"] {
        let found = in_leaf(function);
        assert!(!found.is_empty(), "no sample in {function}");
        for labels in found {
            assert_eq!(
                labels.get("span_name").map(String::as_str),
                Some("checkout"),
                "{labels:?}"
            );
            assert_eq!(
                labels.get("tenant").map(String::as_str),
                Some("acme"),
                "{labels:?}"
            );
            let id = labels.get("span_id").expect("a span_id");
            assert!(
                id.len() == 16
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "span_id is 16 lowercase hex digits: {id:?}"
            );
            assert!(
                !labels.contains_key("trace_id"),
                "no OpenTelemetry context: {labels:?}"
            );
            ids.insert(id.clone());
        }
    }
    assert!(
        ids.len() <= 4 && !ids.is_empty(),
        "one id per local root (4 roots), children share it: {ids:?}"
    );
    for labels in in_leaf("split_twenty") {
        assert!(
            !labels.contains_key("span_id") && !labels.contains_key("span_name"),
            "a sample outside every span: {labels:?}"
        );
    }
    // -tagfocus finds a trace's CPU by its span id.
    let one = ids.iter().next().unwrap();
    let top = go_pprof(
        &[
            "-top",
            "-nodecount=200",
            &format!("-tagfocus=span_id={one}"),
        ],
        &body,
    );
    assert!(
        top.contains("split_fifty") && !top.contains("split_twenty"),
        "{top}"
    );
}

/// Feature `ebpf-labels`: the labels where an eBPF profiler reads them (custom-labels ABI
/// v1). This test binary exports the two symbols as the guide tells applications to
/// (`tests/build.rs`), so they are found as a profiler finds them, in the executable's
/// dynamic symbols; the thread's set is read from another thread while the labelled one
/// waits inside its scope, as a profiler reads a stopped thread's memory.
#[cfg(feature = "ebpf-labels")]
mod ebpf {
    use super::*;

    /// `custom_labels_string_t`, `custom_labels_label_t`, `custom_labels_labelset_t` as
    /// the ABI lays them out.
    #[repr(C)]
    struct Text {
        len: usize,
        buf: *const u8,
    }
    #[repr(C)]
    struct Label {
        key: Text,
        value: Text,
    }
    #[repr(C)]
    struct Set {
        storage: *const Label,
        count: usize,
        capacity: usize,
    }

    fn symbol(name: &std::ffi::CStr) -> usize {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the executable
        // and its libraries' dynamic symbols (for a thread-local, the calling thread's).
        let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        assert!(
            !address.is_null(),
            "{name:?} is not among the executable's dynamic symbols"
        );
        address as usize
    }

    /// The labels of the set at `pointer`'s target, as a profiler reads them.
    fn read(pointer: usize) -> BTreeMap<String, String> {
        // SAFETY: the address of a live thread's `custom_labels_current_set`: its thread
        // waits inside its scope while this reads.
        let set = unsafe { *(pointer as *const *const Set) };
        if set.is_null() {
            return BTreeMap::new();
        }
        // SAFETY: a set krabka-pprof published, alive while its thread's word names it.
        let set = unsafe { &*set };
        let text = |text: &Text| {
            // SAFETY: as above; the ABI's strings are `len` bytes at `buf`.
            let bytes = unsafe { std::slice::from_raw_parts(text.buf, text.len) };
            String::from_utf8(bytes.to_vec()).unwrap()
        };
        (0..set.count)
            .map(|at| {
                // SAFETY: `storage` holds `count` labels.
                let label = unsafe { &*set.storage.add(at) };
                (text(&label.key), text(&label.value))
            })
            .collect()
    }

    #[test]
    fn a_thread_in_a_scope_publishes_its_labels_where_ebpf_profilers_read_them() {
        // SAFETY: a `uint32_t` the ABI says holds 1.
        let version = unsafe { *(symbol(c"custom_labels_abi_version") as *const u32) };
        assert_eq!(version, 1);
        let (address, inside) = std::sync::mpsc::channel();
        let (outside, out) = std::sync::mpsc::channel();
        let (leave, left) = std::sync::mpsc::channel::<()>();
        let (end, ended) = std::sync::mpsc::channel::<()>();
        let labelled = std::thread::spawn(move || {
            let own = symbol(c"custom_labels_current_set");
            labels::scope(&[("tenant", "acme"), ("route", "/pay")], || {
                address.send(own).unwrap();
                left.recv().unwrap();
            });
            // Out of the scope, still alive: waits while it is read.
            outside.send(()).unwrap();
            ended.recv().unwrap();
        });
        let pointer = inside.recv().unwrap();
        assert_eq!(
            read(pointer),
            BTreeMap::from([
                ("route".to_owned(), "/pay".to_owned()),
                ("tenant".to_owned(), "acme".to_owned())
            ]),
            "read from another thread while the labelled one waits in its scope"
        );
        leave.send(()).unwrap();
        out.recv().unwrap();
        assert!(
            read(pointer).is_empty(),
            "out of its scope, the thread names no set"
        );
        end.send(()).unwrap();
        labelled.join().unwrap();
        // The main thread has no scope: its own pointer is null.
        assert!(read(symbol(c"custom_labels_current_set")).is_empty());
    }
}
