//! The profile tells the truth where a process-wide timer lied: libc's callers are kept by
//! default, a thread that blocks `SIGPROF` is not charged to an idle one, two busy cores
//! are not capped, the weights add up to the CPU used at every frequency, signals that are
//! not the sampler's are not samples, short-lived threads still count, and deep stacks say
//! they were cut. Each compares the profile with the CPU clocks of the threads that did
//! the work. Frequencies near the kernel's tick come from the tick as measured here
//! (`kernel_tick_hz`), not from one kernel's `CONFIG_HZ`; a test that this machine cannot
//! make meaningful (one core, a tick above every frequency the route takes) says so and
//! returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, ProcessCpu, Profile, Readings, TestServer, assert_sample_count, assert_split,
    assert_window_inside, client, comments, cores, decode, hot, just_under_the_tick,
    kernel_tick_hz, process_cpu_time, profile_window, quiet_cores, says, serial, skip, stacks,
    string, thread_cpu_time, thread_total, total, total_in, wait_for_timers,
};
use reqwest::StatusCode;

/// Default settings, apart from a window long enough for these tests (on a 100 Hz
/// kernel, a split needs 16 s of two threads for its samples), and requests up to
/// 1000 Hz (the weights are checked at every frequency the route takes).
#[pprof_routes(cpu_max = "30s", frequency_max = 1000)]
fn app() -> Router {
    Router::new()
}

/// A profile request running while the test does something in the process.
fn start_profile(
    server: &TestServer,
    seconds: u64,
    frequency: u32,
) -> tokio::task::JoinHandle<(Profile, Duration)> {
    let url = server.url(&format!(
        "/debug/pprof/profile?seconds={seconds}&frequency={frequency}"
    ));
    tokio::spawn(async move {
        let cpu_before = process_cpu_time();
        let response = client().get(url).send().await.unwrap();
        let cpu_used = process_cpu_time() - cpu_before;
        assert_eq!(response.status(), StatusCode::OK);
        (decode(&response.bytes().await.unwrap()), cpu_used)
    })
}

async fn profile_at(server: &TestServer, seconds: u64, frequency: u32) -> (Profile, Duration) {
    start_profile(server, seconds, frequency).await.unwrap()
}

/// The highest frequency up to 250 Hz that this kernel's tick does not cap: as many
/// samples per second as the tests may ask of the machine.
fn fast_frequency() -> u32 {
    just_under_the_tick(kernel_tick_hz()).min(250)
}

#[tokio::test]
async fn memcpy_time_is_under_its_rust_caller_by_default() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    // The truth: the CPU each part used, timed by its own thread around each call and
    // read every 2 ms, so that only what it used inside the profile's window counts.
    let counters = Readings::start("copy-counters", || hot::read(&hot::COPY_CPU_NANOS));
    // The CPU for 4000 samples (more than assert_split's 2000 where the machine, busy with
    // other work, folds periods into fewer signals): a binomial error under a point for
    // each share.
    let frequency = fast_frequency();
    let burner = Burner::start_with(2, Duration::from_secs(60), hot::copy_round);
    let cpu = Duration::from_secs_f64(4000.0 / f64::from(frequency));
    let seconds = match burner.window_for(cpu, 4, 30).await {
        Ok(seconds) => seconds,
        Err(why) => return skip("memcpy_time_is_under_its_rust_caller_by_default", &why),
    };
    let sent = SystemTime::now();
    let (profile, _) = profile_at(&server, seconds, frequency).await;
    let (start, end) = assert_window_inside(&profile, sent, SystemTime::now(), "the profile");
    drop(burner);

    let measured = counters.growth_within(start, end);
    let functions = ["split_fifty", "copy_forty", "split_twenty"];
    // The copy's CPU per round depends on the memory bandwidth, which other work on the
    // machine takes: its share drifts further from its nominal 40 % than a compute loop's
    // (50.3 % in one CI run beside two builds). 15 points still fails a workload gone
    // wrong (a function that never runs). The profile is held to 5 points of the measured
    // split, not the 3 of a compute loop's (`fidelity`): in one CI run beside the other
    // HTTP tests it gave the copy 39.6 % where its clock said 36.2 (4972 samples), where
    // runs here, idle and beside two busy loops, came within 1.6. What this test guards
    // is coarser: memcpy's samples lost, or charged to a caller other than the copy's,
    // take the copy's share towards nothing.
    let parts = assert_split(&profile, functions, measured, [40.0, 40.0, 20.0], 15.0, 5.0)
        .unwrap_or_else(|why| {
            // The split cannot be judged here; where memcpy's samples go still can.
            skip(
                "memcpy_time_is_under_its_rust_caller_by_default (its split)",
                &why,
            );
            functions.map(|f| total_in(&profile, 0, f))
        });
    // The copy's samples are memcpy in libc (named `[libc.so.6]` where libc's symbol table
    // is stripped), unwound to the Rust function that called it.
    let copy_stacks: Vec<_> = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("copy_forty")))
        .collect();
    let in_libc: i64 = copy_stacks
        .iter()
        .filter(|(frames, _)| {
            ["memcpy", "memmove", "libc.so"]
                .iter()
                .any(|name| frames[0].contains(name))
        })
        .map(|(_, values)| values[0])
        .sum();
    assert!(
        in_libc as f64 >= parts[1] as f64 * 0.7,
        "memcpy leaves under copy_forty: {in_libc} of {}; leaves: {:?}",
        parts[1],
        copy_stacks
            .iter()
            .map(|(frames, values)| (frames[0].as_str(), values[0]))
            .collect::<Vec<_>>()
    );
}

