//! The index page (`{prefix}/`): valid HTML5, self-contained, readable without
//! JavaScript: every route this app serves with a line on what it returns and links to
//! its views, the settings in force, and what runs now (the recorder's history too).

use crate::config::Bytes;
use crate::cpu::RecorderStatus;
use crate::views::escape;

/// The index page: valid HTML5, self-contained, readable without JavaScript. Links are
/// relative to `{prefix}/`, where the page is served.
pub(super) fn index_html(
    config: &crate::config::ProfilingConfig,
    host: &str,
    running: Option<crate::cpu::Status>,
    recorder: Option<RecorderStatus>,
) -> String {
    let prefix = escape(config.prefix());
    let host = escape(host);
    let secs = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let svg = cfg!(feature = "flamegraph");
    let views = |route: &str, query: &str| {
        let sep = if query.is_empty() { "?" } else { "&amp;" };
        let mut links = format!("<a href=\"{route}{query}\">pprof</a>");
        if svg {
            links.push_str(&format!(
                " · <a href=\"{route}{query}{sep}format=svg\">flamegraph</a>"
            ));
        }
        links.push_str(&format!(
            " · <a href=\"{route}{query}{sep}format=text\">top</a>"
        ));
        links
    };
    // Where a route cannot work on this target or build, its row says so (it answers 503).
    let note = |unavailable: Option<&str>| {
        unavailable.map_or(String::new(), |why| {
            format!(" <strong>Not here</strong>: {}.", escape(why))
        })
    };
    let at_once = if config.max_windows() == 1 || !crate::cpu::shares_windows() {
        "One at a time: a second request gets 409, unless it adds <code>force=true</code>."
            .to_owned()
    } else {
        format!(
            "Requests at the same frequency share the sampler, each getting the samples of its \
             own window, up to {} at once (then 409); another frequency gets 409, unless it \
             adds <code>force=true</code>, which stops the running ones early (their callers \
             keep what they had).",
            config.max_windows()
        )
    };
    let mut rows = format!(
        "<tr><td><code>profile</code></td><td>CPU profile of the whole process: samples every \
         thread for <code>seconds</code> (default {}, at most {}) at <code>frequency</code> Hz \
         (default {}). {at_once} Samples carry the thread's name and the labels active on \
         it (<code>krabka_pprof::labels</code>); <code>format=text&amp;group=tenant</code> \
         groups the top view by one.{}</td><td>5 s: {}</td></tr>\n",
        secs(config.cpu_default()),
        secs(config.cpu_max()),
        config.frequency(),
        note(crate::cpu::UNAVAILABLE),
        views("profile", "?seconds=5")
            + " · <a href=\"profile?seconds=5&amp;format=text&amp;group=thread\">top by thread</a>",
    );
    let wall_unavailable = crate::wall::UNAVAILABLE
        .or_else(|| (!crate::cpu::shares_windows()).then_some(crate::wall::NEEDS_OWN_SAMPLER));
    rows.push_str(&format!(
        "<tr><td><code>wall</code></td><td>Wall-clock profile: where the threads doing work \
         spent their time, on a CPU and off it (<code>thread_state</code>, and the \
         <code>syscall</code> they slept in), with their labels, looked at without a signal. \
         Shares the CPU sampler as <code>profile</code> does; <code>threads=all</code> adds \
         idle threads.{}</td><td>5 s: {}</td></tr>\n\
         <tr><td><code>blocking</code></td><td>Of the same, the time threads slept inside an \
         async task's poll: what blocked the runtime, with the request's labels and the \
         system call.{}</td><td>5 s: {}</td></tr>\n",
        note(wall_unavailable),
        views("wall", "?seconds=5")
            + " · <a href=\"wall?seconds=5&amp;format=text&amp;group=thread_state\">by state</a>",
        note(wall_unavailable),
        views("blocking", "?seconds=5")
            + " · <a href=\"blocking?seconds=5&amp;format=text&amp;group=syscall\">by system call</a>",
    ));
    rows.push_str(&recent_row(config, recorder.as_ref()));
    if config.heap() {
        let counts = if config.alloc_stacks() > 0 {
            "memory in use and memory allocated since the start (<code>alloc_space</code>), "
        } else {
            "memory in use (allocation counts off: <code>alloc_stacks = 0</code>), "
        };
        for (route, what) in [
            ("heap", "Heap profile, shown as memory in use:"),
            (
                "allocs",
                "The same profile, shown as memory allocated, at the path Parca and Grafana \
                 Alloy scrape:",
            ),
        ] {
            rows.push_str(&format!(
                "<tr><td><code>{route}</code></td><td>{what} {counts}by allocation site, from \
                 jemalloc's sampling. <code>seconds</code>: what was allocated during those \
                 seconds (at most {}); if sampling is off, it samples for <code>seconds</code> \
                 (default {}) first.{}</td><td>{}</td></tr>\n",
                secs(config.heap_max()),
                secs(config.heap_default()),
                note(crate::heap::UNAVAILABLE),
                views(route, ""),
            ));
        }
    }
    if config.threads() {
        rows.push_str(&format!(
            "<tr><td><code>threads</code></td><td>Every thread's stack now: a sleeping \
             thread is read without a signal, any other unwinds itself when signalled \
             (one that blocks the signal, or does not answer within \
             <code>deadline</code>, default 100ms, is listed as such); one dump at a time. \
             <code>debug=1</code>: text grouped by stack; <code>debug=2</code>: every thread \
             with its state, CPU time and what it waits on.{}</td><td>{} · <a \
             href=\"threads?debug=1\">grouped</a> · <a href=\"threads?debug=2\">every \
             thread</a></td></tr>\n",
            note(crate::threads::UNAVAILABLE),
            views("threads", ""),
        ));
        rows.push_str(&format!(
            "<tr><td><code>goroutine</code></td><td>The same thread dump, at the path Go \
             tools, Parca and Grafana Alloy ask for (a Rust process has threads, not \
             goroutines).{}</td><td><a href=\"goroutine\">pprof</a> · <a \
             href=\"goroutine?debug=2\">every thread</a></td></tr>\n",
            note(crate::threads::UNAVAILABLE),
        ));
        rows.push_str(
            "<tr><td><code>tasks</code></td><td>tokio's task dump: every async task's \
             trace, grouped. Needs the app built with \
             <code>RUSTFLAGS=\"--cfg tokio_unstable\"</code> and krabka-pprof's \
             <code>task-dump</code> feature (otherwise 503).</td><td><a \
             href=\"tasks\">text</a></td></tr>\n",
        );
    }
    if config.cmdline() {
        rows.push_str(
            "<tr><td><code>cmdline</code></td><td>This process's command line, arguments \
             separated by NUL bytes, as Go's.</td><td><a href=\"cmdline\">text</a></td></tr>\n",
        );
    }
    let access = match (config.token_env(), config.guard().is_some()) {
        (Some(variable), true) => format!(
            "bearer token from <code>{}</code>, and a guard function",
            escape(variable)
        ),
        (Some(variable), false) => format!("bearer token from <code>{}</code>", escape(variable)),
        (None, true) => "a guard function".to_owned(),
        (None, false) => "open to anyone who can reach this address".to_owned(),
    };
    let heap = if config.heap() {
        "on (<code>/heap</code>, <code>/allocs</code>)"
    } else {
        "off (enable with <code>heap = true</code>)"
    };
    let now = match running {
        None => "no CPU profile".to_owned(),
        // The profiler is taken and its sampler is starting.
        Some(status) if status.windows == 0 => {
            "a CPU profile starting, no window open yet".to_owned()
        }
        Some(status) => format!(
            "a CPU profile{}, {} window{} open, the last ending in {}",
            status
                .frequency
                .map_or(String::new(), |hz| format!(" at {hz} Hz")),
            status.windows,
            if status.windows == 1 { "" } else { "s" },
            secs(std::time::Duration::from_secs(
                status.ends_in.as_secs_f64().ceil() as u64
            )),
        ),
    };
    let now = match (&recorder, config.recent()) {
        (Some(status), Some(_)) => match &status.paused {
            None => format!(
                "{now}; the recorder samples at {} Hz",
                status.settings.frequency
            ),
            Some(why) => format!("{now}; the recorder is paused: {}", escape(why)),
        },
        _ => now,
    };
    let recorder_setting = match config.recent() {
        Some(keep) => format!(
            "on: keeps the last {} within {}, at {} Hz",
            secs(keep),
            Bytes(config.recent_memory()),
            config.frequency()
        ),
        None => "off (enable with <code>recent = \"10m\"</code>)".to_owned(),
    };
    let formats = if svg {
        "pprof (default), svg, text"
    } else {
        "pprof (default), text"
    };
    format!(
        "<!DOCTYPE html>
<html lang=\"en\">
<head>
<meta charset=\"utf-8\">
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">
<title>{prefix}/ — profiles of this process</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 62rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.5; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .4rem .6rem; text-align: left; vertical-align: top; }}
code, pre {{ background: #f4f4f4; border-radius: 3px; }}
code {{ padding: 0 .2rem; }}
pre {{ padding: .6rem; overflow-x: auto; }}
</style>
</head>
<body>
<h1>Profiles of this process</h1>
<p>Served by krabka-pprof {version} under <code>{prefix}</code>. Every view is computed from the same pprof profile; <code>format</code> picks one: {formats}.</p>
<h2>Routes</h2>
<table>
<thead><tr><th>Route</th><th>What it returns</th><th>Open it</th></tr></thead>
<tbody>
{rows}</tbody>
</table>
<h2>Settings in force</h2>
<table>
<tbody>
<tr><th scope=\"row\">CPU profile length</th><td>default {cpu_default}, at most {cpu_max}</td></tr>
<tr><th scope=\"row\">Sampling frequency</th><td>{frequency} Hz unless <code>frequency</code> asks otherwise (1 to 1000)</td></tr>
<tr><th scope=\"row\">CPU profiles at once</th><td>{at_once_setting}</td></tr>
<tr><th scope=\"row\">Heap profiling</th><td>{heap}</td></tr>
<tr><th scope=\"row\">Recorder</th><td>{recorder_setting}</td></tr>
<tr><th scope=\"row\">Push</th><td>{push}</td></tr>
<tr><th scope=\"row\">Access</th><td>{access}</td></tr>
<tr><th scope=\"row\">Running now</th><td>{now}</td></tr>
</tbody>
</table>
<h2>From a terminal</h2>
<pre>go tool pprof -http=127.0.0.1:8080 http://{host}{prefix}/profile?seconds=30
go tool pprof -top http://{host}{prefix}/profile?seconds=5
curl -o cpu.pb.gz 'http://{host}{prefix}/profile?seconds=10'</pre>
</body>
</html>
",
        version = env!("CARGO_PKG_VERSION"),
        push = push_setting(config),
        cpu_default = secs(config.cpu_default()),
        cpu_max = secs(config.cpu_max()),
        frequency = config.frequency(),
        at_once_setting = if crate::cpu::shares_windows() {
            format!(
                "{}, sharing one sampler at one frequency",
                config.max_windows()
            )
        } else {
            "1 (this platform's sampler, the <code>pprof</code> crate's, serves one at a time)"
                .to_owned()
        },
    )
}

