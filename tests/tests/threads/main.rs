//! Thread dumps over HTTP (`/threads`, `/goroutine`, `/cmdline`): every thread of the
//! process with its stack and state, threads parked in known functions found there, a
//! sleeping thread read without a signal (never interrupted, even if it blocks the
//! signal), a running thread that blocks it listed as such, the profile read by `go tool
//! pprof`, dumps during thread churn and during a CPU profile. A binary of its own: the
//! parked threads (two of them deadlocked for good) live as long as the process. Every
//! test holds `serial()`: the dumps count every thread of the process, and one test's
//! server starting or stopping would show in another's counts. `hostile.rs`: dumps in
//! child processes whose hosts are hostile (a thread in `vfork`, a thread that calls
//! `execve`, threads with seccomp filters of their own).

mod hostile;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::parked::{
    Cast, MaskedSpinner, cast, krabka_spinning, thread_cpu_of, wait_until_asleep,
};
use krabka_pprof_tests::{
    ProcessCpu, Profile, Reader, TestServer, client, comments, decode, profile_window, serial,
    stacks, string, total, total_in,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "10s", cmdline = true)]
fn app() -> Router {
    Router::new()
}

#[pprof_routes(threads = false)]
fn without_threads() -> Router {
    Router::new()
}

#[pprof_routes(guard = krabka_pprof_tests::internal_only, cmdline = true)]
fn guarded() -> Router {
    Router::new()
}

/// The cast, each sleeping member asleep in the kernel, and the burner past its first
/// 10 ms of CPU.
fn parked_cast() -> &'static Cast {
    let cast = cast();
    let deadline = Instant::now() + Duration::from_secs(10);
    while thread_cpu_of(cast.burner.tid) < Duration::from_millis(10) {
        assert!(Instant::now() < deadline, "the burner never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    for parked in cast.all() {
        if parked.tid != cast.burner.tid {
            wait_until_asleep(parked.tid);
        }
    }
    cast
}

async fn get(server: &TestServer, path: &str) -> (StatusCode, String, Vec<u8>) {
    let response = client().get(server.url(path)).send().await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

async fn text(server: &TestServer, path: &str) -> String {
    let (status, content_type, body) = get(server, path).await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    assert_eq!(content_type, "text/plain; charset=utf-8", "{path}");
    body
}

/// `debug=2`'s block for thread `tid`: its header line and its stack.
fn thread_block(dump: &str, tid: u32) -> &str {
    let header = format!("\nthread {tid} \"");
    let start = dump
        .find(&header)
        .unwrap_or_else(|| panic!("thread {tid} is not in the dump:\n{dump}"))
        + 1;
    let end = dump[start..].find("\n\n").map_or(dump.len(), |e| start + e);
    &dump[start..end]
}

/// Whether a stack (its frames' names, leaf first) shows its thread in `function`, as
/// every parked thread's must with glibc. In a static musl binary, a thread asleep in
/// musl's libc, which has no unwind tables, cannot show its callers: its stack is musl's
/// frames, then the marker that says so, and no Rust frame (any would be a guess).
fn shows_in<S: AsRef<str>>(frames: &[S], function: &str) -> bool {
    frames.iter().any(|f| f.as_ref().ends_with(function))
        || cfg!(target_env = "musl") && ends_in_musl_libc(frames)
}

/// Whether `frames` (leaf first) are C frames only, then the marker of code without
/// unwind tables: the stack of a thread in musl's libc in a static binary.
fn ends_in_musl_libc<S: AsRef<str>>(frames: &[S]) -> bool {
    let Some((last, libc)) = frames.split_last() else {
        return false;
    };
    (last.as_ref()).starts_with("[callers unknown: no unwind table covers ")
        && !libc.is_empty()
        && (libc.iter()).all(|f| !f.as_ref().contains("::") && !f.as_ref().starts_with('['))
}

/// [`shows_in`] for a `debug=2` block.
fn block_shows_in(block: &str, function: &str) -> bool {
    shows_in(&frame_lines(block), function)
}

#[tokio::test]
async fn debug_2_shows_every_parked_thread_in_its_function_with_its_state() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let dump = text(&server, "/debug/pprof/threads?debug=2").await;

    let listed = dump.matches("\nthread ").count();
    let first = dump.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("threads: total {listed}, ")),
        "the header counts every thread listed: {first}"
    );
    for parked in cast.all() {
        let block = thread_block(&dump, parked.tid);
        let header = block.lines().next().unwrap();
        assert!(
            header.starts_with(&format!("thread {} \"{}\" [", parked.tid, parked.name)),
            "{header}"
        );
        // The one that can neither be asked nor read past a frame that needs the frame
        // pointer: `a_sleeping_thread_that_blocks_the_signal_is_read_without_it_as_far_as_it_goes`.
        if parked.tid == cast.masked.tid {
            continue;
        }
        assert!(
            block_shows_in(block, parked.function),
            "{} is in {}:\n{block}",
            parked.name,
            parked.function
        );
        let state = if parked.tid == cast.burner.tid && cast.burning() {
            "[running"
        } else {
            "[sleeping"
        };
        assert!(header.contains(state), "{}: {header}", parked.name);
    }
    // The deadlocked pair: each waits in a mutex's lock, on a futex.
    for parked in &cast.deadlocked {
        let block = thread_block(&dump, parked.tid);
        assert!(
            block.contains("lock") || ends_in_musl_libc(&frame_lines(block)),
            "{block}"
        );
        assert!(
            block.lines().next().unwrap().contains(" in futex"),
            "the kernel says it waits on a futex: {block}"
        );
    }
    // The burner has used CPU, and says so.
    let burner = thread_block(&dump, cast.burner.tid);
    let cpu: f64 = burner
        .lines()
        .next()
        .unwrap()
        .split(", ")
        .nth(1)
        .and_then(|s| s.strip_suffix("s CPU]:"))
        .unwrap_or_else(|| panic!("a CPU time in {burner}"))
        .parse()
        .unwrap();
    assert!(cpu > 0.0, "{burner}");
}