/// Burns CPU with `SIGPROF` blocked, as librdkafka's threads run.
fn burn_blocking_sigprof() {
    // SAFETY: blocks one signal in this thread's own mask (again: it is idempotent).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPROF);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    std::hint::black_box(hot::krabka_hot_spin(200_000));
}

#[tokio::test]
async fn a_thread_that_blocks_sigprof_is_not_charged_to_another() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let blocker = Burner::start_with(1, Duration::from_secs(30), burn_blocking_sigprof);
    let process = ProcessCpu::start();
    let (profile, _) = profile_at(&server, 3, 99).await;
    let timeline = blocker.finish();

    // The truth: the blocked thread's own CPU clock, and the process's, inside the
    // profile's window.
    let (start, end) = profile_window(&profile);
    let truth = timeline.cpu_within(start, end).as_nanos() as f64;
    let cpu_used = process.cpu_within(start, end);
    let marker = "[thread burner-0: blocks SIGPROF, not sampled]";
    let reported = total_in(&profile, 1, marker) as f64;
    let all = total(&profile, 1);
    eprintln!(
        "blocked: {reported} ns under the marker, its clock {truth} ns; {all} ns in all, the \
         process used {cpu_used:?}"
    );
    assert!(
        (reported - truth).abs() <= truth * 0.1,
        "the blocked thread's CPU must appear under its marker: {reported} ns, its clock says \
         {truth} ns"
    );
    let idle = total_in(&profile, 1, "epoll_wait") as f64;
    assert!(
        idle < truth * 0.1,
        "{idle} ns charged to epoll_wait: the blocked thread's CPU went to an idle thread"
    );
    assert!(
        (all as f64 - cpu_used.as_nanos() as f64).abs() <= cpu_used.as_nanos() as f64 * 0.1,
        "the profile's total {all} ns must still match the process's {cpu_used:?} over its \
         window"
    );
}

