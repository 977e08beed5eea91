//! Thread dumps as Go's text forms: `debug=1` (threads grouped by identical stack, as
//! `goroutine?debug=1`) and `debug=2` (every thread with its state, CPU time, what it
//! waits on and its stack, as `goroutine?debug=2`), read from the dump's profile.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::take::{DumpedThread, ThreadDump};
use crate::profile::Profile;

/// One frame of a sample, for the text forms.
struct TextFrame<'p> {
    address: u64,
    /// Its functions, innermost (inlined) first.
    functions: Vec<&'p str>,
    object: &'p str,
}

/// Every sample's frames, leaf first, indexed like `profile.sample`: the profile's
/// tables are indexed once for all of them.
fn sample_frames(profile: &Profile) -> Vec<Vec<TextFrame<'_>>> {
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, profile.string(f.name)))
        .collect();
    let objects: HashMap<u64, &str> = profile
        .mapping
        .iter()
        .map(|m| (m.id, profile.string(m.filename)))
        .collect();
    let locations: HashMap<u64, &crate::profile::proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    profile
        .sample
        .iter()
        .map(|sample| {
            sample
                .location_id
                .iter()
                .filter_map(|id| locations.get(id))
                .map(|location| TextFrame {
                    address: location.address,
                    functions: location
                        .line
                        .iter()
                        .map(|line| functions.get(&line.function_id).copied().unwrap_or("?"))
                        .collect(),
                    object: objects.get(&location.mapping_id).copied().unwrap_or(""),
                })
                .collect()
        })
        .collect()
}

/// `debug=1`: threads grouped by identical stack, largest group first, in the shape of
/// Go's `goroutine?debug=1`.
pub(crate) fn grouped_text(dump: &ThreadDump) -> String {
    let mut text = format!(
        "threads profile: total {}, {} answered within {}\n",
        dump.threads.len(),
        dump.answered,
        humantime::format_duration(dump.deadline)
    );
    let mut samples: Vec<(usize, Vec<&DumpedThread>)> = (0..dump.profile.sample.len())
        .map(|i| (i, Vec::new()))
        .collect();
    for thread in &dump.threads {
        samples[thread.sample].1.push(thread);
    }
    samples.sort_by_key(|(i, threads)| (std::cmp::Reverse(threads.len()), *i));
    let all_frames = sample_frames(&dump.profile);
    for (index, threads) in samples {
        let frames = &all_frames[index];
        let addresses: Vec<String> = frames
            .iter()
            .filter(|f| f.address != 0)
            .map(|f| format!("{:#x}", f.address))
            .collect();
        let _ = writeln!(text, "\n{} @ {}", threads.len(), addresses.join(" "));
        let names: Vec<String> = threads
            .iter()
            .map(|t| format!("{} ({})", t.proc.name, t.proc.tid))
            .collect();
        let _ = writeln!(text, "# threads: {}", names.join(", "));
        for frame in frames {
            for (i, function) in frame.functions.iter().enumerate() {
                match (i, frame.address) {
                    (0, address) if address != 0 => {
                        let _ = writeln!(text, "#\t{address:#x}\t{function}");
                    }
                    _ => {
                        let _ = writeln!(text, "#\t\t{function}");
                    }
                }
            }
        }
    }
    text
}