#[tokio::test]
async fn more_running_threads_than_scratch_slots_each_answer_with_their_whole_stack() {
    let _serial = serial().await;
    // A running thread answers from its signal handler, copying its stack through one of
    // a few scratch slots (the CPUs and two more, 4 to 16) and giving it back. Twenty at
    // once take them in turn: none may be left to answer with its PC alone.
    /// Stops the spinners however the test ends: twenty threads left spinning would
    /// burden every test after this one.
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = Stop(stop.clone());
    let (ready, arrived) = std::sync::mpsc::channel();
    let spinners: Vec<_> = (0..20)
        .map(|i| {
            let (stop, ready) = (stop.clone(), ready.clone());
            std::thread::Builder::new()
                .name(format!("krabka-spin-{i}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    ready
                        .send(unsafe { libc::syscall(libc::SYS_gettid) } as u32)
                        .unwrap();
                    krabka_spinning(&stop);
                })
                .expect("spawn a spinner")
        })
        .collect();
    let tids: Vec<u32> = spinners.iter().map(|_| arrived.recv().unwrap()).collect();
    let server = TestServer::start(app);
    // Twenty runnable threads on a machine that may be busy: each may wait a while for a
    // core, so the dump waits as long as it may for their answers.
    let dump = text(&server, "/debug/pprof/threads?debug=2&deadline=10s").await;
    drop(stopping);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    for tid in tids {
        let block = thread_block(&dump, tid);
        assert!(block_shows_in(block, "krabka_spinning"), "{block}");
        // Unwound to where the thread began, not cut at its PC.
        assert!(
            block.contains("__rust_begin_short_backtrace"),
            "thread {tid}'s stack is not whole:\n{block}"
        );
    }
}

#[tokio::test]
async fn a_sleeping_thread_that_blocks_the_signal_is_read_without_it_as_far_as_it_goes() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let dump = text(&server, "/debug/pprof/threads?debug=2").await;
    let block = thread_block(&dump, cast.masked.tid);
    // It blocks SIGURG and SIGPROF, and sleeps in the standard library's sleep, whose
    // frame needs the frame pointer: its stack is read without a signal, through that
    // frame where its prologue gives the frame pointer exactly, else up to it, and then
    // the dump says why it goes no further (no frame guessed past it).
    let frames = frame_lines(block);
    assert!(block.contains("[sleeping"), "{block}");
    if cfg!(target_env = "musl") {
        // musl's system call wrappers have no unwind tables: read whole up to them, and
        // marked so, as a signal's answer would be.
        assert!(ends_in_musl_libc(&frames), "{block}");
        return;
    }
    assert!(
        frames
            .first()
            .is_some_and(|leaf| leaf.contains("nanosleep")),
        "read from its leaf: {block}"
    );
    if block_shows_in(block, "krabka_masked") {
        // Read whole: through the sleep, to the function that masked the signals.
        assert!(
            !block.contains("blocks SIGURG"),
            "whole, no line on why it stops: {block}"
        );
    } else {
        assert!(block.contains("blocks SIGURG"), "why it stops: {block}");
    }
}