/// The pusher's row: off, or where it pushes and how that goes (last success, windows
/// pending, last error), per destination.
fn push_setting(config: &crate::config::ProfilingConfig) -> String {
    if !config.push() {
        return "off (enable with <code>push = true</code> beside <code>recent</code>)".to_owned();
    }
    #[cfg(feature = "push")]
    if let Some((interval, idle, targets)) = crate::push::status() {
        let secs = |d: std::time::Duration| humantime::format_duration(d).to_string();
        let ago = |at: std::time::SystemTime| {
            let past = std::time::SystemTime::now()
                .duration_since(at)
                .unwrap_or_default();
            format!(
                "{} ago",
                secs(std::time::Duration::from_secs(past.as_secs()))
            )
        };
        let mut text = format!("on: a window every {}", secs(interval));
        if let Some(why) = idle {
            text.push_str(&format!("; nothing is pushed: {}", escape(&why)));
        }
        for target in targets {
            text.push_str(&format!(
                "<br>{} to <code>{}</code>: {} window{} sent, {} pending, {} retr{}, {} dropped (refused), {} lost (too old), {} empty; last success: {}",
                target.protocol,
                escape(&target.url),
                target.windows_sent,
                if target.windows_sent == 1 { "" } else { "s" },
                target.pending,
                target.retries,
                if target.retries == 1 { "y" } else { "ies" },
                target.windows_dropped,
                target.windows_lost,
                target.windows_empty,
                target.last_success.map_or("none yet".to_owned(), ago),
            ));
            text.push_str(&format!(
                "; {:.1} KiB sent, the largest request {:.1} KiB (gzipped)",
                target.bytes_sent as f64 / 1024.0,
                target.largest_request as f64 / 1024.0
            ));
            if target.heap_sent > 0 {
                text.push_str(&format!("; {} with the heap", target.heap_sent));
            }
            if let Some(delay) = target.last_delay {
                text.push_str(&format!(
                    " ({} ms after its window's end)",
                    delay.as_millis()
                ));
            }
            if let Some((at, why)) = target.last_error {
                text.push_str(&format!("; last error {}: {}", ago(at), escape(&why)));
            }
        }
        return text;
    }
    "on, but not running: this build has no <code>push</code> feature, or no recorder runs \
     here"
        .to_owned()
}

