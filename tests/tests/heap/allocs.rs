//! What allocates, not only what is live: `test_child serve-sites` keeps 64 MiB at one
//! site and allocates and frees 64 KiB about 500 times a second at another, counting the
//! bytes itself (`GET /churned`); its sites are compiled optimised (`tests/heap-sites`),
//! so with line tables the allocator is inlined into them. Each test runs the child as
//! built (line tables) and, where stacks are judged, a copy stripped of its debug info
//! (names from the symbol tables alone), and judges the profiles by the child's own
//! counts and the test's own clock. The child and what is read of it: `sites.rs`.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use krabka_pprof_tests::{
    assert_every_reader_names_as_addr2line, assert_window_inside, client, column, comments, decode,
    default_sample_type, go_pprof, go_pprof_each, raw_request, sample_types, says, stacks,
    stacks_by_address, string,
};
use reqwest::StatusCode;

use super::sites::{
    Build, CHILD, CHURN, Child, MIB, RETAIN, alloc_by_address,
    assert_stacks_start_at_the_allocation_site, go_types, is_allocator, site, within,
};

#[tokio::test]
async fn allocs_counts_what_each_site_allocated_and_what_it_holds() {
    for build in [Build::Lines, Build::NoLines] {
        let child = Child::start(build, "serve-sites", &[]);
        // 192 MiB churned: about 340 samples of the churning site (a standard error near
        // 5 %), so ±25 % is a real bound.
        child.churn_past(0, 192 << 20).await;
        let before = child.churned().await;
        let (profile, body) = child.profile("/debug/pprof/allocs").await;
        let after = child.churned().await;
        assert_eq!(sample_types(&profile), go_types(), "{build:?}");
        assert_eq!(default_sample_type(&profile), "alloc_space");
        assert_eq!(profile.period, 1 << 19);
        assert_eq!(
            profile.duration_nanos, 0,
            "counts since the start, at an instant"
        );

        let (churn_alloc, churn_inuse) = site(&profile, CHURN);
        assert!(
            churn_alloc >= before as f64 * 0.75 && churn_alloc <= after as f64 * 1.25,
            "{build:?}: the churning site allocated {:.1}..{:.1} MiB; alloc_space says {:.1} MiB",
            before as f64 / MIB,
            after as f64 / MIB,
            churn_alloc / MIB
        );
        // At most one 64 KiB block is live at a time; sampled, it stands for about 0.5 MiB.
        assert!(
            churn_inuse < 2.0 * MIB,
            "{build:?}: the churning site holds {churn_inuse} bytes"
        );
        let (retain_alloc, retain_inuse) = site(&profile, RETAIN);
        for (what, value) in [("in use", retain_inuse), ("allocated", retain_alloc)] {
            assert!(
                within(value, 64.0 * MIB, 0.3),
                "{build:?}: the retaining site has {:.1} MiB {what}",
                value / MIB
            );
        }
        assert_stacks_start_at_the_allocation_site(&profile, build);
        let said = comments(&profile).join("\n");
        assert!(said.contains("alloc_stacks = 4096"), "{said}");
        // jemalloc's sample period is the one the counts began with: nothing to warn of.
        assert!(!said.contains("sample period changed"), "{said}");
        // Three sites' stacks fill no table of 4096.
        assert!(!said.contains("table is full"), "{said}");

        for (reader, top) in go_pprof_each(
            &["-sample_index=alloc_space", "-top", "-nodecount=1000"],
            &body,
        ) {
            let churn_row = top.lines().find(|row| row.contains(CHURN));
            assert!(
                churn_row.is_some_and(|row| row.contains("MB")),
                "{reader:?} -sample_index=alloc_space -top:\n{top}"
            );
        }
        for (reader, inuse) in go_pprof_each(
            &["-sample_index=inuse_space", "-top", "-nodecount=1"],
            &body,
        ) {
            assert!(
                inuse.contains(RETAIN),
                "{reader:?}, the most held:\n{inuse}"
            );
        }

        if build == Build::Lines {
            // The site is named with its file and line where it has line tables.
            let located = profile.location.iter().any(|location| {
                location.line.first().is_some_and(|line| {
                    let function = profile
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .unwrap();
                    string(&profile, function.name).ends_with(CHURN)
                        && string(&profile, function.filename).ends_with("heap-sites/src/lib.rs")
                        && line.line > 0
                })
            });
            assert!(located, "no located line of {CHURN}");
            // What was trimmed: the site's location as DWARF has it, the allocator's
            // functions inlined into it (the location stays in the profile, unused at the
            // leaf), at the address of the trimmed one that starts the stack.
            let name_of = |line: &pprof::protos::Line| {
                let function = profile
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .unwrap();
                string(&profile, function.name).to_owned()
            };
            let sample = profile
                .sample
                .iter()
                .zip(stacks(&profile))
                .find(|(_, (frames, _))| frames[0].ends_with(CHURN))
                .map(|(sample, _)| sample)
                .expect("a stack of the churning site");
            let first = profile
                .location
                .iter()
                .find(|l| l.id == sample.location_id[0])
                .unwrap();
            let whole = profile
                .location
                .iter()
                .find(|l| l.address == first.address && l.line.len() > first.line.len())
                .expect("the untrimmed location");
            let inlined: Vec<String> = whole.line.iter().map(name_of).collect();
            assert!(
                inlined.len() >= 3 && is_allocator(&inlined[0]),
                "the allocator inlined into the site: {inlined:?}"
            );
            assert!(inlined.last().unwrap().ends_with(CHURN), "{inlined:?}");
        }
    }
}