#[tokio::test]
async fn a_running_thread_that_blocks_the_signal_is_listed_as_such_and_not_waited_for() {
    let _serial = serial().await;
    let _cast = parked_cast();
    let server = TestServer::start(app);
    let spinner = MaskedSpinner::start();
    let started = Instant::now();
    let dump = text(&server, "/debug/pprof/threads?debug=2&deadline=5s").await;
    let elapsed = started.elapsed();
    let (tid, function) = (spinner.tid, spinner.function);
    // Not signalled at all: a SIGURG sent to it would still be pending on it now.
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let pending = status
        .lines()
        .find_map(|line| line.strip_prefix("SigPnd:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .expect("a SigPnd line");
    assert_eq!(
        pending & (1 << (libc::SIGURG - 1)),
        0,
        "the thread that blocks SIGURG was sent it: {status}"
    );
    drop(spinner);
    let block = thread_block(&dump, tid);
    assert!(
        block.contains("[running") && block.contains("no stack: it blocks SIGURG"),
        "{block}"
    );
    assert!(!block.contains(function), "it was not unwound: {block}");
    // Every other thread answered but those that block SIGURG (this one, and a sleeping
    // one that can be read only in part); nobody waited for their 5 s deadline.
    let listed = dump.matches("\nthread ").count();
    let blocking = dump.matches("it blocks SIGURG").count();
    assert!(blocking >= 1, "{dump}");
    let first = dump.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "threads: total {listed}, {} answered within 5s",
            listed - blocking
        ),
        "{dump}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "the dump waited for a thread that cannot answer"
    );
}

#[tokio::test]
async fn a_thread_asleep_in_poll_is_never_interrupted_and_its_caller_is_shown() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let before = cast.poll_interruptions();
    for _ in 0..20 {
        let dump = text(&server, "/debug/pprof/goroutine?debug=2").await;
        let block = thread_block(&dump, cast.poller.tid);
        assert!(
            block.contains("[sleeping") && block_shows_in(block, cast.poller.function),
            "the function that called poll: {block}"
        );
        if cfg!(target_env = "musl") {
            // Its callers cannot be known, but poll can.
            assert!(block.lines().any(|l| l == "poll"), "poll: {block}");
            continue;
        }
        let poll = block
            .lines()
            .position(|l| l == "poll" || l.ends_with("poll"));
        let caller = block
            .lines()
            .position(|l| l.ends_with(cast.poller.function));
        assert!(
            poll.is_some() && poll < caller,
            "poll, then its caller: {block}"
        );
    }
    assert_eq!(
        cast.poll_interruptions() - before,
        0,
        "20 dumps interrupted the poll of a sleeping thread (EINTR)"
    );
}

#[tokio::test]
async fn debug_1_groups_identical_stacks_largest_group_first() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let dump = text(&server, "/debug/pprof/goroutine?debug=1").await;
    assert!(dump.starts_with("threads profile: total "), "{dump}");
    let groups: Vec<&str> = dump.split("\n\n").skip(1).collect();
    let counts: Vec<usize> = groups
        .iter()
        .map(|g| g.split(" @ ").next().unwrap().parse().unwrap())
        .collect();
    assert!(
        counts.windows(2).all(|w| w[0] >= w[1]),
        "largest group first: {counts:?}"
    );
    let tids: Vec<String> = cast.trio.iter().map(|t| format!("({})", t.tid)).collect();
    let trio = groups
        .iter()
        .find(|g| g.contains(tids[0].as_str()))
        .expect("the trio's group");
    for tid in &tids {
        assert!(trio.contains(tid.as_str()), "{tid} in {trio}");
    }
    if cfg!(target_env = "musl") {
        // With every thread asleep in musl's nanosleep, its callers unknown.
        assert!(trio.contains("[callers unknown: "), "{trio}");
    } else {
        assert!(trio.starts_with("3 @ 0x"), "{trio}");
        assert!(
            trio.lines()
                .any(|l| l.starts_with("#\t0x") && l.ends_with(cast.trio[0].function)),
            "{trio}"
        );
    }
    // Every thread is in exactly one group.
    let total: usize = counts.iter().sum();
    let header: usize = dump["threads profile: total ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, header);
}

