//! A build with tokio's task dump: tasks parked in known places are found there, counted
//! per place, the larger group first; a worker stuck in a poll is named instead of dumped
//! (tokio-rs/tokio#8370), a worker that blocks after the route's look meets the 2 s
//! timeout, one dump runs at a time, and a `current_thread` runtime is refused
//! (tokio-rs/tokio#8391).

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Flavor, Options, TaskHook, TestServer, client, run_to_end, serial, serial_blocking,
    unpooled_client,
};
use reqwest::StatusCode;
use tokio::sync::oneshot;

#[pprof_routes]
fn app() -> Router {
    Router::new()
}

/// The place the tests look for: a task that waits here until its sender goes.
async fn parked_in_known_place(release: oneshot::Receiver<()>) {
    let _ = release.await;
}

/// Another place, with a tokio leaf of another kind.
async fn asleep_elsewhere() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// One group of a dump: its count line's number and its tree.
struct Group {
    count: usize,
    tree: String,
}

/// `tasks: total N` and the groups after it, checked to add up to N.
fn parse(text: &str) -> (usize, Vec<Group>) {
    let (header, rest) = text.split_once('\n').expect("a header line");
    let total: usize = header
        .strip_prefix("tasks: total ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("header {header:?}"));
    let groups: Vec<Group> = rest
        .split("\n\n")
        .map(|group| group.trim_start_matches('\n'))
        .filter(|group| !group.is_empty())
        .map(|group| {
            let (count, tree) = group.split_once('\n').expect("a count line, then a tree");
            let count = count
                .strip_suffix(" tasks:")
                .or_else(|| count.strip_suffix(" task:"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("count line {count:?} in {text}"));
            Group {
                count,
                tree: tree.to_owned(),
            }
        })
        .collect();
    assert_eq!(
        groups.iter().map(|group| group.count).sum::<usize>(),
        total,
        "{text}"
    );
    assert!(
        groups.windows(2).all(|pair| pair[0].count >= pair[1].count),
        "largest group first:\n{text}"
    );
    (total, groups)
}

/// The index of the one group whose tree has `function` in it.
fn group_of(groups: &[Group], function: &str, text: &str) -> usize {
    let found: Vec<usize> = (0..groups.len())
        .filter(|&i| groups[i].tree.contains(function))
        .collect();
    assert_eq!(found.len(), 1, "{function} in one group:\n{text}");
    found[0]
}

#[tokio::test]
async fn parked_tasks_are_found_where_they_wait_grouped_largest_first() {
    let _serial = serial().await;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
    let server = TestServer::start(move || {
        for release in receivers {
            tokio::spawn(parked_in_known_place(release));
        }
        for _ in 0..2 {
            tokio::spawn(asleep_elsewhere());
        }
        app()
    });
    let response = client()
        .get(server.url("/debug/pprof/tasks"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["cache-control"], "no-store");
    assert!(headers.get("x-go-pprof").is_none());
    let text = response.text().await.unwrap();

    let (total, groups) = parse(&text);
    assert!(total >= 5, "5 parked tasks and the server's own:\n{text}");
    let parked = group_of(&groups, "parked_in_known_place", &text);
    let asleep = group_of(&groups, "asleep_elsewhere", &text);
    assert_eq!(groups[parked].count, 3, "{text}");
    assert_eq!(groups[asleep].count, 2, "{text}");
    assert!(
        parked < asleep,
        "the group of 3 before the group of 2:\n{text}"
    );
    // Down to the tokio leaf it waits on, with file and line (unsplit debug info).
    let tree = &groups[parked].tree;
    assert!(tree.contains("tokio::sync::oneshot"), "{tree}");
    assert!(
        tree.lines()
            .any(|line| line.contains("parked_in_known_place")
                && line.contains("tests/tasks/dumps.rs:")),
        "{tree}"
    );
    drop(senders);
}

#[tokio::test]
async fn a_worker_stuck_in_a_poll_is_named_and_tokio_is_never_asked() {
    let _serial = serial().await;
    let (block, blocked) = oneshot::channel::<()>();
    let (enter, entered) = oneshot::channel::<()>();
    let server = TestServer::start(move || {
        // One of the two workers polls nothing else for 4 s.
        tokio::spawn(async move {
            if blocked.await.is_ok() {
                enter.send(()).unwrap();
                std::thread::sleep(Duration::from_secs(4));
            }
        });
        app()
    });
    let http = client();
    let url = server.url("/debug/pprof/tasks");
    block.send(()).unwrap();
    // From here on the worker is inside that poll (for 4 s): the route's 250 ms look at
    // the workers, started after this, sees it there throughout.
    entered.await.unwrap();

    let asked = Instant::now();
    let refused = http.get(&url).send().await.unwrap();
    let waited = asked.elapsed();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["x-go-pprof"], "1");
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("has been inside one task's poll for at least 250 ms")
            && text.contains("tokio-rs/tokio#8370"),
        "{text}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "refused after {waited:?}, not after tokio's dump timed out"
    );

    // Once the worker is free, dumps work.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = http.get(&url).send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        if status == StatusCode::OK {
            parse(&text);
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
        assert!(text.contains("inside one task's poll"), "{text}");
        assert!(
            Instant::now() < deadline,
            "still refused after 30 s: {text}"
        );
    }
    // And the runtime shuts down: no worker was left waiting for a dump (tokio#8370).
    let shut_down = tokio::task::spawn_blocking(move || drop(server));
    tokio::time::timeout(Duration::from_secs(30), shut_down)
        .await
        .expect("the server's runtime shuts down within 30 s")
        .unwrap();
}

