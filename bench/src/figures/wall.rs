//! W: wall-clock profiles (`/wall`). What the sweep that looks at sleeping threads costs
//! where nothing happens (16 idle workers, 500 idle blocking-pool threads) and where every
//! worker blocks inside its poll; whether it wakes a sleeping thread; how soon the profile
//! follows its window; what it adds to resident memory with 2,000 threads; what tokio's
//! task hooks (`krabka_pprof::task_hooks`) cost a poll.

use std::time::Duration;

use crate::Options;
use crate::figures::handler_cost::profiler_cpu_during;
use crate::figures::thread_dump::{switches, woken};
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Fetched, Server, decode, fetch};
use crate::system::{peak_rss, reset_peak, rss};

pub fn wall(options: &Options) -> Vec<Row> {
    let mut rows = Vec::new();

    // The task hooks (`krabka_pprof::task_hooks`): what tokio calls around each poll where
    // the app installs them, called as tokio calls them (through a `dyn Fn`), on a thread
    // already registered by its first poll.
    let per_poll = hooks_per_poll(options.rounds(5) as u32);
    eprintln!("W hooks: {per_poll:.2} ns a poll (before + after)");
    rows.push(Row {
        id: "W",
        figure: "tokio's task hooks (krabka_pprof::task_hooks), before and after a poll, \
                 called through a dyn Fn as tokio calls them: cost per poll"
            .to_owned(),
        target: "≤ 10 ns",
        measured: format!("{per_poll:.2} ns (median of runs of 10 M polls)"),
        verdict: Verdict::at_most(per_poll, 10.0),
    });

    // Idle: nothing but the profile runs. Its window is also the one in which the parked
    // threads must not be woken.
    let idle_window = options.secs(60.0).round().max(3.0) as u64;
    let server = Server::start_wall(16, 500, 100, false);
    std::thread::sleep(Duration::from_secs(1));
    let pid = server.pid();
    let switched = switches(pid);
    let (fetched, cpu) = wall_window(&server, idle_window);
    let woken = woken(&switched, &switches(pid));
    let idle_share = cpu.as_secs_f64() / idle_window as f64 * 100.0;
    let idle_after = fetched.after_window().as_secs_f64() * 1e3;
    let looks = looks_comment(&fetched);
    eprintln!(
        "W idle: profiler threads {:.1} ms over {idle_window} s ({idle_share:.3} % of a core); \
         {looks}; parked threads woken: {woken}",
        cpu.as_secs_f64() * 1e3
    );
    // The next window, as a scraper takes one after another: the first window's one-off
    // costs (every thread's first reading, the symbol tables) are behind it.
    let (fetched, later_cpu) = wall_window(&server, idle_window);
    let later_share = later_cpu.as_secs_f64() / idle_window as f64 * 100.0;
    let later_looks = looks_comment(&fetched);
    eprintln!(
        "W idle, the next window: profiler threads {:.1} ms over {idle_window} s \
         ({later_share:.3} % of a core); {later_looks}",
        later_cpu.as_secs_f64() * 1e3
    );
    drop(server);
    rows.push(Row {
        id: "W",
        figure: "sampler CPU during a /wall window at 99 Hz, 16 idle workers and 500 idle \
                 pool threads: the profiler's threads, share of a core"
            .to_owned(),
        target: "≤ 0.05 %",
        measured: format!(
            "{idle_share:.3} % ({:.1} ms in {idle_window} s; {looks})",
            cpu.as_secs_f64() * 1e3
        ),
        verdict: Verdict::at_most(idle_share, 0.05),
    });
    rows.push(Row {
        id: "W",
        figure: "the same, the next window right after on the same service (as a scraper \
                 takes them, one after another)"
            .to_owned(),
        target: "≤ 0.05 %",
        measured: format!(
            "{later_share:.3} % ({:.1} ms in {idle_window} s; {later_looks})",
            later_cpu.as_secs_f64() * 1e3
        ),
        verdict: Verdict::at_most(later_share, 0.05),
    });
    rows.push(Row {
        id: "W",
        // The target is a 10 s profile's (below); this one's samples are 620 threads'.
        figure: format!("{idle_window} s /wall profile, idle service: window end → last byte"),
        target: "—",
        measured: format!("{idle_after:.1} ms"),
        verdict: Verdict::NoTarget,
    });
    rows.push(Row {
        id: "W",
        figure: format!(
            "sleeping threads woken during a {idle_window} s /wall window, of 100 parked"
        ),
        target: "0",
        measured: woken.to_string(),
        verdict: Verdict::at_most(woken as f64, 0.0),
    });

    // Every worker blocked inside its poll, in a labelled future.
    let window = options.secs(10.0).round().max(2.0) as u64;
    let server = Server::start_wall(16, 0, 0, true);
    std::thread::sleep(Duration::from_secs(1));
    let (fetched, cpu) = wall_window(&server, window);
    let blocked_share = cpu.as_secs_f64() / window as f64 * 100.0;
    let after = fetched.after_window().as_secs_f64() * 1e3;
    let looks = looks_comment(&fetched);
    eprintln!(
        "W blocked: profiler threads {:.1} ms over {window} s ({blocked_share:.3} % of a \
         core); {looks}; last byte {after:.1} ms after the window",
        cpu.as_secs_f64() * 1e3
    );
    drop(server);
    rows.push(Row {
        id: "W",
        figure: "sampler CPU during a /wall window at 99 Hz, 16 workers blocked in their \
                 polls: the profiler's threads (profile building included), share of a core"
            .to_owned(),
        target: "≤ 1 %",
        measured: format!(
            "{blocked_share:.3} % ({:.1} ms in {window} s; {looks})",
            cpu.as_secs_f64() * 1e3
        ),
        verdict: Verdict::at_most(blocked_share, 1.0),
    });
    rows.push(Row {
        id: "W",
        figure: format!("{window} s /wall profile, 16 blocked workers: window end → last byte"),
        target: "≤ 25 ms",
        measured: format!("{after:.1} ms"),
        verdict: Verdict::at_most(after, 25.0),
    });

    // 2,000 threads asleep: what a window adds to resident memory at its peak; beside it,
    // what a CPU profile of the same length adds there (a wall window holds one).
    let grown = |path: &str| {
        let server = Server::start_wall(1, 0, 2_000, false);
        std::thread::sleep(Duration::from_secs(2));
        let pid = server.pid();
        let before = rss(pid);
        reset_peak(pid);
        let fetched = fetch(server.addr, path);
        assert_eq!(
            fetched.status,
            200,
            "{}",
            String::from_utf8_lossy(&fetched.body)
        );
        (
            peak_rss(pid).saturating_sub(before) as f64 / MB,
            before as f64 / MB,
            looks_comment(&fetched),
        )
    };
    let (cpu_grown, _, _) = grown(&format!("/debug/pprof/profile?seconds={window}"));
    let (wall_grown, before, looks) =
        grown(&format!("/debug/pprof/wall?seconds={window}&threads=all"));
    eprintln!(
        "W 2,000 threads: RSS {before:.1} MB before; peak +{wall_grown:.2} MB for /wall, \
         +{cpu_grown:.2} MB for /profile; {looks}"
    );
    rows.push(Row {
        id: "W",
        figure: format!(
            "{window} s /wall profile (threads=all) of 2,000 sleeping threads: resident \
             memory added, peak"
        ),
        target: "≤ 2 MB",
        measured: format!(
            "+{wall_grown:.2} MB (a {window} s CPU profile of the same service: \
             +{cpu_grown:.2} MB)"
        ),
        verdict: Verdict::at_most(wall_grown, 2.0),
    });
    rows
}