/// Per sample: its thread ids and value.
fn samples_by_tid(profile: &Profile) -> HashMap<i64, (usize, i64)> {
    let mut found = HashMap::new();
    for (index, sample) in profile.sample.iter().enumerate() {
        let tids: Vec<i64> = sample
            .label
            .iter()
            .filter(|l| string(profile, l.key) == "tid")
            .map(|l| l.num)
            .collect();
        let names = sample
            .label
            .iter()
            .filter(|l| string(profile, l.key) == "thread")
            .count();
        assert_eq!(names, tids.len(), "a name and an id per thread");
        assert_eq!(
            sample.value,
            vec![tids.len() as i64],
            "the value counts the sample's threads"
        );
        for tid in tids {
            assert!(
                found.insert(tid, (index, sample.value[0])).is_none(),
                "thread {tid} is in one sample only"
            );
        }
    }
    found
}

#[tokio::test]
async fn the_profile_has_one_sample_per_distinct_stack_and_go_tool_pprof_reads_it() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    for route in ["threads", "goroutine"] {
        let sent = SystemTime::now();
        let (status, content_type, body) = get(&server, &format!("/debug/pprof/{route}")).await;
        let received = SystemTime::now();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/octet-stream");
        let profile = decode(&body);
        // Its time is when the threads were read, by the client's clock around the
        // request, not the profile's word alone.
        krabka_pprof_tests::assert_window_inside(&profile, sent, received, route);
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (string(&profile, t.ty), string(&profile, t.unit)))
            .collect();
        assert_eq!(types, [("threads", "count")]);
        let by_tid = samples_by_tid(&profile);
        assert_eq!(by_tid.len() as i64, total(&profile, 0));
        let stacks = stacks(&profile);
        let distinct: std::collections::HashSet<&Vec<u64>> =
            profile.sample.iter().map(|s| &s.location_id).collect();
        assert_eq!(
            distinct.len(),
            profile.sample.len(),
            "one sample per distinct stack"
        );
        let trio: Vec<(usize, i64)> = cast
            .trio
            .iter()
            .map(|t| by_tid[&i64::from(t.tid)])
            .collect();
        // With musl, the trio's sample is every thread's asleep in musl's nanosleep.
        assert!(
            (trio.iter())
                .all(|s| s.0 == trio[0].0 && (s.1 == 3 || cfg!(target_env = "musl") && s.1 > 3)),
            "the trio shares one sample of 3: {trio:?}"
        );
        for parked in cast.all() {
            // Read only in part (see the test of the thread that blocks the signal).
            if parked.tid == cast.masked.tid {
                continue;
            }
            let (index, _) = by_tid[&i64::from(parked.tid)];
            let expected = parked.function;
            assert!(
                shows_in(&stacks[index].0, expected),
                "{}: {:?}",
                parked.name,
                stacks[index].0
            );
        }
        let note = comments(&profile)
            .into_iter()
            .find(|c| c.starts_with("krabka-pprof thread dump: "))
            .unwrap_or_else(|| panic!("{:?}", comments(&profile)));
        // The burner runs: it cannot be read asleep, so at least it was signalled.
        let signalled: usize = note
            .rsplit_once(", ")
            .and_then(|(_, tail)| tail.strip_suffix(" signalled")?.parse().ok())
            .unwrap_or_else(|| panic!("the count of threads signalled in {note:?}"));
        assert!(signalled >= 1, "{note}");
        if !cfg!(target_env = "musl") {
            assert_eq!(total_in(&profile, 0, cast.trio[0].function), 3);
        }
        for reader in Reader::TEXT {
            let top = reader.run(&["-top", "-nodecount=1000"], &body);
            assert!(top.contains("Type: threads"), "{reader:?}: {top}");
            let traces = reader.run(&["-traces"], &body);
            if !cfg!(target_env = "musl") {
                assert!(top.contains("krabka_one_of_three"), "{reader:?}: {top}");
                assert!(
                    traces.contains("krabka_deadlock_first")
                        && traces.contains("krabka_deadlock_second"),
                    "{reader:?}: {traces}"
                );
            }
            assert!(
                traces.contains("thread:") && traces.contains("krabka-trio"),
                "{reader:?}: {traces}"
            );
        }
    }
}