/// The child's churn count as the test's clock saw it, polled every 20 ms.
type Readings = Vec<(SystemTime, u64)>;

/// The count at `at`, interpolated between the readings around it.
fn count_at(readings: &Readings, at: SystemTime) -> f64 {
    let after = readings
        .iter()
        .position(|(t, _)| *t >= at)
        .expect("a reading after the window");
    assert!(after > 0, "no reading before the window");
    let ((t0, v0), (t1, v1)) = (readings[after - 1], readings[after]);
    let span = t1.duration_since(t0).unwrap().as_secs_f64();
    let into = at.duration_since(t0).unwrap().as_secs_f64();
    v0 as f64 + (v1 - v0) as f64 * if span > 0.0 { into / span } else { 0.0 }
}

#[tokio::test]
async fn heap_seconds_is_what_was_allocated_during_the_window_and_what_is_in_use_at_its_end() {
    for build in [Build::Lines, Build::NoLines] {
        let child = Child::start(build, "serve-sites", &[]);
        // As much churned before the window as during it: counts since the start would
        // read twice the window's.
        child.churn_past(0, 96 << 20).await;
        let polling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let readings = {
            let (url, polling) = (child.url("/churned"), polling.clone());
            tokio::spawn(async move {
                let http = client();
                let mut readings = Readings::new();
                // Bounded by the request below (and a minute at most).
                for _ in 0..3000 {
                    let value = http.get(&url).send().await.unwrap().text().await.unwrap();
                    readings.push((SystemTime::now(), value.parse().unwrap()));
                    if !polling.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                readings
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = Instant::now();
        let sent_at = SystemTime::now();
        let (profile, _) = child.profile("/debug/pprof/heap?seconds=3").await;
        let took = sent.elapsed();
        let received_at = SystemTime::now();
        polling.store(false, std::sync::atomic::Ordering::Relaxed);
        let readings = readings.await.unwrap();

        assert_eq!(sample_types(&profile), go_types());
        assert_eq!(default_sample_type(&profile), "inuse_space");
        let duration = Duration::from_nanos(profile.duration_nanos as u64);
        assert!(
            duration >= Duration::from_secs(3) && duration <= took,
            "{build:?}: a window of {duration:?}, answered in {took:?}"
        );
        // The window by the client's clock, not the profile's word alone: the churn is
        // read between these times.
        let (start, _) = assert_window_inside(&profile, sent_at, received_at, "heap?seconds=3");
        let truth = count_at(&readings, start + duration) - count_at(&readings, start);
        let (churn_alloc, churn_inuse) = site(&profile, CHURN);
        assert!(
            within(churn_alloc, truth, 0.25),
            "{build:?}: the churning site allocated {:.1} MiB in the window; alloc_space says \
             {:.1} MiB",
            truth / MIB,
            churn_alloc / MIB
        );
        assert!(churn_inuse < 2.0 * MIB, "{churn_inuse}");
        let (retain_alloc, retain_inuse) = site(&profile, RETAIN);
        assert!(
            retain_alloc < MIB,
            "{build:?}: the retaining site allocated nothing in the window; alloc_space says \
             {retain_alloc}"
        );
        assert!(
            within(retain_inuse, 64.0 * MIB, 0.3),
            "{build:?}: in use at the window's end: {:.1} MiB",
            retain_inuse / MIB
        );
        assert_stacks_start_at_the_allocation_site(&profile, build);
        assert!(
            says(&profile, "a window of 3 s"),
            "{:?}",
            comments(&profile)
        );
        // Only a child forked after the routes were built is told its counts include its
        // parent's.
        assert!(
            !says(&profile, "was forked from"),
            "{:?}",
            comments(&profile)
        );
        // The retaining site holds memory and allocated nothing in the window: in a
        // window that is what its counts say, not a stack the counts missed.
        assert!(
            !says(&profile, "have no allocation counts of their own"),
            "{:?}",
            comments(&profile)
        );
    }
}

#[tokio::test]
async fn alloc_counts_never_decrease_over_ten_scrapes() {
    let child = Child::start(Build::Lines, "serve-sites", &[]);
    let mut previous: Option<HashMap<Vec<u64>, (i64, i64)>> = None;
    let mut churn = Vec::new();
    let mut churned = child.churned().await;
    for scrape in 0..10 {
        let (profile, _) = child.profile("/debug/pprof/allocs").await;
        let now = alloc_by_address(&profile);
        if let Some(previous) = &previous {
            for (stack, (objects, space)) in previous {
                let later = now.get(stack).unwrap_or_else(|| {
                    panic!("scrape {scrape}: a stack counted before is gone: {stack:x?}")
                });
                assert!(
                    later.0 >= *objects && later.1 >= *space,
                    "scrape {scrape}: {stack:x?} went from {:?} to {later:?}",
                    (objects, space)
                );
            }
        }
        churn.push(site(&profile, CHURN).0);
        previous = Some(now);
        churned = child.churn_past(churned, 8 << 20).await;
    }
    assert!(
        churn[9] > churn[0],
        "the churning site's count grows: {churn:?}"
    );
}

#[tokio::test]
async fn symbolize_none_keeps_the_allocator_frames_at_the_leaf() {
    let child = Child::start(Build::Lines, "serve-sites", &[]);
    child.churn_past(0, 32 << 20).await;
    let (full, _) = child.profile("/debug/pprof/allocs").await;
    let (bare, body) = child.profile("/debug/pprof/allocs?symbolize=none").await;
    assert!(bare.mapping.iter().all(|m| !m.has_functions));
    assert!(bare.location.iter().all(|l| l.line.is_empty()));
    // Each named stack is the end of an unnamed one that starts further in: the
    // allocator's frames, kept.
    let unnamed: Vec<Vec<u64>> = stacks_by_address(&bare)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    let mut matched = 0;
    for ((frames, _), (addresses, _)) in stacks(&full).iter().zip(stacks_by_address(&full)) {
        if !frames.iter().any(|f| f.contains(CHURN)) {
            continue;
        }
        let longer = unnamed
            .iter()
            .find(|raw| raw.len() > addresses.len() && raw.ends_with(&addresses))
            .unwrap_or_else(|| panic!("no unnamed stack ends with {addresses:x?}"));
        assert!(longer.len() - addresses.len() >= 2, "{longer:x?}");
        matched += 1;
    }
    assert!(matched > 0, "no stack of {CHURN}");
    // `go tool pprof`, naming the addresses from the binary itself, finds the allocator at
    // the leaf, and the plumbing inlined into the site.
    let traces = go_pprof(&["-traces", "-sample_index=alloc_space"], &body);
    let trace = traces
        .split("-----------+")
        .find(|trace| trace.contains(CHURN))
        .unwrap_or_else(|| panic!("no trace of {CHURN}:\n{traces}"));
    let leaf = trace
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('-'))
        .and_then(|line| line.split_whitespace().last())
        .unwrap_or_default();
    assert!(
        leaf.contains("prof_backtrace") || leaf.starts_with("_rjem_") || leaf.starts_with("je_"),
        "the leaf of {CHURN}'s trace is {leaf}:\n{trace}"
    );
    // Each address, by every reader (google/pprof's with llvm-symbolizer and without),
    // names a function addr2line names there; Go 1.20 and older as they misread this
    // binary's code, which does not start on a page.
    let checked = assert_every_reader_names_as_addr2line(
        &body,
        child.server.pid(),
        std::path::Path::new(CHILD),
        "the allocation profile",
    );
    assert!(checked >= 5, "{checked} locations");
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn alloy_and_parca_memory_scrapes_get_counts_that_only_grow() {
    let child = Child::start(Build::Lines, "serve-sites", &[]);
    let addr = child.server.addr;
    child.churn_past(0, 8 << 20).await;
    // Parca's memory scrape: `/debug/pprof/allocs`, no `seconds` (delta false).
    let request = format!(
        "GET /debug/pprof/allocs HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: conprof/v0.23.0\r\n\
         Connection: close\r\n\r\n"
    );
    let (status, headers, body) = raw_request(addr, &request).await;
    assert_eq!(status, 200);
    assert!(!body.is_empty() && header(&headers, "content-encoding").is_none());
    let parca = decode(&body);
    assert_eq!(sample_types(&parca), go_types());
    assert_eq!(default_sample_type(&parca), "alloc_space");

    // Alloy's: the same path; it then subtracts each scrape's alloc_objects/count and
    // alloc_space/bytes from the previous one's, stack by stack by their addresses
    // (fastdelta), and passes the others through.
    let scrape = || async move {
        let request = format!(
            "GET /debug/pprof/allocs HTTP/1.1\r\nHost: {addr}\r\n\
             User-Agent: Alloy/v1.11.0 (linux; binary)\r\nConnection: close\r\n\r\n"
        );
        let (status, headers, body) = raw_request(addr, &request).await;
        assert!((200..300).contains(&status));
        assert!(
            header(&headers, "content-type")
                .unwrap()
                .starts_with("application/octet-stream")
        );
        assert_eq!(&body[..2], &[0x1f, 0x8b]);
        decode(&body)
    };
    let before_first = child.churned().await;
    let first = scrape().await;
    let after_first = child.churned().await;
    // About three seconds of churn: some 170 samples of the site between the two.
    let before_second = child.churn_past(after_first, 96 << 20).await;
    let second = scrape().await;
    let after_second = child.churned().await;
    for (ty, unit) in [("alloc_objects", "count"), ("alloc_space", "bytes")] {
        let i = column(&second, ty);
        assert_eq!(sample_types(&second)[i].1, unit, "matched by type and unit");
    }
    let (old, new) = (alloc_by_address(&first), alloc_by_address(&second));
    let mut churn_delta = 0;
    let names: HashMap<Vec<u64>, Vec<String>> = stacks_by_address(&second)
        .into_iter()
        .map(|(a, _)| a)
        .zip(stacks(&second).into_iter().map(|(f, _)| f))
        .collect();
    for (stack, (objects, space)) in &new {
        let (was_objects, was_space) = old.get(stack).copied().unwrap_or_default();
        assert!(
            objects - was_objects >= 0 && space - was_space >= 0,
            "a negative delta, which Pyroscope reads as a reset: {:?}",
            names.get(stack)
        );
        if names
            .get(stack)
            .is_some_and(|f| f.iter().any(|n| n.contains(CHURN)))
        {
            churn_delta += space - was_space;
        }
    }
    let (low, high) = (
        before_second.saturating_sub(after_first) as f64,
        after_second.saturating_sub(before_first) as f64,
    );
    assert!(
        churn_delta as f64 >= low * 0.75 && churn_delta as f64 <= high * 1.25,
        "the delta of the churning site is {:.1} MiB; it allocated {:.1}..{:.1} MiB",
        churn_delta as f64 / MIB,
        low / MIB,
        high / MIB
    );
}

#[tokio::test]
async fn the_views_take_sample_index() {
    let child = Child::start(Build::Lines, "serve-sites", &[]);
    child.churn_past(0, 32 << 20).await;
    async fn text(child: &Child, path: &str) -> String {
        let response = child.get(path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.text().await.unwrap()
    }
    let text = |path| text(&child, path);
    let allocated = text("/debug/pprof/allocs?format=text").await;
    assert!(allocated.starts_with("Type: alloc_space\n"), "{allocated}");
    assert!(allocated.contains(CHURN), "{allocated}");
    let held = text("/debug/pprof/allocs?format=text&sample_index=inuse_space").await;
    assert!(held.starts_with("Type: inuse_space\n"), "{held}");
    let heaviest = held
        .lines()
        .skip_while(|line| !line.contains("flat%"))
        .nth(1)
        .unwrap_or_default();
    assert!(heaviest.contains(RETAIN), "{held}");
    let objects = text("/debug/pprof/heap?format=text&sample_index=alloc_objects").await;
    assert!(objects.starts_with("Type: alloc_objects\n"), "{objects}");
    if cfg!(feature = "flamegraph") {
        let svg = text("/debug/pprof/heap?format=svg&sample_index=alloc_space").await;
        krabka_pprof_tests::assert_valid_xml(&svg);
        assert!(svg.contains(CHURN) && svg.contains("Allocations"), "{svg}");
        // The subtitle says what the counts cover: since they began, or a window.
        assert!(
            svg.contains("memory allocated since the counts began"),
            "{svg}"
        );
        let window = text("/debug/pprof/allocs?seconds=1&format=svg").await;
        assert!(
            window.contains("memory allocated, sampled over 1 s"),
            "{window}"
        );
    }
    // pprof: the default the views would show.
    let (profile, _) = child
        .profile("/debug/pprof/allocs?sample_index=inuse_objects")
        .await;
    assert_eq!(default_sample_type(&profile), "inuse_objects");
    let refused = child.get("/debug/pprof/heap?sample_index=cpu").await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("alloc_objects, alloc_space, inuse_objects, inuse_space")
            && text.contains("\"cpu\""),
        "{text}"
    );
}
