//! Thread dumps in hosts that make them hard, each in a child process (`test_child`),
//! since each changes what the whole process does: threads parked in `vfork`, which
//! cannot take a signal (one is read while it sleeps; the other, in code without unwind
//! tables, cannot be, and makes a dump wait its deadline: twenty dumps at once, one
//! runs, the others are refused at once; a client that hangs up frees the dump at once;
//! in a process that is not dumpable, neither can be read, and each is listed as not
//! answering, with nothing more), threads with seccomp filters of their
//! own that kill the process for the system calls a dump's handler used to make,
//! programs `exec`'d while dumps are taken, and another `SIGURG` handler (a dump is then
//! a 503, and that handler stays).

use std::time::{Duration, Instant};

use krabka_pprof_tests::parked::stat_fields;
use krabka_pprof_tests::{
    ChildServer, client, comments, decode, run_child, says, skip, stacks, string, unpooled_client,
};
use reqwest::StatusCode;

const CHILD: &str = env!("CARGO_BIN_EXE_test_child");

/// The id of the child's thread named `name`, once its `stat` shows it in `state` (at
/// most 10 s).
fn child_thread_in(pid: u32, name: &str, state: char) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
        {
            let Ok(entry) = entry else { continue };
            let dir = entry.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let now = stat_fields(&stat).first().and_then(|s| s.chars().next());
            if comm.trim_end() == name && now == Some(state) {
                return entry.file_name().to_str().unwrap().parse().unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the child's thread {name} never reached state {state}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `debug=2`'s block for thread `tid`.
fn thread_block(dump: &str, tid: u32) -> &str {
    let header = format!("\nthread {tid} \"");
    let start = dump
        .find(&header)
        .unwrap_or_else(|| panic!("thread {tid} is not in the dump:\n{dump}"))
        + 1;
    let end = dump[start..].find("\n\n").map_or(dump.len(), |e| start + e);
    &dump[start..end]
}

#[tokio::test]
async fn twenty_dumps_at_once_beside_a_thread_in_vfork_one_runs_and_the_others_get_409_at_once() {
    let _serial = krabka_pprof_tests::serial().await;
    let child = ChildServer::start(CHILD, "serve-vforked", &[]);
    let readable = child_thread_in(child.pid(), "vfork-clone", 'D');
    let unreadable = child_thread_in(child.pid(), "vfork-asm", 'D');
    let http = unpooled_client();
    let url = child.url("/debug/pprof/threads?debug=2&deadline=2s");
    let started = Instant::now();
    let requests = (0..20).map(|_| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let response = http.get(&url).send().await.unwrap();
            let status = response.status();
            let retry_after = response.headers().get("retry-after").cloned();
            let body = response.text().await.unwrap();
            (status, retry_after, body, sent.elapsed())
        })
    });
    let mut answers = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        answers.push(request.await.unwrap());
    }
    let all = started.elapsed();
    let ok: Vec<_> = answers.iter().filter(|a| a.0 == StatusCode::OK).collect();
    assert_eq!(
        ok.len(),
        1,
        "one dump at a time: {:?}",
        answers.iter().map(|a| (a.0, a.3)).collect::<Vec<_>>()
    );
    for (status, retry_after, body, took) in &answers {
        if *status == StatusCode::OK {
            continue;
        }
        assert_eq!(*status, StatusCode::CONFLICT, "{body}");
        let retry_after: u64 = retry_after
            .as_ref()
            .expect("a Retry-After")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&retry_after), "{retry_after}");
        assert!(body.contains("a thread dump is already running"), "{body}");
        // At once, not after the running dump's 2 s deadline.
        assert!(
            *took < Duration::from_millis(1500),
            "a refusal took {took:?}: it waited for the running dump"
        );
    }
    // The thread in a vfork it made by hand (no unwind table above its system call) is
    // read while it sleeps as far as that goes, and not signalled: its wait is not one a
    // signal leaves alone. The other thread in vfork was read whole while it slept.
    let (_, _, dump, _) = ok[0];
    assert!(all < Duration::from_secs(10), "{all:?}");
    let block = thread_block(dump, unreadable);
    assert!(
        block.contains("[disk sleep")
            && block.contains("read without a signal up to a frame")
            && !block.contains("did not answer"),
        "{block}"
    );
    let block = thread_block(dump, readable);
    assert!(
        block.contains("[disk sleep") && super::block_shows_in(block, "krabka_in_vfork"),
        "{block}"
    );
    assert!(!block.contains("did not answer"), "{block}");
    // The server still dumps afterwards.
    let later = client()
        .get(child.url("/debug/pprof/threads?debug=1&deadline=50ms"))
        .send()
        .await
        .unwrap();
    assert_eq!(later.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dump_whose_client_hangs_up_frees_the_next_at_once() {
    use tokio::io::AsyncWriteExt as _;
    let _serial = krabka_pprof_tests::serial().await;
    let child = ChildServer::start(CHILD, "serve-vforked", &[]);
    child_thread_in(child.pid(), "vfork-asm", 'D');
    let http = unpooled_client();
    let probe = child.url("/debug/pprof/threads?deadline=50ms");
    // A dump that waits 10 s for the thread in vfork, held by a raw connection; a probe
    // sent after it must be refused (else the probe won the turn: again, at most 20 times
    // and 30 s; a server that queues dumps instead answers the probe after the 10 s).
    let mut held = None;
    let mut written_at = Instant::now();
    let trying = Instant::now();
    for _ in 0..20 {
        assert!(
            trying.elapsed() < Duration::from_secs(30),
            "no probe was refused while a 10 s dump ran: dumps queue"
        );
        let mut raw = tokio::net::TcpStream::connect(child.addr).await.unwrap();
        let request = format!(
            "GET /debug/pprof/threads?deadline=10s HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            child.addr
        );
        raw.write_all(request.as_bytes()).await.unwrap();
        raw.flush().await.unwrap();
        written_at = Instant::now();
        let response = http.get(&probe).send().await.unwrap();
        if response.status() == StatusCode::CONFLICT {
            held = Some(raw);
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
        drop(raw);
        // The raw request may hold the turn now, or be refused; either way it ends.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held = held.expect("a 10 s dump held the turn, and a probe was refused");
    drop(held);
    // The server sees the EOF and drops the request's future: the dump stops waiting for
    // the thread in vfork, and the next request gets the turn. A dump left running began
    // after its request was written and refuses probes until its 10 s deadline: a probe
    // answered within 9 s of the writing (the client's clock) can only follow a dump that
    // stopped, however slowly a busy machine lets the server notice the hang-up.
    let mut refusals = 0;
    loop {
        assert!(
            written_at.elapsed() < Duration::from_secs(9),
            "the dump still ran 9 s after its request, its client long gone ({refusals} 409s)"
        );
        let response = http.get(&probe).send().await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert_eq!(response.status(), StatusCode::CONFLICT);
        refusals += 1;
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn threads_that_can_neither_answer_nor_be_read_are_listed_as_not_answering() {
    let _serial = krabka_pprof_tests::serial().await;
    // Its threads in vfork take no signal, and not dumpable, it cannot read them asleep.
    let child = ChildServer::start(CHILD, "serve-vforked-undumpable", &[]);
    let in_vfork = [
        child_thread_in(child.pid(), "vfork-clone", 'D'),
        child_thread_in(child.pid(), "vfork-asm", 'D'),
    ];
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid())).unwrap();
    if status.lines().any(|line| line.starts_with("Uid:\t0\t")) {
        return skip(
            "threads_that_can_neither_answer_nor_be_read_are_listed_as_not_answering",
            "the child could not leave root here (setresuid refused), and root reads every \
             thread's syscall file",
        );
    }
    let http = client();
    let sent = Instant::now();
    let response = http
        .get(child.url("/debug/pprof/threads?debug=2&deadline=1s"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "answered after {took:?}: the dump did not wait its 1 s deadline for the threads \
         in vfork"
    );
    for tid in in_vfork {
        let block = thread_block(&text, tid);
        assert!(
            block.contains("[disk sleep")
                && block.ends_with("]: no stack: it did not answer within 1s")
                && block.lines().count() == 1,
            "{block}"
        );
    }

    // The profile form: the two share one sample, whose one frame says why.
    let response = http
        .get(child.url("/debug/pprof/threads?deadline=1s"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    assert!(
        says(&profile, " 0 read asleep without a signal"),
        "{:?}",
        comments(&profile)
    );
    let stacks = stacks(&profile);
    for tid in in_vfork {
        let sample = profile
            .sample
            .iter()
            .position(|sample| {
                sample.label.iter().any(|label| {
                    string(&profile, label.key) == "tid" && label.num == i64::from(tid)
                })
            })
            .unwrap_or_else(|| panic!("no sample is labelled tid {tid}"));
        assert_eq!(
            stacks[sample],
            (vec!["[did not answer within 1s]".to_owned()], vec![2])
        );
    }
}

#[tokio::test]
async fn threads_with_their_own_seccomp_filter_are_dumped_and_the_process_lives() {
    let _serial = krabka_pprof_tests::serial().await;
    let mut child = ChildServer::start(CHILD, "serve-filtered", &[]);
    let spinning = child_thread_in(child.pid(), "filtered-spin", 'R');
    let sleeping = child_thread_in(child.pid(), "filtered-sleep", 'S');
    for _ in 0..10 {
        let response = client()
            .get(child.url("/debug/pprof/threads?debug=2&deadline=2s"))
            .send()
            .await
            .expect("the child answers: a dump's handler made no forbidden call");
        assert_eq!(response.status(), StatusCode::OK);
        let dump = response.text().await.unwrap();
        for (tid, function) in [
            (spinning, "krabka_filtered_spinning"),
            (sleeping, "krabka_filtered_sleeping"),
        ] {
            let block = thread_block(&dump, tid);
            assert!(super::block_shows_in(block, function), "{block}");
        }
    }
    assert!(child.is_running(), "the filters killed the process");
}

#[tokio::test]
async fn beside_another_sigurg_handler_a_dump_is_a_503_and_the_rest_works() {
    let _serial = krabka_pprof_tests::serial().await;
    let mut child = ChildServer::start(
        CHILD,
        "serve-cpu",
        &[("KRABKA_TEST_FOREIGN_URG_HANDLER", Some("1"))],
    );
    let http = client();
    for route in ["/debug/pprof/threads", "/debug/pprof/goroutine?debug=2"] {
        let response = http.get(child.url(route)).send().await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{route} beside another SIGURG handler"
        );
        let text = response.text().await.unwrap();
        assert!(
            text.contains("another SIGURG handler is installed") && text.contains("remove it"),
            "{route}: the 503 says why and what to do: {text}"
        );
    }
    // CPU profiles ask with SIGPROF (the dump's signal only blocked in their handler).
    let response = http
        .get(child.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "a CPU profile beside it");
    decode(&response.bytes().await.unwrap());
    // The other handler is still the one installed: a SIGURG sent to the child reaches it
    // (its count, which only it raises, grows; 10 s at most).
    let seen = || async { child.text("/foreign-seen").await.parse::<u64>().unwrap() };
    let before = seen().await;
    // SAFETY: a signal to our own child, whose SIGURG handler only counts.
    let sent = unsafe { libc::kill(child.pid() as libc::pid_t, libc::SIGURG) };
    assert_eq!(sent, 0, "kill(SIGURG): {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen().await == before {
        assert!(
            Instant::now() < deadline,
            "the child's own SIGURG handler no longer sees the signal"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(child.is_running());
}

#[test]
fn programs_execd_while_dumps_are_taken_run_to_their_end() {
    // Thirty programs in a row, each exec'd by the one before while that one dumps itself
    // in a loop: a dump's signal pending on the exec'ing thread goes into the new program.
    let (status, stdout) = run_child(CHILD, "exec-during-dumps", Duration::from_secs(120));
    let hops = stdout.lines().filter(|l| l.starts_with("hop ")).count();
    assert!(
        status.success() && stdout.contains("survived") && hops == 30,
        "every exec'd program must run to its end, none die of a dump's signal: {status}, \
         {hops} hops, {stdout:?}"
    );
}