#[tokio::test]
async fn text_and_flamegraph_views_show_the_parked_threads() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let top = text(&server, "/debug/pprof/threads?format=text").await;
    // Each thread counts once; a sleeping thread's leaf is the system call it sleeps in.
    assert!(top.contains("Type: threads"), "{top}");
    assert!(top.contains("clock_nanosleep"), "{top}");
    let _ = cast;
    if cfg!(feature = "flamegraph") {
        let (status, content_type, body) = get(&server, "/debug/pprof/threads?format=svg").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "image/svg+xml");
        let svg = String::from_utf8(body).unwrap();
        krabka_pprof_tests::assert_valid_xml(&svg);
        // With musl, asleep in musl's nanosleep, its callers unknown.
        let sleeper = if cfg!(target_env = "musl") {
            "callers unknown"
        } else {
            cast.sleeper.function
        };
        assert!(svg.contains(sleeper), "the sleeper is drawn");
    }
}

#[tokio::test]
async fn a_hundred_dumps_during_thread_churn_all_answer_and_leave_nothing_behind() {
    let _serial = serial().await;
    let cast = parked_cast();
    let server = TestServer::start(app);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Threads that start and exit as fast as they can, for at most 60 s.
    let churn: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(60);
                let mut spawned = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                    let batch: Vec<_> = (0..8)
                        .map(|_| std::thread::spawn(|| std::hint::black_box(1 + 1)))
                        .collect();
                    for thread in batch {
                        thread.join().unwrap();
                    }
                    spawned += 8;
                }
                spawned
            })
        })
        .collect();
    let mut exited = 0;
    // A deadline generous for a 2-core machine busy with churn: every thread that can
    // answer must, and none may go missing.
    for _ in 0..100 {
        let dump = text(&server, "/debug/pprof/threads?debug=2&deadline=5s").await;
        exited += dump.matches("no stack: it exited during the dump").count();
        assert!(!dump.contains("could not be signalled"), "{dump}");
        // Every parked thread that can answer did.
        let sleeper = thread_block(&dump, cast.sleeper.tid);
        assert!(block_shows_in(sleeper, cast.sleeper.function), "{sleeper}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let spawned: u64 = churn.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(spawned > 0);
    eprintln!("{spawned} threads came and went; {exited} exited mid-dump");
    // Afterwards, with the churn over, every thread answers but those that block SIGURG
    // (the masked one is read while it sleeps, in part): no reply slot or handler was
    // left behind.
    let dump = text(&server, "/debug/pprof/threads?debug=2").await;
    let listed = dump.matches("\nthread ").count();
    let blocking = dump.matches("it blocks SIGURG").count();
    assert!(
        dump.starts_with(&format!(
            "threads: total {listed}, {} answered",
            listed - blocking
        )),
        "{}",
        dump.lines().next().unwrap()
    );
}

#[tokio::test]
async fn a_dump_during_a_cpu_profile_leaves_its_samples_intact() {
    let _serial = serial().await;
    let cast = parked_cast();
    assert!(cast.burning(), "the burner runs for 10 minutes");
    let server = TestServer::start(app);
    let process = ProcessCpu::start();
    let profile = {
        let url = server.url("/debug/pprof/profile?seconds=2");
        let profile = tokio::spawn(async move {
            let response = client().get(url).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.bytes().await.unwrap()
        });
        // Each dump's request and answer by the client's clock: how many fit in the
        // window depends on the machine (an unoptimised build on a busy one takes
        // hundreds of milliseconds a dump); that one did is what this test needs.
        let mut dumps: Vec<(SystemTime, SystemTime)> = Vec::new();
        while !profile.is_finished() && dumps.len() < 200 {
            let sent = SystemTime::now();
            let dump = text(&server, "/debug/pprof/threads?debug=2").await;
            dumps.push((sent, SystemTime::now()));
            let burner = thread_block(&dump, cast.burner.tid);
            assert!(
                burner.contains(cast.burner.function),
                "the burner is dumped while it is profiled: {burner}"
            );
        }
        let profile = decode(&profile.await.unwrap());
        let (start, end) = profile_window(&profile);
        let inside = dumps
            .iter()
            .filter(|(sent, answered)| *sent >= start && *answered <= end)
            .count();
        assert!(
            inside >= 1,
            "none of {} dumps was asked and answered inside the profile's window",
            dumps.len()
        );
        profile
    };
    let notes = comments(&profile);
    assert!(
        !notes.iter().any(|c| c.contains("foreign SIGPROF")),
        "the dumps' signals are not counted as foreign: {notes:?}"
    );
    // Σ cpu/nanoseconds matches the process's CPU time over the window, as without dumps:
    // the process's own clock, read beside the window, not the profile's comment.
    let (start, end) = profile_window(&profile);
    let process_ms = process.cpu_within(start, end).as_secs_f64() * 1e3;
    let sampled_ms = total(&profile, 1) as f64 / 1e6;
    assert!(
        (sampled_ms - process_ms).abs() <= process_ms * 0.15,
        "sampled {sampled_ms} ms of the process's {process_ms} ms over the window"
    );
    assert!(total_in(&profile, 0, "krabka_burning") > 0);
}

#[tokio::test]
async fn cmdline_is_the_command_line_separated_by_nul() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let (status, content_type, body) = get(&server, "/debug/pprof/cmdline").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/plain; charset=utf-8");
    let expected: Vec<Vec<u8>> = std::env::args_os()
        .map(|a| a.as_encoded_bytes().to_vec())
        .collect();
    assert_eq!(body, expected.join(&0u8));
}