/// The regression this guards is a process-wide timer (`ITIMER_PROF`), which the kernel
/// fires at most once per tick for the whole process: two threads busy on two cores at a
/// frequency just under the tick would then get about half their samples.
#[tokio::test]
async fn two_busy_threads_just_under_the_tick_are_not_capped() {
    let _serial = serial().await;
    let name = "two_busy_threads_just_under_the_tick_are_not_capped";
    let cores = cores();
    if cores < 2 {
        skip(
            name,
            &format!(
                "this process may run on {cores} core: two busy threads never run at once, \
                 so a cap of one signal per tick for the whole process cannot show"
            ),
        );
        return;
    }
    let tick = kernel_tick_hz();
    let frequency = just_under_the_tick(tick);
    let server = TestServer::start(app);
    let burner = Burner::start(2, Duration::from_secs(30));
    let (profile, _) = profile_at(&server, 3, frequency).await;
    let timeline = burner.finish();

    let (start, end) = profile_window(&profile);
    let cpu = timeline.cpu_within(start, end);
    let wall = end.duration_since(start).unwrap();
    let expected = cpu.as_secs_f64() * f64::from(frequency);
    let samples = total_in(&profile, 0, "Burner") as f64;
    let share = timeline.least_core_share(start, end);
    eprintln!(
        "{frequency} Hz on a {tick} Hz tick: {samples} samples for {cpu:?} of CPU in {wall:?}, \
         expected {expected:.0}; each burner had a core {:.0}% of the window",
        share * 100.0
    );
    let nanos = total_in(&profile, 1, "Burner") as f64;
    assert!(
        (nanos - cpu.as_nanos() as f64).abs() <= cpu.as_nanos() as f64 * 0.1,
        "cpu/nanoseconds {nanos} for {cpu:?}"
    );
    if !quiet_cores(share) {
        skip(
            name,
            &format!(
                "one burner had a core for only {:.0}% of the window (the machine is busy with \
                 other work): its timer fired only at the ticks that found it running, so \
                 neither the count nor a process-wide cap can show here (cpu/nanoseconds was \
                 checked)",
                share * 100.0
            ),
        );
        return;
    }
    assert!(
        samples >= expected * 0.9,
        "{samples} samples for {cpu:?} of CPU at {frequency} Hz: expected at least 90% of \
         {expected:.0}"
    );
    // With both burners on their cores throughout, that is more than a process-wide timer
    // could have sent: one signal per tick of the window.
    let ceiling = wall.as_secs_f64() * f64::from(tick);
    assert!(
        samples > ceiling,
        "{samples} samples in {wall:?}: no more than one signal per {tick} Hz tick for the \
         whole process"
    );
}