/// The `/recent` row: what the recorder keeps now, and the last 1, 5 and 10 minutes (as
/// far as it keeps) as flamegraph and text.
fn recent_row(
    config: &crate::config::ProfilingConfig,
    recorder: Option<&RecorderStatus>,
) -> String {
    let secs = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let Some(keep) = config.recent() else {
        return "<tr><td><code>recent</code></td><td>The CPU profile of the last minutes, at \
                once, from an always-on recorder. Off: add <code>recent = \"10m\"</code> to \
                the attribute (then this answers 200; now 503).</td><td>—</td></tr>\n"
            .to_owned();
    };
    let kept = match recorder {
        Some(status) => {
            let whole = |d: std::time::Duration| secs(std::time::Duration::from_secs(d.as_secs()));
            let mut kept = format!(
                " Kept now: {} of history ({} sampled), {} of the {} allowed, {} distinct \
                 stacks.",
                whole(status.span),
                whole(status.sampled),
                Bytes(status.bytes),
                Bytes(status.settings.budget),
                status.stacks
            );
            if let Some(why) = &status.paused {
                kept.push_str(&format!(" Paused: {}.", escape(why)));
            }
            kept
        }
        None => String::new(),
    };
    let mut links: Vec<String> = [1u64, 5, 10]
        .into_iter()
        .filter(|minutes| minutes * 60 <= keep.as_secs())
        .map(|minutes| {
            let query = format!("recent?seconds={}", minutes * 60);
            let mut link = format!("{minutes} min: ");
            if cfg!(feature = "flamegraph") {
                link.push_str(&format!(
                    "<a href=\"{query}&amp;format=svg\">flamegraph</a> · "
                ));
            }
            link.push_str(&format!(
                "<a href=\"{query}&amp;format=text\">text</a> · <a href=\"{query}\">pprof</a>"
            ));
            link
        })
        .collect();
    if links.is_empty() {
        links.push(format!(
            "all {}: <a href=\"recent?seconds={s}&amp;format=text\">text</a> · <a \
             href=\"recent?seconds={s}\">pprof</a>",
            secs(keep),
            s = keep.as_secs()
        ));
    }
    format!(
        "<tr><td><code>recent</code></td><td>The CPU profile of the last <code>seconds</code> \
         (default {}, at most {}), at once, from the recorder that samples at {} Hz since the \
         app started; <code>end</code> (UNIX seconds) for a window that ended earlier. No \
         window is held: scrape it every N seconds with <code>seconds=N</code>.{kept}{}</td>\
         <td>{}</td></tr>\n",
        secs(keep.min(std::time::Duration::from_secs(60))),
        secs(keep),
        config.frequency(),
        crate::cpu::recorder_unavailable().map_or(String::new(), |why| format!(
            " <strong>Not here</strong>: {}.",
            escape(why)
        )),
        links.join("<br>"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_says_what_runs_now_and_how_requests_share() {
        let config = crate::config::ProfilingConfig::new();
        let idle = index_html(&config, "host", None, None);
        assert!(idle.contains("<td>no CPU profile</td>"), "{idle}");
        assert!(idle.contains("up to 8 at once (then 409)"), "{idle}");
        assert!(idle.contains("<td>8, sharing one sampler at one frequency</td>"));
        let busy = index_html(
            &config,
            "host",
            Some(crate::cpu::Status {
                frequency: Some(99),
                windows: 2,
                ends_in: std::time::Duration::from_millis(4_200),
            }),
            None,
        );
        assert!(
            busy.contains("a CPU profile at 99 Hz, 2 windows open, the last ending in 5s"),
            "{busy}"
        );
        let one = index_html(
            &config.with_max_windows(1),
            "host",
            Some(crate::cpu::Status {
                frequency: None,
                windows: 1,
                ends_in: std::time::Duration::ZERO,
            }),
            None,
        );
        assert!(
            one.contains("One at a time: a second request gets 409"),
            "{one}"
        );
        assert!(
            one.contains("a CPU profile, 1 window open, the last ending in 0s"),
            "{one}"
        );
        let starting = index_html(
            &config,
            "host",
            Some(crate::cpu::Status {
                frequency: None,
                windows: 0,
                ends_in: std::time::Duration::from_secs(30),
            }),
            None,
        );
        assert!(
            starting.contains("<td>a CPU profile starting, no window open yet</td>"),
            "{starting}"
        );
    }

    #[test]
    fn index_says_which_routes_cannot_work_here() {
        let html = index_html(
            &crate::config::ProfilingConfig::new().with_heap(true),
            "host",
            None,
            None,
        );
        assert_eq!(
            html.matches("<strong>Not here</strong>").count(),
            usize::from(crate::cpu::UNAVAILABLE.is_some())
                + 2 * usize::from(crate::heap::UNAVAILABLE.is_some()),
            "{html}"
        );
        for why in [crate::cpu::UNAVAILABLE, crate::heap::UNAVAILABLE]
            .into_iter()
            .flatten()
        {
            assert!(html.contains(&escape(why)), "{why}: {html}");
        }
        // On the crate's own targets and features (this test runs with and without
        // `heap-profiling`), the heap note follows the feature.
        if cfg!(all(target_os = "linux", not(target_env = "musl"))) {
            assert_eq!(
                crate::heap::UNAVAILABLE.is_some(),
                !cfg!(feature = "heap-profiling")
            );
        }
    }

    /// The heap rows say whether allocations are counted (`alloc_stacks`).
    #[test]
    fn index_says_whether_allocations_are_counted() {
        let heap = crate::config::ProfilingConfig::new().with_heap(true);
        for (stacks, counted) in [(0, false), (1, true), (4096, true)] {
            let html = index_html(&heap.with_alloc_stacks(stacks), "host", None, None);
            let says_counted = html
                .matches("memory in use and memory allocated since the start")
                .count();
            let says_off = html
                .matches("allocation counts off: <code>alloc_stacks = 0</code>")
                .count();
            // Both rows, `/heap` and `/allocs`, say the same.
            assert_eq!(
                (says_counted, says_off),
                if counted { (2, 0) } else { (0, 2) },
                "alloc_stacks = {stacks}: {html}"
            );
        }
    }

    #[test]
    fn index_escapes_what_it_echoes() {
        let html = index_html(
            &crate::config::ProfilingConfig::new(),
            "<evil>\"host",
            None,
            None,
        );
        assert!(html.contains("&lt;evil&gt;&quot;host"));
        assert!(!html.contains("<evil>"));
        assert!(html.starts_with("<!DOCTYPE html>"));
    }

    #[test]
    fn index_shows_the_recorder_and_links_its_minutes() {
        let off = index_html(&crate::config::ProfilingConfig::new(), "host", None, None);
        assert!(
            off.contains("Off: add <code>recent = \"10m\"</code>"),
            "{off}"
        );
        assert!(off.contains("<td>off (enable with <code>recent = \"10m\"</code>)</td>"));
        let config = crate::config::ProfilingConfig::new()
            .with_recent(std::time::Duration::from_secs(600))
            .with_recent_memory(4 << 20);
        let status = RecorderStatus {
            settings: crate::cpu::RecorderSettings {
                keep: std::time::Duration::from_secs(600),
                budget: 4 << 20,
                frequency: 99,
                blocklist: &[],
                push_interval: None,
            },
            span: std::time::Duration::from_millis(125_700),
            sampled: std::time::Duration::from_millis(122_300),
            bytes: 512 * 1024,
            stacks: 2034,
            paused: None,
        };
        let on = index_html(&config, "host", None, Some(status.clone()));
        assert!(
            on.contains(
                "Kept now: 2m 5s of history (2m 2s sampled), 512KiB of the 4MiB allowed, 2034 \
                 distinct stacks."
            ),
            "{on}"
        );
        assert!(
            on.contains("<td>on: keeps the last 10m within 4MiB, at 99 Hz</td>"),
            "{on}"
        );
        for minutes in [1, 5, 10] {
            let seconds = minutes * 60;
            assert!(
                on.contains(&format!(
                    "<a href=\"recent?seconds={seconds}&amp;format=text\">text</a>"
                )),
                "{minutes} min: {on}"
            );
            if cfg!(feature = "flamegraph") {
                assert!(on.contains(&format!(
                    "<a href=\"recent?seconds={seconds}&amp;format=svg\">flamegraph</a>"
                )));
            }
        }
        assert!(
            on.contains("<td>no CPU profile; the recorder samples at 99 Hz</td>"),
            "{on}"
        );
        let paused = index_html(
            &config,
            "host",
            None,
            Some(RecorderStatus {
                paused: Some("a CPU profile at 50 Hz held the sampler".into()),
                ..status
            }),
        );
        assert!(paused.contains("the recorder is paused: a CPU profile at 50 Hz held the sampler"));
        // A shorter history links only the minutes it keeps.
        let short = index_html(
            &config.with_recent(std::time::Duration::from_secs(300)),
            "host",
            None,
            None,
        );
        assert!(short.contains("recent?seconds=300&amp;format=text"));
        assert!(!short.contains("recent?seconds=600"), "{short}");
    }
}