#[tokio::test]
async fn threads_false_leaves_the_thread_routes_out() {
    let _serial = serial().await;
    let server = TestServer::start(without_threads);
    for route in ["threads", "goroutine", "tasks"] {
        let (status, _, _) = get(&server, &format!("/debug/pprof/{route}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{route}");
    }
    let index = server.text("/debug/pprof/").await;
    assert!(!index.contains("<code>threads</code>"), "{index}");
}

/// A command line often carries secrets: `/cmdline` answers only with `cmdline = true`,
/// and otherwise says which key turns it on; the index leaves it out.
#[tokio::test]
async fn cmdline_is_off_unless_asked_for_and_says_which_key() {
    let _serial = serial().await;
    let server = TestServer::start(without_threads);
    let (status, content_type, body) = get(&server, "/debug/pprof/cmdline").await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(content_type, "text/plain; charset=utf-8");
    assert!(body.contains("cmdline = true"), "{body}");
    let own_args = std::env::args().next().unwrap();
    assert!(!body.contains(&own_args), "no argument leaks: {body}");
    let index = server.text("/debug/pprof/").await;
    assert!(!index.contains("<code>cmdline</code>"), "{index}");
}

#[tokio::test]
async fn the_index_lists_the_thread_routes() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let index = server.text("/debug/pprof/").await;
    for route in ["threads", "goroutine", "cmdline", "tasks"] {
        assert!(
            index.contains(&format!("<code>{route}</code>")),
            "{route}: {index}"
        );
    }
    assert!(index.contains("href=\"threads?debug=2\""), "{index}");
}

#[tokio::test]
async fn bad_queries_get_400_saying_what_to_send_and_the_next_dump_works() {
    let _serial = serial().await;
    let _ = parked_cast();
    let server = TestServer::start(app);
    for (query, says) in [
        ("debug=3", "`debug` must be 0"),
        ("debug=1&format=svg", "send one of them"),
        (
            "deadline=0s",
            "`deadline` must be a duration from 1ms to 10s",
        ),
        ("deadline=11s", "`deadline` must be"),
        ("deadline=soon", "`deadline` must be"),
        ("format=png", "`format` must be"),
        ("debug=1&debug=2", "more than once"),
    ] {
        let (status, content_type, body) =
            get(&server, &format!("/debug/pprof/threads?{query}")).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(content_type, "text/plain; charset=utf-8");
        assert!(body.contains(says), "{query}: {body}");
    }
    let dump = text(&server, "/debug/pprof/threads?debug=1&deadline=250ms").await;
    assert!(dump.contains("answered within 250ms"), "{dump}");
}

