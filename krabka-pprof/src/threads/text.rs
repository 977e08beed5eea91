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
