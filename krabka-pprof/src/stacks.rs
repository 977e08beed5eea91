//! Thread dumps (`/threads`, `/goroutine`): every thread's stack now, as a profile or as
//! Go's text forms. What each thread is (name, state, CPU time, what it waits on) comes
//! from `/proc/self/task`; its stack comes from the thread itself, unwinding in the
//! sampler's handler when signalled (`cpu/sampler/dump.rs`). A thread that blocks the
//! signal, does not answer in time or exits meanwhile is listed as such, never left out.

#![cfg_attr(not(sampler), allow(dead_code))]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::proto::Profile;

/// Why thread dumps cannot be taken on this target, if they cannot.
pub(crate) const UNAVAILABLE: Option<&str> = if cfg!(sampler) {
    None
} else {
    Some(
        "thread dumps are not available on this platform: they need Linux on x86_64 or \
         aarch64, where krabka-pprof's own signal handler unwinds each thread",
    )
};

/// One dump request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DumpRequest {
    /// How long to wait for the threads' answers.
    pub(crate) deadline: Duration,
    pub(crate) blocklist: &'static [&'static str],
    /// What the profile names (`?symbolize=`).
    pub(crate) symbolize: crate::profile::Symbolize,
}

/// Why a dump could not be taken.
#[derive(Debug)]
pub(crate) enum DumpError {
    Unavailable(&'static str),
    Failed(String),
}

/// One thread as `/proc/self/task/<tid>` describes it, read just before it is asked for
/// its stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcThread {
    pub(crate) tid: u32,
    pub(crate) name: String,
    /// The state letter of `stat`: `R`, `S`, `D`, `T`, `t`, `Z`, `X`, `I`.
    pub(crate) state: char,
    /// User and system CPU time so far.
    pub(crate) cpu: Duration,
    /// The kernel function it sleeps in, where the kernel tells.
    pub(crate) wchan: Option<String>,
}

impl ProcThread {
    /// Reads thread `tid` of this process; `None` if it is gone.
    #[cfg(sampler)]
    pub(crate) fn read(tid: u32) -> Option<ProcThread> {
        let dir = format!("/proc/self/task/{tid}");
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let (state, ticks) = parse_stat(&stat)?;
        let cpu = crate::cpu::thread_cpu_time(tid).unwrap_or(ticks);
        let name = std::fs::read_to_string(format!("{dir}/comm"))
            .map(|name| name.trim_end().to_owned())
            .unwrap_or_default();
        let wchan = std::fs::read_to_string(format!("{dir}/wchan"))
            .ok()
            .map(|w| w.trim().to_owned())
            .filter(|w| !w.is_empty() && w != "0");
        Some(ProcThread {
            tid,
            name,
            state,
            cpu,
            wchan,
        })
    }

    /// The state as a word.
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state {
            'R' => "running",
            'S' => "sleeping",
            'D' => "disk sleep",
            'T' => "stopped",
            't' => "tracing stop",
            'Z' => "zombie",
            'X' => "dead",
            'I' => "idle",
            _ => "unknown state",
        }
    }
}

/// The state letter and CPU time (`utime + stime`) of a `stat` line. The name (field 2)
/// may hold spaces and `)`, so the fields are counted from the last `)`.
#[cfg(sampler)]
fn parse_stat(stat: &str) -> Option<(char, Duration)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // Fields 14 and 15 of stat, counted from field 3.
    let ticks = ticks(11)?.saturating_add(ticks(12)?);
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&t| t > 0)
        .unwrap_or(100);
    Some((
        state,
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / per_second)),
    ))
}

/// Every thread of this process, by thread id.
#[cfg(sampler)]
pub(crate) fn list_threads() -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// A taken dump: the threads and the profile their stacks make.
pub(crate) struct ThreadDump {
    /// By thread id.
    pub(crate) threads: Vec<DumpedThread>,
    /// One sample per distinct stack (or per reason a thread has none), its value the
    /// threads with it, labelled with their names and ids.
    pub(crate) profile: Profile,
    pub(crate) deadline: Duration,
    /// Threads that answered with their stack.
    pub(crate) answered: usize,
}

/// One thread of a dump.
pub(crate) struct DumpedThread {
    pub(crate) proc: ProcThread,
    /// Its sample in the profile.
    pub(crate) sample: usize,
    /// Why it has no stack, if it has none.
    pub(crate) missing: Option<String>,
}

/// Takes a dump of every thread of the process, on the blocking pool, and hands it to
/// `render` there.
pub(crate) async fn dump<R, F>(request: DumpRequest, render: F) -> Result<R, DumpError>
where
    F: FnOnce(ThreadDump) -> Result<R, String> + Send + 'static,
    R: Send + 'static,
{
    if let Some(reason) = UNAVAILABLE {
        return Err(DumpError::Unavailable(reason));
    }
    crate::on_blocking_pool(
        move || render(take(request)?).map_err(DumpError::Failed),
        DumpError::Failed,
    )
    .await
}

#[cfg(not(sampler))]
fn take(_request: DumpRequest) -> Result<ThreadDump, DumpError> {
    Err(DumpError::Unavailable(UNAVAILABLE.unwrap_or_default()))
}