/// `debug=2`: every thread, by thread id, with its state, CPU time, what it waits on and
/// its stack, in the shape of Go's `goroutine?debug=2`.
pub(crate) fn every_thread_text(dump: &ThreadDump) -> String {
    let mut text = format!(
        "threads: total {}, {} answered within {}\n",
        dump.threads.len(),
        dump.answered,
        humantime::format_duration(dump.deadline)
    );
    let all_frames = sample_frames(&dump.profile);
    for thread in &dump.threads {
        let proc = &thread.proc;
        let waits = proc
            .wchan
            .as_deref()
            .map(|w| format!(" in {w}"))
            .unwrap_or_default();
        let _ = write!(
            text,
            "\nthread {} \"{}\" [{}{waits}, {:.3}s CPU]:",
            proc.tid,
            proc.name,
            proc.state_name(),
            proc.cpu.as_secs_f64()
        );
        if let Some(missing) = &thread.missing {
            let _ = writeln!(text, " no stack: it {missing}");
            continue;
        }
        text.push('\n');
        for frame in &all_frames[thread.sample] {
            for function in &frame.functions {
                let _ = writeln!(text, "{function}");
            }
            if frame.address != 0 {
                let object = frame.object.rsplit('/').next().unwrap_or(frame.object);
                let _ = writeln!(text, "\t{:#x} in {object}", frame.address);
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::process::ProcThread;
    use crate::profile::proto::{Function, Line, Location, Mapping, Sample};

    /// A dump of four threads: two with one stack (a leaf with a function inlined into
    /// it, then `main`), one in `main` alone, one that exited before it answered.
    fn dump() -> ThreadDump {
        let strings = [
            "",
            "inlined_step",
            "leaf_work",
            "main",
            "/usr/lib/libwork.so",
            "[exited]",
        ];
        let function = |id: u64, name: i64| Function {
            id,
            name,
            ..Default::default()
        };
        let line = |function_id: u64| Line {
            function_id,
            line: 0,
            column: 0,
        };
        let profile = Profile {
            string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
            function: vec![
                function(1, 1),
                function(2, 2),
                function(3, 3),
                function(4, 5),
            ],
            mapping: vec![Mapping {
                id: 1,
                filename: 4,
                ..Default::default()
            }],
            location: vec![
                Location {
                    id: 1,
                    mapping_id: 1,
                    address: 0x1010,
                    line: vec![line(1), line(2)],
                    ..Default::default()
                },
                Location {
                    id: 2,
                    mapping_id: 1,
                    address: 0x2020,
                    line: vec![line(3)],
                    ..Default::default()
                },
                Location {
                    id: 3,
                    line: vec![line(4)],
                    ..Default::default()
                },
            ],
            sample: vec![
                Sample {
                    location_id: vec![2],
                    value: vec![1],
                    label: Vec::new(),
                },
                Sample {
                    location_id: vec![1, 2],
                    value: vec![2],
                    label: Vec::new(),
                },
                Sample {
                    location_id: vec![3],
                    value: vec![1],
                    label: Vec::new(),
                },
            ],
            ..Profile::default()
        };
        let thread =
            |tid: u32, name: &str, state: char, cpu_ms: u64, wchan: Option<&str>| ProcThread {
                tid,
                name: name.to_owned(),
                state,
                cpu: Duration::from_millis(cpu_ms),
                wchan: wchan.map(str::to_owned),
            };
        let dumped = |proc: ProcThread, sample: usize, missing: Option<&str>| DumpedThread {
            proc,
            sample,
            missing: missing.map(str::to_owned),
        };
        ThreadDump {
            threads: vec![
                dumped(thread(11, "main", 'S', 250, Some("ep_poll")), 0, None),
                dumped(thread(12, "worker-a", 'R', 1500, None), 1, None),
                dumped(
                    thread(13, "worker-b", 'S', 20, Some("futex_wait_queue")),
                    1,
                    None,
                ),
                dumped(
                    thread(14, "gone", 'Z', 0, None),
                    2,
                    Some("exited during the dump"),
                ),
            ],
            profile,
            deadline: Duration::from_secs(2),
            answered: 3,
        }
    }

    #[test]
    fn debug_1_groups_threads_by_stack_largest_group_first() {
        let text = grouped_text(&dump());
        let expected = "threads profile: total 4, 3 answered within 2s

2 @ 0x1010 0x2020
# threads: worker-a (12), worker-b (13)
#\t0x1010\tinlined_step
#\t\tleaf_work
#\t0x2020\tmain

1 @ 0x2020
# threads: main (11)
#\t0x2020\tmain

1 @ \n# threads: gone (14)
#\t\t[exited]
";
        assert_eq!(text, expected);
    }

    #[test]
    fn debug_2_lists_every_thread_with_its_state_cpu_wait_and_stack() {
        let text = every_thread_text(&dump());
        let expected = "threads: total 4, 3 answered within 2s

thread 11 \"main\" [sleeping in ep_poll, 0.250s CPU]:
main
\t0x2020 in libwork.so

thread 12 \"worker-a\" [running, 1.500s CPU]:
inlined_step
leaf_work
\t0x1010 in libwork.so
main
\t0x2020 in libwork.so

thread 13 \"worker-b\" [sleeping in futex_wait_queue, 0.020s CPU]:
inlined_step
leaf_work
\t0x1010 in libwork.so
main
\t0x2020 in libwork.so

thread 14 \"gone\" [zombie, 0.000s CPU]: no stack: it exited during the dump
";
        assert_eq!(text, expected);
    }
}
