//! Taking one thread dump: every thread listed from `/proc/self/task`, its stack read
//! through the sampler (`crate::sampler::take_dump`: without a signal while it sleeps,
//! else by asking it), identical stacks grouped into one sample of a profile, labelled
//! with their threads' names and ids. A thread that did not answer but was read while it
//! slept shows that part, marked with why it has no more.

#![cfg_attr(not(sampler), allow(dead_code))]

use std::time::Duration;

use crate::process::ProcThread;
use crate::profile::Profile;

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
    pub(crate) symbolize: crate::symbolize::Symbolize,
}

/// Why a dump could not be taken.
#[derive(Debug)]
pub(crate) enum DumpError {
    Unavailable(&'static str),
    /// Another dump runs; it waits for its threads `retry_after` more at most.
    Busy {
        retry_after: Duration,
    },
    Failed(String),
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

#[cfg(sampler)]
pub(super) fn take(
    request: DumpRequest,
    turn: &crate::sampler::DumpTurn,
) -> Result<ThreadDump, DumpError> {
    use std::collections::HashMap;

    use crate::process::list_threads;
    use crate::profile::{Frame, LabelValue, Meta, ProfileBuilder};
    use crate::sampler::{MAX_DUMP_THREADS, ThreadAnswer, stack_frames};

    let mut threads: Vec<ProcThread> = list_threads()
        .into_iter()
        .filter_map(ProcThread::read)
        .collect();
    threads.truncate(MAX_DUMP_THREADS);
    let tids: Vec<u32> = threads.iter().map(|t| t.tid).collect();
    let taken = ask_every_thread(turn, &tids, request.blocklist, request.deadline)?;

    /// What threads with one sample share.
    #[derive(PartialEq, Eq, Hash)]
    enum Group {
        Stack(Vec<u64>, u8, bool),
        /// The part of its stack read while it slept, and why it has no more.
        Part(Vec<u64>, u8, String),
        Missing(String),
    }
    let deadline = humantime::format_duration(request.deadline).to_string();
    let mut groups: HashMap<Group, usize> = HashMap::new();
    let mut members: Vec<(Vec<Frame>, Vec<usize>)> = Vec::new();
    let mut dumped = Vec::with_capacity(threads.len());
    let mut answered = 0;
    for (index, (proc, (_, answer))) in threads.into_iter().zip(taken.stacks).enumerate() {
        // Its own stack, or the exact part read while it slept, which is its answer.
        if matches!(
            answer,
            ThreadAnswer::Unwound(_) | ThreadAnswer::AsleepInPart { .. }
        ) {
            answered += 1;
        }
        let (why, part) = reason(answer, &deadline);
        let (group, missing) = match (why, part) {
            (None, Some(stack)) => (
                Group::Stack(stack.frames, stack.flags, stack.complete),
                None,
            ),
            (Some(why), Some(part)) => (Group::Part(part.frames, part.flags, why), None),
            (why, None) => {
                let why = why.unwrap_or_default();
                (Group::Missing(why.clone()), Some(why))
            }
        };
        let next = members.len();
        let sample = *groups.entry(group).or_insert_with_key(|group| {
            let frames = match group {
                Group::Stack(frames, flags, complete) => {
                    let mut frames = stack_frames(frames, *flags, &taken.objects);
                    if !complete && *flags == 0 {
                        frames.push(Frame::Marker(
                            "[unwinding stopped: the rest of the stack is unknown]".to_owned(),
                        ));
                    }
                    frames
                }
                Group::Part(frames, flags, why) => {
                    let mut frames = stack_frames(frames, *flags, &taken.objects);
                    frames.push(Frame::Marker(format!(
                        "[read while it slept, this far; it {why}]"
                    )));
                    frames
                }
                Group::Missing(why) => vec![Frame::Marker(format!("[{why}]"))],
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
            labels.push(("thread".into(), LabelValue::Str(proc.name.clone())));
            labels.push(("tid".into(), LabelValue::Num(i64::from(proc.tid))));
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
             (in {} µs); stacks read with {}; {} read asleep without a signal, {} signalled",
            dumped.len(),
            taken.elapsed.as_micros(),
            taken.reader,
            taken.asleep,
            taken.signalled,
        )],
    };
    Ok(ThreadDump {
        threads: dumped,
        profile: builder.finish(&meta, &|_| false),
        deadline: request.deadline,
        answered,
    })
}

/// Why a thread's answer holds no whole stack (`None`: it answered with one), and the
/// stack it holds: its own, or the part of one read while it slept.
#[cfg(sampler)]
fn reason(
    answer: crate::sampler::ThreadAnswer,
    deadline: &str,
) -> (Option<String>, Option<crate::sampler::Stack>) {
    use crate::sampler::ThreadAnswer;
    match answer {
        ThreadAnswer::Unwound(stack) => (None, Some(stack)),
        ThreadAnswer::SignalBlocked { part } => (
            Some("blocks SIGURG (SigBlk), so it cannot be asked for its stack".to_owned()),
            part,
        ),
        ThreadAnswer::NoAnswer { part } => {
            (Some(format!("did not answer within {deadline}")), part)
        }
        ThreadAnswer::AsleepInPart { part, syscall } => (
            Some(format!(
                "is asleep in {}, read without a signal up to a frame that needs the frame \
                 pointer, which a sleeping thread's registers in /proc do not give (not \
                 signalled: the signal would cut its wait short)",
                crate::process::syscall_name(syscall)
            )),
            Some(part),
        ),
        ThreadAnswer::Exited => (Some("exited during the dump".to_owned()), None),
        ThreadAnswer::NotSignalled(err) => (Some(format!("could not be signalled: {err}")), None),
    }
}

/// Whether a thread asleep in `syscall`, read in part up to the frame of return address
/// `stopped`, may be signalled for the rest of its stack: its wait must survive the
/// signal. A futex wait does. So does a sleep of the standard library's
/// (`std::thread::sleep`, through its platform `Thread::sleep`), which sleeps again for
/// what is left when `nanosleep` returns `EINTR`; a `nanosleep` of other code may not, nor
/// may `poll`, `epoll_wait` or a read, which return `EINTR` to code that may not retry. A
/// wait a signal interrupted before is `restart_syscall` now, whatever it was: it survives
/// if the frame it stopped at is one of the standard library's that retry (its sleep, its
/// futex wait).
#[cfg(sampler)]
fn survives_a_signal(
    syscall: i64,
    stopped: Option<u64>,
    objects: &crate::objects::Objects,
) -> bool {
    if syscall == libc::SYS_futex {
        return true;
    }
    if ![
        libc::SYS_nanosleep,
        libc::SYS_clock_nanosleep,
        libc::SYS_restart_syscall,
    ]
    .contains(&syscall)
    {
        return false;
    }
    let Some(at) = stopped.and_then(|stopped| stopped.checked_sub(1)) else {
        return false;
    };
    let resolved = crate::symbolize::Resolved::of(objects, vec![at]);
    resolved
        .functions(at)
        .is_some_and(|functions| functions.iter().any(|f| retries_on_eintr(&f.name)))
}

/// Whether `name` is one of the standard library's waits that retry on `EINTR`:
/// `std::thread::sleep` (wherever a given std defines it) and the platform sleep it calls,
/// and its futex wait.
#[cfg(sampler)]
fn retries_on_eintr(name: &str) -> bool {
    let name = name.trim_start_matches('<');
    let sleep = name.ends_with("::sleep") || name.ends_with("::sleep::nanosleep");
    name.starts_with("std::")
        && ((sleep && (name.contains("::thread") || name.contains("::Thread")))
            || name.ends_with("::futex::futex_wait"))
}

/// Asks each of `tids` for its stack (see `sampler/asking.rs`); blocks up to `deadline`,
/// or until `turn`'s dump is cancelled.
#[cfg(sampler)]
fn ask_every_thread(
    turn: &crate::sampler::DumpTurn,
    tids: &[u32],
    blocklist: &[&str],
    deadline: Duration,
) -> Result<crate::sampler::ThreadStacks, DumpError> {
    use crate::sampler::StartError;
    crate::sampler::take_dump(turn, tids, blocklist, deadline, survives_a_signal).map_err(|err| {
        match err {
            StartError::ForeignHandler => DumpError::Unavailable(
                "another SIGURG handler is installed in this process (a Go runtime linked in, or \
             a library that watches sockets' urgent data), and thread dumps ask each thread \
             with SIGURG; remove it to take them",
            ),
            StartError::Running => DumpError::Failed("another dump holds the handler".to_owned()),
            StartError::System(call, error) => DumpError::Failed(format!("{call} failed: {error}")),
        }
    })
}

#[cfg(test)]
#[cfg(sampler)]
mod tests {
    use super::*;
    use crate::sampler::{Stack, ThreadAnswer};

    /// The standard library's sleeps, which retry on `EINTR`, by the names symbolizers
    /// give them; not a sleep of the application's, nor another std function.
    #[test]
    fn the_standard_librarys_retrying_waits_are_known_by_name() {
        for wait in [
            "std::thread::sleep",
            "std::thread::functions::sleep",
            "std::sys::thread::unix::sleep",
            "std::sys::thread::unix::sleep::nanosleep",
            "<std::sys::pal::unix::thread::Thread>::sleep",
            "std::sys::pal::unix::thread::Thread::sleep",
            "std::sys::pal::unix::futex::futex_wait",
        ] {
            assert!(retries_on_eintr(wait), "{wait}");
        }
        for other in [
            "my_app::worker::sleep",
            "std::thread::park",
            "my_app::futex::futex_wait",
            "tokio::time::sleep",
            "std::net::TcpStream::read",
        ] {
            assert!(!retries_on_eintr(other), "{other}");
        }
    }

    /// Each answer's reason, as the dump's text and profile show it: a thread that exited
    /// before it was asked is said to have, whichever race made it so.
    #[test]
    fn each_answer_says_why_a_thread_has_no_whole_stack() {
        let stack = Stack {
            frames: vec![0x1000, 0x2000],
            flags: 0,
            complete: true,
        };
        let part = Stack {
            frames: vec![0x1000],
            flags: 0,
            complete: false,
        };
        assert_eq!(
            reason(ThreadAnswer::Unwound(stack.clone()), "1s"),
            (None, Some(stack))
        );
        assert_eq!(
            reason(
                ThreadAnswer::SignalBlocked {
                    part: Some(part.clone())
                },
                "1s"
            ),
            (
                Some("blocks SIGURG (SigBlk), so it cannot be asked for its stack".to_owned()),
                Some(part.clone())
            )
        );
        assert_eq!(
            reason(
                ThreadAnswer::NoAnswer {
                    part: Some(part.clone())
                },
                "250ms"
            ),
            (
                Some("did not answer within 250ms".to_owned()),
                Some(part.clone())
            )
        );
        let (said, kept) = reason(
            ThreadAnswer::AsleepInPart {
                part: part.clone(),
                syscall: libc::SYS_ppoll,
            },
            "1s",
        );
        let said = said.unwrap();
        assert!(
            said.starts_with("is asleep in ppoll, read without a signal")
                && said.contains("not signalled"),
            "{said}"
        );
        assert_eq!(kept, Some(part));
        assert_eq!(
            reason(ThreadAnswer::Exited, "1s"),
            (Some("exited during the dump".to_owned()), None)
        );
        let denied = std::io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            reason(ThreadAnswer::NotSignalled(denied), "1s"),
            (
                Some("could not be signalled: Operation not permitted (os error 1)".to_owned()),
                None
            )
        );
    }
}