#[tokio::test]
async fn weights_add_up_to_the_cpu_used_at_every_frequency() {
    let _serial = serial().await;
    let tick = kernel_tick_hz();
    // The low frequencies, just under the tick, the tick itself, and above it as far as the
    // route goes: at twice the tick and more a timer fires on at most every other period.
    let mut frequencies = vec![19, 99, just_under_the_tick(tick), tick, 2 * tick, 1000];
    frequencies.retain(|&f| f <= 1000);
    frequencies.sort_unstable();
    frequencies.dedup();
    let capped: Vec<u32> = frequencies
        .iter()
        .copied()
        .filter(|&f| f >= 2 * tick)
        .collect();
    if capped.is_empty() {
        skip(
            "weights_add_up_to_the_cpu_used_at_every_frequency (its capped half)",
            &format!(
                "the kernel's tick is {tick} Hz: no frequency the route takes (at most \
                 1000 Hz) is twice it, so a capped rate cannot show here; the weights are \
                 still checked at {frequencies:?}"
            ),
        );
    }
    let server = TestServer::start(app);
    let process = ProcessCpu::start();
    for threads in [1, 2] {
        for &frequency in &frequencies {
            let burner = Burner::start(threads, Duration::from_secs(30));
            let (profile, _) = profile_at(&server, 2, frequency).await;
            let timeline = burner.finish();
            let (start, end) = profile_window(&profile);
            // The process's CPU over the window itself: around the request it would
            // also count the symbolizing and rendering after it.
            let cpu_used = process.cpu_within(start, end);
            let burned = timeline.cpu_within(start, end).as_nanos() as f64;
            let in_burners = total_in(&profile, 1, "Burner") as f64;
            let all = total(&profile, 1) as f64;
            eprintln!(
                "{threads} threads at {frequency} Hz ({tick} Hz tick): burners {in_burners:.0} \
                 of {burned:.0} ns, all {all:.0} of {cpu_used:?}; {:?}",
                comments(&profile)
            );
            assert!(
                (in_burners - burned).abs() <= burned * 0.1,
                "{threads} threads at {frequency} Hz: the burners' samples stand for \
                 {in_burners:.0} ns, their clocks say {burned:.0} ns"
            );
            let process = cpu_used.as_nanos() as f64;
            // Each thread's CPU counts in whole periods: one that ran part of a period at
            // either end of the window may be a period over or under. Where the burners
            // had most of the machine that is well inside 10 %; at 19 Hz (53 ms periods)
            // on a machine busy with other work, where they had 0.7 s of the 2 s, it is
            // not, so each thread the profile names is allowed its period.
            let named: std::collections::HashSet<i64> = profile
                .sample
                .iter()
                .flat_map(|sample| &sample.label)
                .filter(|label| string(&profile, label.key) == "thread")
                .map(|label| label.str)
                .collect();
            let slack = process * 0.1 + (named.len() + 1) as f64 * profile.period as f64;
            assert!(
                (all - process).abs() <= slack,
                "{threads} threads at {frequency} Hz: Σ cpu/nanoseconds {all:.0}, the process \
                 used {process:.0} ns over the window ({} threads named, {slack:.0} ns slack)",
                named.len()
            );
            let says_capped = says(&profile, "capped");
            if capped.contains(&frequency) {
                assert!(
                    says_capped,
                    "at {frequency} Hz, twice the {tick} Hz tick or more, the profile says the \
                     rate was capped"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_that_are_not_the_samplers_are_not_samples() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(30));
    let running = start_profile(&server, 3, 99);
    tokio::task::spawn_blocking(|| {
        assert!(
            wait_for_timers(std::process::id()),
            "the sampler armed its timers"
        );
        // 400 foreign SIGPROFs in about a second: kill(2) to the process, and raise(3).
        for i in 0..400 {
            // SAFETY: sending SIGPROF to this process, whose handler the profile installed.
            unsafe {
                if i % 2 == 0 {
                    libc::kill(libc::getpid(), libc::SIGPROF);
                } else {
                    libc::raise(libc::SIGPROF);
                }
            }
            std::thread::sleep(Duration::from_micros(2500));
        }
    })
    .await
    .unwrap();
    let (profile, _) = running.await.unwrap();
    let timeline = burner.finish();

    let (start, end) = profile_window(&profile);
    let cpu = timeline.cpu_within(start, end);
    let share = timeline.least_core_share(start, end);
    let expected = cpu.as_secs_f64() * 99.0;
    let burner_samples = total_in(&profile, 0, "Burner") as f64;
    // The signals land on the sending thread (kill prefers it, raise targets it), whose
    // own CPU is a fraction of a millisecond: counted, they would be 400 samples there.
    let on_sender = total_in(&profile, 0, "signals_that_are_not_the_samplers");
    eprintln!(
        "{burner_samples} burner samples, {expected:.0} expected, {on_sender} on the sender; {:?}",
        comments(&profile)
    );
    assert_sample_count("the burner", burner_samples, cpu, 99, share, 0.15);
    assert!(
        on_sender <= 5,
        "{on_sender} samples on the thread that sent 400 foreign SIGPROFs: they were counted"
    );
    assert!(
        comments(&profile)
            .iter()
            .any(|c| c.contains("foreign SIGPROF") && !c.starts_with("0 ")),
        "the profile says it ignored foreign signals: {:?}",
        comments(&profile)
    );
}

#[tokio::test]
async fn short_lived_threads_are_counted() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let used = Arc::new(AtomicU64::new(0));
    // Each short-lived thread's wall time over its work: against its CPU, how much of a
    // core it had (the kernel's clocks, outside the profiler).
    let walled = Arc::new(AtomicU64::new(0));
    let spawner = {
        let (stop, used, walled) = (stop.clone(), used.clone(), walled.clone());
        std::thread::spawn(move || {
            let limit = Instant::now() + Duration::from_secs(30);
            let mut spawned = 0u32;
            // 200 threads a second, each a few milliseconds of CPU.
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                let (used, walled) = (used.clone(), walled.clone());
                std::thread::Builder::new()
                    .name("short-lived".into())
                    .spawn(move || {
                        let (start, wall) = (thread_cpu_time(), Instant::now());
                        std::hint::black_box(hot::krabka_short_lived(300_000));
                        used.fetch_add(
                            (thread_cpu_time() - start).as_nanos() as u64,
                            Ordering::Relaxed,
                        );
                        walled.fetch_add(wall.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    })
                    .unwrap()
                    .join()
                    .unwrap();
                spawned += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            spawned
        })
    };
    let asked = Instant::now();
    let (profile, cpu_used) = profile_at(&server, 3, 99).await;
    let answered = asked.elapsed();
    stop.store(true, Ordering::Relaxed);
    let spawned = spawner.join().unwrap();

    let short = total_in(&profile, 1, "krabka_short_lived") as f64;
    let truth = used.load(Ordering::Relaxed) as f64 * 3.0 / 3.0;
    let all = total(&profile, 1) as f64;
    eprintln!(
        "{spawned} threads; short-lived work {short:.0} ns in the profile, {truth:.0} ns measured \
         over the whole run; all {all:.0} ns of {cpu_used:?}"
    );
    // A quiet machine spawns 400 over the request and CI's busy one 300: a hundred, each
    // shorter than the 10 ms sampling period, is what makes the case; the rate itself is
    // the machine's, not the profiler's, so it is not judged here.
    assert!(
        spawned >= 100,
        "{spawned} threads: the spawner was too slow to test this (100 needed)"
    );
    // Where the short-lived threads shared their core with other work (a machine busy
    // with another job), the backstop's signals come late and folded: one that lands on a
    // timed thread is dropped (that thread's own timer counts it), and the short-lived
    // threads' share of it is counted from the process's clock under the marker instead
    // of unwound.
    let share = used.load(Ordering::Relaxed) as f64 / walled.load(Ordering::Relaxed).max(1) as f64;
    let marked = total_in(&profile, 1, "[threads too short-lived to be sampled]") as f64;
    if !quiet_cores(share) {
        skip(
            "short_lived_threads_are_counted (their stacks)",
            &format!(
                "the short-lived threads had a core for {:.0}% of their time (the machine is \
                 busy): {short:.0} ns unwound and {marked:.0} ns under the marker",
                share * 100.0
            ),
        );
        assert!(
            short + marked >= truth * 0.6,
            "short-lived threads' CPU is missing: {short:.0} ns unwound and {marked:.0} ns \
             under the marker, of {truth:.0} ns"
        );
    } else {
        assert!(
            short >= truth * 0.6,
            "short-lived threads' CPU is missing: {short:.0} ns of {truth:.0} ns"
        );
    }
    // The process's CPU is read around the request, which takes longer than its 3 s
    // window: what the process did before the window opened and after it closed (the
    // answer's own building: symbols, encoding; the spawner's threads meanwhile) is in
    // it and in no window, 60 to 80 ms here whether the machine is busy or not, which is
    // 5 % of a quiet machine's window and 10 % of a busy one's, where the workload gets
    // half a core. At most every core for that time, by the client's clock, and no more
    // than four (the spawner, its one thread, the server's answer and the client are all
    // that run here), so that a machine of many cores still tests the bound.
    let cores = cores().min(4) as f64;
    let outside = answered
        .saturating_sub(Duration::from_secs(3))
        .as_secs_f64()
        * 1e9
        * cores;
    let process = cpu_used.as_nanos() as f64;
    assert!(
        all <= process * 1.1 && all >= (process - outside) * 0.9,
        "Σ cpu/nanoseconds {all:.0}, the process used {process:.0} ns around the request, \
         which took {answered:?} for its 3 s window (up to {outside:.0} ns of CPU outside it)"
    );
}

#[tokio::test]
async fn a_stack_deeper_than_recorded_ends_in_truncated() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start_with(1, Duration::from_secs(60), || {
        std::hint::black_box(hot::krabka_deep_recursion(400, 200_000));
    });
    // 1.5 s of the recursion's CPU: 150 periods at 99 Hz.
    let seconds = match burner.window_for(Duration::from_millis(1500), 2, 30).await {
        Ok(seconds) => seconds,
        Err(why) => return skip("a_stack_deeper_than_recorded_ends_in_truncated", &why),
    };
    let (profile, _) = profile_at(&server, seconds, 99).await;
    drop(burner);

    let deep: Vec<_> = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("krabka_deep_recursion")))
        .collect();
    let samples: i64 = deep.iter().map(|(_, v)| v[0]).sum();
    assert!(samples > 50, "{samples} samples in the recursion");
    let truncated: i64 = deep
        .iter()
        .filter(|(frames, _)| frames.last().is_some_and(|f| f == "[truncated]"))
        .map(|(_, v)| v[0])
        .sum();
    assert!(
        truncated as f64 >= samples as f64 * 0.9,
        "{truncated} of {samples} samples 400 frames deep end in [truncated]"
    );
    // A frame is a location: functions inlined into one (lines from DWARF) are part of
    // its frame, not frames of their own.
    let name_of = |id: u64| {
        let location = profile.location.iter().find(|l| l.id == id).unwrap();
        let line = location.line.last().expect("every location here is named");
        let function = profile
            .function
            .iter()
            .find(|f| f.id == line.function_id)
            .unwrap();
        string(&profile, function.name).to_owned()
    };
    // The handler's account of its own work agrees with the profile: the mean depth its
    // comment gives is the samples' mean number of frames (locations, less the
    // `[truncated]` marker), within 15 % (the recursion's 128 dominate).
    let (mut frames, mut unwound) = (0.0, 0.0);
    for sample in &profile.sample {
        let names: Vec<String> = sample.location_id.iter().map(|id| name_of(*id)).collect();
        let marked = names.last().is_some_and(|f| f == "[truncated]");
        if names.iter().any(|n| n.contains("krabka_deep_recursion")) && marked {
            assert_eq!(names.len(), 129, "128 frames and the marker");
        }
        let count = sample.value[0] as f64;
        frames += count * (names.len() - usize::from(marked)) as f64;
        unwound += count;
    }
    let said: f64 = comments(&profile)
        .iter()
        .find_map(|c| {
            let (before, _) = c
                .strip_prefix("signal handler:")?
                .split_once(" frames on average")?;
            before.rsplit(", ").next()?.parse().ok()
        })
        .expect("the handler's comment gives its mean depth");
    let mean = frames / unwound;
    assert!(
        (said - mean).abs() <= mean * 0.15,
        "the comment says {said} frames on average; the profile's samples have {mean:.1}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_child_processes_during_a_window() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(30));
    let running = start_profile(&server, 4, 99);
    let failures = tokio::task::spawn_blocking(|| {
        assert!(
            wait_for_timers(std::process::id()),
            "the sampler armed its timers"
        );
        let started = Instant::now();
        let mut failures = 0;
        for _ in 0..2000 {
            let status = std::process::Command::new("true").status().unwrap();
            failures += usize::from(!status.success());
        }
        eprintln!("2000 children in {:?}", started.elapsed());
        failures
    })
    .await
    .unwrap();
    let (profile, _) = running.await.unwrap();
    let timeline = burner.finish();
    assert_eq!(failures, 0, "every child exited 0");
    // The burner was sampled throughout, by its own clock (not a count only a quiet
    // machine gives: a busy one folds its periods into fewer signals, and says so).
    let (start, end) = profile_window(&profile);
    assert_sample_count(
        "the burner beside 2000 children",
        total_in(&profile, 0, "Burner") as f64,
        timeline.cpu_within(start, end),
        99,
        timeline.least_core_share(start, end),
        0.15,
    );
}

#[tokio::test]
#[cfg_attr(
    target_env = "musl",
    ignore = "a static musl binary cannot dlopen: no library is loaded or unloaded"
)]
async fn libraries_loaded_and_unloaded_during_a_window() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    ZLIB_ROUNDS.store(0, Ordering::Relaxed);
    let loader = Burner::start_with(1, Duration::from_secs(30), load_call_and_unload_zlib);
    let process = ProcessCpu::start();
    let frequency = fast_frequency();
    let (profile, _) = profile_at(&server, 3, frequency).await;
    let timeline = loader.finish();
    let rounds = ZLIB_ROUNDS.load(Ordering::Relaxed);
    assert!(rounds > 100, "{rounds} dlopen/dlclose rounds");
    // Judged by the loader's own clock and the process's: at least 40% of a sample per
    // period of the loader's (a machine busy with other work folds periods into fewer
    // signals), and every period of the process's CPU in the window accounted for (not
    // every stack, some interrupted inside the loader's `dlopen`, reaches the burner's
    // frames).
    let (start, end) = profile_window(&profile);
    let cpu = timeline.cpu_within(start, end);
    let samples = total(&profile, 0);
    assert!(
        samples as f64 >= cpu.as_secs_f64() * f64::from(frequency) * 0.4,
        "the profile has the loader's samples: {samples} for {cpu:?} of its CPU at \
         {frequency} Hz"
    );
    // The loader's weights, by its own clock: within 10 % (no period lost while it is
    // inside `dlopen`, in a library loaded a moment ago, or in one being unloaded).
    let loader = thread_total(&profile, 1, "burner-0");
    assert!(
        (loader as f64 - cpu.as_nanos() as f64).abs() <= cpu.as_nanos() as f64 * 0.1,
        "the loader's Σ cpu/nanoseconds {loader} while libraries came and went; its clock \
         says {cpu:?}"
    );
    // The process's: never more than it used (nothing charged twice, or from before the
    // window), and at least 80 % of it. Not 90 %: the kernel checks a thread's timer at
    // the ticks that find it running, and threads that run in bursts between ticks (the
    // test's CPU reader, the crate's worker following the libraries) have periods that no
    // signal has carried yet when the window closes; on a machine busy with other work
    // that came to 10.2 % of the process's CPU (the reader 46 ms, 13 of them sampled; the
    // worker 164 ms, 63 sampled), while the loader's own came within 5 %.
    let (nanos, used) = (total(&profile, 1) as f64, process.cpu_within(start, end));
    let used_nanos = used.as_nanos() as f64;
    assert!(
        nanos <= used_nanos * 1.1 && nanos >= used_nanos * 0.8,
        "Σ cpu/nanoseconds {nanos} while libraries came and went; the process used {used:?}"
    );
}