/// The child's test: set in the environment of the process that runs it.
const IN_CHILD: &str = "KRABKA_TASKS_TIMEOUT_CHILD";

/// A worker that blocks after the route's look still gets its request a 503 at the
/// 2 s timeout, and the turn stays taken meanwhile. In a process of its own (this test
/// binary run again for the ignored test below), which exits right after its checks:
/// what tokio does once that worker goes is its own (`tasks/runtime.rs`' module doc:
/// a worker left at tokio's barrier for good, 4 times in 18), and a dump stuck so would
/// keep this process's one turn for every later test.
#[test]
fn a_worker_blocked_after_the_look_meets_the_2_s_timeout_and_holds_the_turn() {
    let _serial = serial_blocking();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "dumps::held_worker_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_CHILD, "1");
    // Bounded: a child past 120 s is killed. Its stdout is read while it runs, so a long
    // panic message cannot stall it; its stderr is this test's.
    let (status, out) = run_to_end(child, Duration::from_secs(120));
    assert!(
        status.success() && out.contains("held worker: checked"),
        "the child ({status}):\n{out}"
    );
}

#[tokio::test]
#[ignore = "run in a process of its own by a_worker_blocked_after_the_look_…"]
async fn held_worker_child() {
    assert_eq!(
        std::env::var(IN_CHILD).as_deref(),
        Ok("1"),
        "run by a_worker_blocked_after_the_look_…, which gives it a process of its own"
    );
    // The worker about to poll the route's dumper task (spawned in `tasks/runtime.rs`
    // once the route's 250 ms look found every worker free) is held there: a worker
    // that blocks after the look, before tokio is asked.
    let (entered, worker_held) = oneshot::channel::<()>();
    let (_release, held) = mpsc::channel::<()>();
    let once = Mutex::new(Some((entered, held)));
    let hook = TaskHook(Arc::new(move |meta: &tokio::runtime::TaskMeta<'_>| {
        if !meta.spawned_at().file().ends_with("tasks/runtime.rs") {
            return;
        }
        let Some((entered, held)) = once.lock().unwrap().take() else {
            return;
        };
        // Wake the other worker first, as any other traffic would: a task pushed out of
        // this worker's LIFO slot by a second one goes to its queue, and tokio wakes a
        // parked worker to steal it, which then parks on the timer driver this worker
        // does not hold. (Where every other worker sleeps without the driver, a worker
        // blocked in a poll stops the whole runtime, timers too: tokio's, and no
        // route's timeout could fire.)
        tokio::spawn(async {});
        tokio::spawn(async {});
        entered.send(()).unwrap();
        // Until the process exits; bounded all the same.
        let _ = held.recv_timeout(Duration::from_secs(60));
    }));
    let server = TestServer::start_with(
        Options {
            before_task_poll: Some(hook),
            ..Options::default()
        },
        app,
    );
    let http = unpooled_client();
    let url = server.url("/debug/pprof/tasks");

    let asked = Instant::now();
    let first = tokio::spawn(http.get(&url).send());
    worker_held.await.expect("the dumper task is polled");
    // Its turn is the dumper's: a request meanwhile is refused at once.
    let busy = http.get(&url).send().await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    assert_eq!(busy.headers()["retry-after"], "2");

    // The first request ends at the 2 s timeout, while the worker is still held.
    let timed_out = first.await.unwrap().unwrap();
    let waited = asked.elapsed();
    assert_eq!(timed_out.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(timed_out.headers()["x-go-pprof"], "1");
    let text = timed_out.text().await.unwrap();
    assert!(
        text.contains("did not finish within 2 s") && text.contains("take a CPU profile"),
        "{text}"
    );
    assert!(
        waited >= Duration::from_secs(2),
        "the 503 after {waited:?}, before its 2 s were up"
    );
    // The turn outlives the timeout: tokio has not answered, so no second dump.
    let still_busy = http.get(&url).send().await.unwrap();
    assert_eq!(still_busy.status(), StatusCode::CONFLICT);
    let text = still_busy.text().await.unwrap();
    assert!(text.contains("a task dump is already running"), "{text}");
    println!("held worker: checked");
    // Not let go, not shut down: the process ends here.
    std::mem::forget(server);
    std::process::exit(0);
}

#[tokio::test]
async fn one_dump_at_a_time_the_other_refused_at_once() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = unpooled_client();
    let url = server.url("/debug/pprof/tasks");
    // A dump holds its turn for at least its 250 ms look at the workers; a request sent
    // 20 ms after it lands in that turn, unless the machine delays the first one.
    for _ in 0..20 {
        let first = tokio::spawn(http.get(&url).send());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = http.get(&url).send().await.unwrap();
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        if second.status() == StatusCode::OK {
            continue;
        }
        assert_eq!(second.status(), StatusCode::CONFLICT);
        assert_eq!(second.headers()["retry-after"], "2");
        assert_eq!(second.headers()["x-go-pprof"], "1");
        let text = second.text().await.unwrap();
        assert!(text.contains("a task dump is already running"), "{text}");
        return;
    }
    panic!("20 pairs of requests 20 ms apart never overlapped");
}

#[tokio::test]
async fn a_current_thread_runtime_is_refused_naming_the_tokio_bug() {
    let _serial = serial().await;
    let server = TestServer::start_on(Flavor::CurrentThread, app);
    let response = client()
        .get(server.url("/debug/pprof/tasks"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-go-pprof"], "1");
    let text = response.text().await.unwrap();
    assert!(
        text.contains("multi_thread runtime") && text.contains("tokio-rs/tokio#8391"),
        "{text}"
    );
}