#[tokio::test]
async fn the_thread_routes_obey_the_guard_like_every_route() {
    let _serial = serial().await;
    let server = TestServer::start(guarded);
    for route in [
        "threads",
        "goroutine",
        "threads?debug=2",
        "cmdline",
        "tasks",
    ] {
        let url = server.url(&format!("/debug/pprof/{route}"));
        let refused = client().get(&url).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{route}");
        let admitted = client()
            .get(&url)
            .header("x-internal", "yes")
            .send()
            .await
            .unwrap();
        assert_ne!(admitted.status(), StatusCode::FORBIDDEN, "{route}");
        if route != "tasks" {
            assert_eq!(admitted.status(), StatusCode::OK, "{route}");
        }
    }
}

/// The names of a `debug=2` block's frames (and markers), leaf first: the lines after the
/// header that are not addresses.
fn frame_lines(block: &str) -> Vec<&str> {
    block
        .lines()
        .skip(1)
        .filter(|line| !line.starts_with('\t'))
        .collect()
}

/// Asserts that `frames` (leaf first) pass through `function`, then end at the code
/// without unwind tables with the marker that says its callers are not shown, and that
/// the decoy the unwinder would have guessed is not among them.
#[cfg(target_arch = "x86_64")]
fn assert_ends_at_untabled_code<S: AsRef<str> + std::fmt::Debug>(
    frames: &[S],
    function: &str,
    what: &str,
) {
    use krabka_pprof_tests::untabled::{DECOY, TRAMPOLINE};
    let names: Vec<&str> = frames.iter().map(AsRef::as_ref).collect();
    let at = (names.iter().position(|n| *n == TRAMPOLINE))
        .unwrap_or_else(|| panic!("{what}: no {TRAMPOLINE} in {names:?}"));
    assert!(
        names[..at].iter().any(|n| n.ends_with(function)),
        "{what}: {function} below the trampoline: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n.ends_with(DECOY)),
        "{what}: the guessed caller is shown: {names:?}"
    );
    assert_eq!(
        names.len(),
        at + 2,
        "{what}: the trampoline, then one marker, end the stack: {names:?}"
    );
    assert!(
        names[at + 1].starts_with("[callers unknown: no unwind table covers "),
        "{what}: the marker says why the stack ends: {names:?}"
    );
}

/// Code without unwind tables (musl's libc in a static binary; here a trampoline in
/// assembly that leaves a decoy frame record where its frame pointer points) ends the
/// stack, marked: the unwinder could go on past it only by guessing from the stack, and
/// would show the decoy as its caller. Checked in a dump of a thread read asleep, of one
/// signalled while it runs, and in a CPU profile of the running one.
#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn code_without_unwind_tables_ends_the_stack_marked_and_no_guessed_caller_is_shown() {
    use krabka_pprof_tests::untabled::{self, PARKED_IN, SPINNING_IN};
    let _serial = serial().await;
    let parked = untabled::parked();
    wait_until_asleep(parked);
    let spinner = untabled::Spinner::start();
    let server = TestServer::start(app);
    // The spinner reports its id before it enters the trampoline: dump until it is there.
    let mut dump = String::new();
    for _ in 0..100 {
        dump = text(&server, "/debug/pprof/threads?debug=2").await;
        if thread_block(&dump, spinner.tid).contains(SPINNING_IN) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asleep = thread_block(&dump, parked);
    assert!(asleep.contains("[sleeping"), "{asleep}");
    if cfg!(target_env = "musl") {
        // Asleep in musl's libc, before the trampoline is reached.
        assert!(ends_in_musl_libc(&frame_lines(asleep)), "{asleep}");
    } else {
        assert_ends_at_untabled_code(&frame_lines(asleep), PARKED_IN, "read asleep");
    }
    let running = thread_block(&dump, spinner.tid);
    assert_ends_at_untabled_code(&frame_lines(running), SPINNING_IN, "signalled");

    let response = (client().get(server.url("/debug/pprof/profile?seconds=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    let behind: Vec<Vec<String>> = (stacks(&profile).into_iter())
        .map(|(names, _)| names)
        .filter(|names| names.iter().any(|n| n.ends_with(SPINNING_IN)))
        .collect();
    assert!(!behind.is_empty(), "the spinner was sampled");
    for names in &behind {
        assert_ends_at_untabled_code(names, SPINNING_IN, "sampled");
    }
    drop(spinner);
}