/// Nanoseconds a poll's two hooks take, the median of `runs` runs of 10 M polls.
fn hooks_per_poll(runs: u32) -> f64 {
    type Hook = Box<dyn Fn(&u64) + Send + Sync>;
    let before: Hook = Box::new(|_| krabka_pprof::task_hooks::before_poll());
    let after: Hook = Box::new(|_| krabka_pprof::task_hooks::after_poll());
    // The thread's first poll registers it.
    before(&0);
    after(&0);
    const POLLS: u64 = 10_000_000;
    let mut runs: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let started = std::time::Instant::now();
            for task in 0..POLLS {
                let meta = std::hint::black_box(task);
                std::hint::black_box(&before)(&meta);
                std::hint::black_box(&after)(&meta);
            }
            started.elapsed().as_secs_f64() * 1e9 / POLLS as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// A `seconds` s `/wall` profile of `server`, answered 200, and the CPU its profiler
/// threads used meanwhile (see [`profiler_cpu_during`]; each thread's is printed).
fn wall_window(server: &Server, seconds: u64) -> (Fetched, Duration) {
    let (fetched, by_name) = profiler_cpu_during(server.pid(), || {
        fetch(server.addr, &format!("/debug/pprof/wall?seconds={seconds}"))
    });
    assert_eq!(
        fetched.status,
        200,
        "{}",
        String::from_utf8_lossy(&fetched.body)
    );
    let mut threads: Vec<_> = by_name.iter().collect();
    threads.sort();
    let threads: Vec<String> = threads
        .iter()
        .map(|(name, cpu)| format!("{name} {:.1} ms", cpu.as_secs_f64() * 1e3))
        .collect();
    eprintln!("W profiler threads: {}", threads.join(", "));
    (fetched, by_name.values().sum())
}

/// The profile's comment on its looks (how many, how many stacks read, their CPU).
fn looks_comment(fetched: &Fetched) -> String {
    let profile = decode(&fetched.body);
    profile
        .comment
        .iter()
        .map(|&i| profile.string_table[i as usize].clone())
        .find(|comment| comment.contains(" looks over "))
        .unwrap_or_default()
}
