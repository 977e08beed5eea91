//! The profiler can never hurt the process it watches, nor be fooled by it: a program
//! `exec`'d during a profile runs, a forked child profiles itself, a seccomp filter
//! against `process_vm_readv` (refusing it, or killing for it) still gives fully unwound
//! stacks, another `SIGPROF` handler is never silently replaced, and a thread the kernel
//! will not give a timer of its own is still sampled. Each in a child
//! process (`test_child`), since each changes what the whole process can do. Each child
//! burns CPU, so each test holds `serial()`, as the burners of this process's tests do.

use std::time::{Duration, Instant};

use krabka_pprof_tests::parked::stat_fields;
use krabka_pprof_tests::{
    ChildServer, client, comments, decode, run_child, says, serial, serial_blocking, skip, stacks,
    thread_samples, total, wait_for_backstop, wait_for_timers,
};
use reqwest::StatusCode;

const CHILD: &str = env!("CARGO_BIN_EXE_test_child");

/// Process `pid`'s CPU time, by the kernel's clock for it.
fn cpu_of(pid: u32) -> Duration {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: both calls only write into the values passed.
    let time = unsafe {
        assert_eq!(libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock), 0);
        let mut time: libc::timespec = std::mem::zeroed();
        assert_eq!(libc::clock_gettime(clock, &mut time), 0);
        time
    };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// Reads the child's `/foreign-seen` (the signals its other `SIGPROF` handler has had)