#[cfg(sampler)]
fn take(request: DumpRequest) -> Result<ThreadDump, DumpError> {
    use crate::cpu::ThreadStack;
    use crate::profile::{LabelValue, Meta, ProfileBuilder};

    let mut threads: Vec<ProcThread> = list_threads()
        .into_iter()
        .filter_map(ProcThread::read)
        .collect();
    threads.truncate(crate::cpu::MAX_DUMP_THREADS);
    let tids: Vec<u32> = threads.iter().map(|t| t.tid).collect();
    let taken = crate::cpu::take_thread_dump(&tids, request.blocklist, request.deadline)?;

    /// What threads with one sample share.
    #[derive(PartialEq, Eq, Hash)]
    enum Group {
        Stack(Vec<u64>, u8, bool),
        Missing(String),
    }
    let deadline = humantime::format_duration(request.deadline);
    let mut groups: HashMap<Group, usize> = HashMap::new();
    let mut members: Vec<(Vec<crate::profile::Frame>, Vec<usize>)> = Vec::new();
    let mut dumped = Vec::with_capacity(threads.len());
    let mut answered = 0;
    for (index, (proc, (_, stack))) in threads.into_iter().zip(taken.stacks).enumerate() {
        let missing = match &stack {
            ThreadStack::Unwound { .. } => None,
            ThreadStack::SignalBlocked => {
                Some("blocks SIGPROF (SigBlk), so it cannot be asked for its stack".to_owned())
            }
            ThreadStack::NoAnswer => Some(format!("did not answer within {deadline}")),
            ThreadStack::Exited => Some("exited during the dump".to_owned()),
            ThreadStack::NotSignalled(err) => Some(format!("could not be signalled: {err}")),
        };
        let group = match stack {
            ThreadStack::Unwound {
                frames,
                flags,
                complete,
            } => {
                answered += 1;
                Group::Stack(frames, flags, complete)
            }
            _ => Group::Missing(missing.clone().unwrap_or_default()),
        };
        let next = members.len();
        let sample = *groups.entry(group).or_insert_with_key(|group| {
            let frames = match group {
                Group::Stack(frames, flags, complete) => {
                    let mut frames = crate::cpu::stack_frames(frames, *flags, &taken.objects);
                    if !complete && *flags == 0 {
                        frames.push(crate::profile::Frame::Marker(
                            "[unwinding stopped: the rest of the stack is unknown]".to_owned(),
                        ));
                    }
                    frames
                }
                Group::Missing(why) => vec![crate::profile::Frame::Marker(format!("[{why}]"))],
            };
            members.push((frames, Vec::new()));
            next
        });
        members[sample].1.push(index);
        dumped.push(DumpedThread {
            proc,
            sample,
            missing,
        });
    }

    let mut builder = ProfileBuilder::new(&taken.objects).symbolize(request.symbolize);
    for (frames, threads) in members {
        let mut labels = Vec::with_capacity(threads.len() * 2);
        for &index in &threads {
            let proc = &dumped[index].proc;
            labels.push(("thread", LabelValue::Str(proc.name.clone())));
            labels.push(("tid", LabelValue::Num(i64::from(proc.tid))));
        }
        builder.add(frames, vec![threads.len() as i64], labels);
    }
    let meta = Meta {
        sample_types: &[("threads", "count")],
        period_type: ("threads", "count"),
        period: 1,
        time: std::time::SystemTime::now(),
        duration: Duration::ZERO,
        default_sample_type: None,
        comments: vec![format!(
            "krabka-pprof thread dump: {} threads, {answered} answered within {deadline} \
             (in {} µs); stacks read with {}",
            dumped.len(),
            taken.elapsed.as_micros(),
            taken.reader
        )],
    };
    Ok(ThreadDump {
        threads: dumped,
        profile: builder.finish(&meta, &|_| false),
        deadline: request.deadline,
        answered,
    })
}

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
    use crate::views::string;
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, string(profile, f.name)))
        .collect();
    let objects: HashMap<u64, &str> = profile
        .mapping
        .iter()
        .map(|m| (m.id, string(profile, m.filename)))
        .collect();
    let locations: HashMap<u64, &crate::proto::Location> =
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

/// `/cmdline`: the command line, arguments separated by NUL bytes, as Go's.
pub(crate) fn cmdline() -> Vec<u8> {
    let mut line = Vec::new();
    for (i, argument) in std::env::args_os().enumerate() {
        if i > 0 {
            line.push(0);
        }
        line.extend_from_slice(argument.as_encoded_bytes());
    }
    line
}

#[cfg(all(test, sampler))]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let stat = "42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        let (state, cpu) = parse_stat(stat).expect("parses");
        assert_eq!(state, 'S');
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(
            cpu,
            Duration::from_nanos(300 * (1_000_000_000 / per_second))
        );
        assert_eq!(parse_stat("42 (no fields)"), None);
    }

    #[test]
    fn this_thread_is_listed_with_its_name_and_state() {
        std::thread::Builder::new()
            .name("krabka-listed".to_owned())
            .spawn(|| {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
                assert!(list_threads().contains(&tid));
                let me = ProcThread::read(tid).expect("readable");
                assert_eq!(me.name, "krabka-listed");
                assert_eq!(me.state, 'R', "it is running while it reads itself");
            })
            .expect("spawns")
            .join()
            .expect("passes");
    }
}