static ZLIB_ROUNDS: AtomicU32 = AtomicU32::new(0);

/// One round of the loader: libz loaded, its crc32 called, libz unloaded.
fn load_call_and_unload_zlib() {
    static DATA: [u8; 1 << 16] = [7; 1 << 16];
    // SAFETY: libz is loaded, its crc32 called on our buffer, and unloaded.
    unsafe {
        let handle = libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!handle.is_null(), "libz.so.1 (zlib1g) is on every Debian");
        let crc32 = libc::dlsym(handle, c"crc32".as_ptr());
        assert!(!crc32.is_null());
        let crc32: extern "C" fn(u64, *const u8, u32) -> u64 = std::mem::transmute(crc32);
        for _ in 0..20 {
            std::hint::black_box(crc32(0, DATA.as_ptr(), DATA.len() as u32));
        }
        libc::dlclose(handle);
    }
    ZLIB_ROUNDS.fetch_add(1, Ordering::Relaxed);
}

#[tokio::test]
async fn a_thread_with_little_stack_left_survives_being_profiled() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        // 64 KiB of stack, and a recursion that leaves 8 KiB of it: the kernel's signal
        // frame (3.3 KiB here) and the handler must fit in what is left.
        std::thread::Builder::new()
            .name("small-stack".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let floor = hot::stack_floor();
                let limit = Instant::now() + Duration::from_secs(30);
                while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                    std::hint::black_box(hot::krabka_near_stack_end(floor, 8 * 1024, 100_000));
                }
            })
            .unwrap()
    };
    let frequency = fast_frequency();
    let (profile, _) = profile_at(&server, 2, frequency).await;
    stop.store(true, Ordering::Relaxed);
    thread.join().expect("the small-stack thread survived");
    // 100 of 500 at 250 Hz.
    let samples = total_in(&profile, 0, "krabka_near_stack_end");
    assert!(
        samples as f64 > f64::from(frequency) * 2.0 * 0.2,
        "{samples} samples near the stack's end at {frequency} Hz"
    );
}