/// every 20 ms, for 3 s at most, until it has not changed for `span` by the client's
/// clock; then the CPU the child used over that flat span. `None` if it never stood
/// still that long.
async fn flat_for(child: &ChildServer, span: Duration) -> Option<Duration> {
    let deadline = Instant::now() + Duration::from_secs(3);
    // Since when the count has had its present value, and the child's CPU then.
    let mut since: Option<(u64, Instant, Duration)> = None;
    while Instant::now() < deadline {
        let cpu = cpu_of(child.pid());
        let seen: u64 = child.text("/foreign-seen").await.parse().unwrap();
        let now = Instant::now();
        match since {
            Some((value, at, cpu_then)) if value == seen => {
                if now - at >= span {
                    return Some(cpu_of(child.pid()).saturating_sub(cpu_then));
                }
            }
            _ => since = Some((seen, now, cpu)),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[test]
fn a_program_execd_during_a_profile_runs() {
    let _serial = serial_blocking();
    let (status, stdout) = run_child(CHILD, "exec-during-profile", Duration::from_secs(60));
    assert!(
        status.success() && stdout.contains("survived"),
        "the exec'd program must run to its end, not die of SIGPROF: {status}, {stdout:?}"
    );
}

#[test]
fn a_forked_child_profiles_itself() {
    let _serial = serial_blocking();
    let (status, stdout) = run_child(CHILD, "fork-profile", Duration::from_secs(60));
    assert!(status.success(), "{status}: {stdout}");
    let child = stdout
        .lines()
        .find(|l| l.starts_with("child "))
        .unwrap_or_else(|| panic!("the child reports: {stdout:?}"));
    assert!(
        child.starts_with("child status=200 ") && !child.ends_with("samples=0"),
        "the child's own profile: {child}"
    );
    let parent = stdout
        .lines()
        .find(|l| l.starts_with("parent "))
        .unwrap_or_else(|| panic!("the parent reports: {stdout:?}"));
    assert!(
        parent.starts_with("parent status=200 ") && parent.ends_with("child_exit=0"),
        "the parent's profile, undisturbed by the fork: {parent}"
    );
}

/// The burner's stacks in a child's profile: leaf `krabka_hot_spin`, unwound to the
/// thread's start.
async fn assert_fully_unwound(child: &mut ChildServer) {
    let response = match client()
        .get(child.url("/debug/pprof/profile?seconds=2&frequency=250"))
        .send()
        .await
    {
        Ok(response) => response,
        // A signal in the status (SIGSYS: a filter killed it; SIGSEGV: a load faulted)
        // says which promise broke.
        Err(err) => panic!(
            "the profile request failed ({err}); the child: {:?}; its log: {}",
            child.exit_status(),
            child.log()
        ),
    };
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    let burner: Vec<_> = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| {
            frames
                .first()
                .is_some_and(|f| f.contains("krabka_hot_spin"))
        })
        .collect();
    let samples: i64 = burner.iter().map(|(_, v)| v[0]).sum();
    // 500 on a quiet machine; 55 where three builds shared its two cores. A few dozen
    // make the share below a measure; fewer would say the sampler stopped.
    assert!(samples > 20, "{samples} samples of the burner");
    let unwound: i64 = burner
        .iter()
        .filter(|(frames, _)| {
            frames.iter().any(|f| f.contains("start_burner"))
                && frames.iter().any(|f| f.contains("thread_start"))
        })
        .map(|(_, v)| v[0])
        .sum();
    assert!(
        unwound as f64 >= samples as f64 * 0.95,
        "{unwound} of {samples} burner stacks unwound to the thread's start: {:?}",
        burner.first()
    );
    assert!(
        stacks(&profile)
            .iter()
            .all(|(frames, _)| !frames.iter().any(|f| f.contains("not unwound"))),
        "no stack left not unwound"
    );
}

#[tokio::test]
async fn a_seccomp_filter_refusing_process_vm_readv_still_gives_whole_stacks() {
    let _serial = serial().await;
    let mut child = ChildServer::start_logged(
        CHILD,
        "serve-cpu",
        &[("KRABKA_TEST_SECCOMP", Some("eperm"))],
    );
    assert_fully_unwound(&mut child).await;
    let log = child.log();
    // Chosen because of the filter, the usual reader is news: an info line.
    assert!(
        log.lines().any(|l| l.contains(" INFO ")
            && l.contains("stack reader: /proc/self/mem")
            && l.contains("seccomp filter")),
        "the log says which reader and why, at info: {log}"
    );
}

#[tokio::test]
async fn a_seccomp_filter_killing_for_process_vm_readv_kills_nothing() {
    let _serial = serial().await;
    let mut child =
        ChildServer::start_logged(CHILD, "serve-cpu", &[("KRABKA_TEST_SECCOMP", Some("kill"))]);
    assert_fully_unwound(&mut child).await;
    assert!(child.is_running(), "the service is alive after its profile");
}

#[tokio::test]
async fn a_thread_with_a_seccomp_filter_of_its_own_lives_and_is_unwound() {
    let _serial = serial().await;
    // One thread's own filter kills the process for process_vm_readv or pread64; the
    // main thread, which /proc/self/status describes, has none.
    let mut child = ChildServer::start_logged(
        CHILD,
        "serve-cpu",
        &[("KRABKA_TEST_THREAD_SECCOMP", Some("1"))],
    );
    assert_fully_unwound(&mut child).await;
    assert!(child.is_running(), "the service is alive after its profile");
    // And after a thread dump, which asks the thread too.
    let dump = client()
        .get(child.url("/debug/pprof/threads?debug=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(dump.status(), StatusCode::OK);
    let text = dump.text().await.unwrap();
    assert!(text.contains("child-burner"), "{text}");
    assert!(
        child.is_running(),
        "the service is alive after a thread dump"
    );
}

#[test]
fn queued_signals_stay_flat_over_sessions_beside_a_thread_that_blocks_them() {
    let _serial = serial_blocking();
    let (status, stdout) = run_child(CHILD, "sigq-sessions", Duration::from_secs(60));
    assert!(status.success(), "{status}: {stdout}");
    if stdout.contains("cannot: not root") {
        eprintln!(
            "SigQ counts every process of a user: this machine cannot give the child a user of \
             its own (not root), so this test shows nothing here"
        );
        return;
    }
    let counts: Vec<u64> = stdout
        .lines()
        .find_map(|line| line.strip_prefix("sigq "))
        .unwrap_or_else(|| panic!("the child reports SigQ: {stdout:?}"))
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 8);
    assert!(
        counts[7] <= counts[0] + 1,
        "SigQ after each of 8 sessions: {counts:?}: a session left a signal queued for good"
    );
}

#[tokio::test]
async fn another_sigprof_handler_is_not_replaced() {
    let _serial = serial().await;
    let child = ChildServer::start_logged(
        CHILD,
        "serve-cpu",
        &[("KRABKA_TEST_FOREIGN_HANDLER", Some("1"))],
    );
    let response = client()
        .get(child.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.text().await.unwrap();
    assert!(
        body.contains("another SIGPROF handler is installed"),
        "the 503 says why: {body}"
    );
}

#[tokio::test]
async fn a_handler_replaced_during_the_window_is_reported_and_its_signals_stop() {
    let _serial = serial().await;
    let mut child = ChildServer::start_logged(CHILD, "serve-cpu", &[]);
    // Long enough that the other handler's count can be watched going flat inside it.
    let url = child.url("/debug/pprof/profile?seconds=8");
    let running = tokio::spawn(async move { client().get(url).send().await });
    let pid = child.pid();
    assert!(
        tokio::task::spawn_blocking(move || wait_for_timers(pid))
            .await
            .unwrap(),
        "the child's sampler armed its timers"
    );
    let replaced = client()
        .get(child.url("/replace-handler"))
        .send()
        .await
        .unwrap();
    assert_eq!(replaced.status(), StatusCode::OK);
    // Counting stops: at its next drain the sampler sees another handler in its place
    // and disarms its timers, so the other handler's count goes flat while the window is
    // still open, and stays flat as the busy thread burns on (were the timers left
    // running, it would grow by one a period of that thread's CPU).
    let flat = flat_for(&child, Duration::from_millis(500)).await;
    let what = "a_handler_replaced_during_the_window_is_reported_and_its_signals_stop: signals \
                stop";
    match flat {
        // The session stops with its window: a count flat after that shows nothing.
        _ if running.is_finished() => skip(
            what,
            "the 8 s window ended before the count could be watched inside it (the machine \
             is busy with other work)",
        ),
        Some(burned) if burned >= Duration::from_millis(100) => {}
        Some(burned) => skip(
            what,
            &format!(
                "the child used only {burned:?} of CPU while the count was flat (the machine \
                 is busy with other work): too little for the timers to have signalled"
            ),
        ),
        None => panic!(
            "the other handler kept getting the sampler's signals 3 s after it replaced the \
             sampler's: the timers were not disarmed"
        ),
    }
    let response = running.await.unwrap().unwrap_or_else(|err| {
        panic!(
            "the profile request failed ({err}); the child is {}; its log:\n{}",
            if child.is_running() {
                "running"
            } else {
                "gone"
            },
            child.log()
        )
    });
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    assert!(total(&profile, 0) > 0, "what was sampled before is kept");
    assert!(
        says(&profile, "replaced"),
        "the profile says so: {:?}",
        comments(&profile)
    );
    let log = child.log();
    assert!(
        log.contains("handler_replaced=true")
            && log.contains("replaced this profiler")
            && log.contains("counting stopped there, the profile covers only the time before"),
        "the response's log line says so, and that counting stopped: {log}"
    );
}

/// The CPU time so far of the child's thread named `name`, by the kernel's count of its
/// clock ticks (`/proc/PID/task/TID/stat`); `None` if no such thread.
fn cpu_of_thread(pid: u32, name: &str) -> Option<Duration> {
    // SAFETY: sysconf reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?.path();
        if std::fs::read_to_string(task.join("comm")).ok()?.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        let fields = stat_fields(&stat);
        let used: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        return Some(Duration::from_millis(used * 1000 / ticks));
    }
    None
}

#[tokio::test]
async fn a_thread_whose_timer_cannot_be_created_is_sampled_by_the_process_timer_and_the_log_says_so()
 {
    let _serial = serial().await;
    let child = ChildServer::start_logged(CHILD, "serve-cpu", &[]);
    let url = child.url("/debug/pprof/profile?seconds=4");
    let sent = Instant::now();
    let running = tokio::spawn(async move { client().get(url).send().await });
    let pid = child.pid();
    assert!(
        tokio::task::spawn_blocking(move || wait_for_backstop(pid))
            .await
            .unwrap(),
        "the child's sampler made its process-wide timer"
    );
    // From here on the kernel refuses to create a timer in the child (its signal-queue
    // limit lowered to 0, as a host's limits may), and a new thread burns: at each drain
    // the sampler fails to give it a timer of its own.
    let what = "a_thread_whose_timer_cannot_be_created_is_sampled_by_the_process_timer";
    match child.text("/untimed-burner").await.as_str() {
        "untimed" => {}
        "timers not limited" => {
            return skip(
                what,
                "this kernel creates POSIX timers whatever RLIMIT_SIGPENDING says: no way to \
                 make the sampler's fail",
            );
        }
        other => panic!("/untimed-burner: {other}"),
    }
    // The window began after the request was sent and lasts 4 s: a thread started within
    // 3 s of the sending meets a second of the window's drains at least.
    if sent.elapsed() > Duration::from_secs(3) {
        return skip(
            what,
            "the thread started over 3 s into the 4 s window (the machine is busy with other              work): too few drains left to require their report",
        );
    }
    let response = running.await.unwrap().unwrap();
    let status = response.status();
    let body = response.bytes().await.unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}; the child's log:\n{}",
        String::from_utf8_lossy(&body),
        child.log()
    );
    let profile = decode(&body);
    let burned = cpu_of_thread(pid, "untimed-burner").expect("the untimed burner runs");
    let log = child.log();
    // The report says why some threads have no timer of their own, and what samples them.
    assert!(
        log.contains("some threads have no CPU timer of their own")
            && log.contains("the process-wide timer samples them"),
        "{log}"
    );
    // And the process-wide timer does: the thread is in the profile.
    if burned < Duration::from_millis(300) {
        return skip(
            what,
            &format!(
                "the untimed thread had only {burned:?} of CPU by the profile's end (the \
                 machine is busy with other work): too little to require its samples"
            ),
        );
    }
    assert!(
        thread_samples(&profile, "untimed-burner") > 0,
        "the untimed thread burned {burned:?} and has no samples: {:?}",
        stacks(&profile)
    );
    assert!(
        thread_samples(&profile, "child-burner") > 0,
        "the timed one has its own"
    );
}

#[tokio::test]
async fn stacks_switched_onto_segments_mapped_anew_are_sampled_and_marked() {
    let _serial = serial().await;
    // A thread that recurses on `stacker` segments, each mapped for one call, switched
    // onto, and unmapped; the next of another size, often smaller, often at the same
    // address. Sampled at 1000 Hz: no sample may read a segment with plain loads
    // (a fault there is SIGSEGV in the handler), and a stack that ends at the switch
    // says so.
    let mut child = ChildServer::start_logged(
        CHILD,
        "serve-cpu",
        &[("KRABKA_TEST_SWITCHED_STACKS", Some("1"))],
    );
    let response = client()
        .get(child.url("/debug/pprof/profile?seconds=2&frequency=1000"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    assert!(child.is_running(), "the service is alive after its profile");
    let switched: Vec<_> = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("krabka_segment_spin")))
        .collect();
    let samples: i64 = switched.iter().map(|(_, v)| v[0]).sum();
    assert!(samples > 20, "{samples} samples on the segments");
    // Each either reaches the thread's start across the switch, or ends in a marker.
    let unexplained: Vec<_> = switched
        .iter()
        .filter(|(frames, _)| {
            !frames.iter().any(|f| f.contains("thread_start"))
                && !frames
                    .last()
                    .is_some_and(|f| f.starts_with("[stack ends here: a switch of stacks"))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} of {} stacks on segments end unmarked short of the thread's start: {:?}",
        unexplained.len(),
        switched.len(),
        unexplained.first()
    );
    // The burner beside it runs on its own stack, learned from the maps: most of its
    // samples are read with plain loads (the profile's count of them).
    let counts = comments(&profile).into_iter().find_map(|c| {
        let (unwound, rest) = c.split_once(" stacks unwound: ")?;
        let direct = rest
            .split(", ")
            .nth(1)?
            .strip_suffix(" read without a system call")?;
        Some((unwound.parse::<u64>().ok()?, direct.parse::<u64>().ok()?))
    });
    let (unwound, direct) = counts.expect("the profile counts its unwinds");
    assert!(
        direct * 5 >= unwound,
        "{direct} of {unwound} stacks read without a system call: the threads' own stacks \
         were not learned"
    );
    // And the next profile and a dump still answer.
    let dump = client()
        .get(child.url("/debug/pprof/threads?debug=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(dump.status(), StatusCode::OK);
    let text = dump.text().await.unwrap();
    assert!(text.contains("child-switcher"), "{text}");
    assert!(child.is_running(), "the service is alive after a dump");
}

#[tokio::test]
async fn a_handler_of_the_hosts_that_leaves_by_siglongjmp_never_cuts_ours_short() {
    let _serial = serial().await;
    // The C timeout idiom: a SIGALRM handler that leaves by siglongjmp, alarms every
    // 20 µs on one thread, so that dozens a second land while the sampler's handler runs
    // on that thread at 1000 Hz. Nested inside it, one would leave it half done (a scratch
    // slot and the buffer's writer count held for good): the drain, and every later
    // request, would hang. Ours blocks every signal while it runs.
    let mut child =
        ChildServer::start_logged(CHILD, "serve-cpu", &[("KRABKA_TEST_LONGJMP", Some("1"))]);
    for seconds in [2, 1] {
        let response = client()
            .get(child.url(&format!(
                "/debug/pprof/profile?seconds={seconds}&frequency=1000"
            )))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let profile = decode(&response.bytes().await.unwrap());
        assert!(
            thread_samples(&profile, "child-jumper") > 0,
            "the jumping thread was sampled"
        );
    }
    let jumps: u64 = child.text("/jumps").await.parse().unwrap();
    assert!(jumps > 1000, "{jumps} alarms left by siglongjmp");
    let dump = client()
        .get(child.url("/debug/pprof/threads?debug=2"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(dump.status(), StatusCode::OK);
    assert!(dump.text().await.unwrap().contains("child-jumper"));
    assert!(child.is_running(), "the service is alive");
    // No handler of the sampler's was left half done (its stop would wait for it, give
    // up and say so).
    let log = child.log();
    assert!(!log.contains("never returned"), "{log}");
}
