//! A wall window's profile: the CPU sampler's samples as the running part, the sweep's as
//! the time off the CPU, in `samples/count` and `wall/nanoseconds`, each sample labelled
//! with `thread_state` (and `syscall` where it slept in one). By default only the threads
//! doing work: a sample inside labels (a labelled poll, a span, a `scope`), or one whose
//! stack is not a runtime's or a pool's idle wait.
//!
//! The blocking view keeps, of the same window, the time threads slept *inside an async
//! task's poll*: what blocked the runtime. Told by the stack where it can be read (a
//! task's poll, or `block_on`'s, on it; not the blocking pool's, nor `block_in_place`),
//! else by tokio's task hooks where the app installed them (`crate::task_hooks`), else by
//! the labels (a labelled future or a span is polled while its labels are on the thread).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::sweep::{OffCpu, State, Swept};
use crate::labels::table::SampleLabels;
use crate::objects::Objects;
use crate::profile::{Frame, LabelValue, Meta, Profile, ProfileBuilder};
use crate::sampler::{self, stack_frames};
use crate::symbolize::{Resolved, Symbolize};

/// Which view of a wall window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum WallView {
    /// Everything (`/wall`).
    #[default]
    Wall,
    /// Time asleep inside an async task's poll (`/blocking`).
    Blocking,
}

/// What a wall request asks for beyond its window.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WallOptions {
    pub(crate) view: WallView,
    /// Every thread, idle ones too (fgprof's meaning), not only those doing work.
    pub(crate) every_thread: bool,
    /// Samples also carry `thread_id`.
    pub(crate) thread_ids: bool,
}

/// The pieces of a closed wall window.
pub(crate) struct WallParts {
    pub(crate) collected: sampler::Collected,
    pub(crate) shared_with: usize,
    pub(crate) symbolize: Symbolize,
    pub(crate) before: Resolved,
    /// The sweep, if its thread could be started.
    pub(crate) swept: Option<Swept>,
}

/// Functions a sleeping thread's stack is read past, from its leaf, to find the code that
/// waits: the standard library's waiting primitives and the crates that only wait (see
/// [`is_primitive`] for C's).
const PRIMITIVES: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "parking_lot",
    "mio::",
    "crossbeam_channel::",
    "crossbeam_utils::",
];

/// Whether a stack is read past function `name` to find the code that waits: one of
/// [`PRIMITIVES`], or a C function (a name without a path: the C library's system call
/// wrappers, `read`, `poll`, `pthread_cond_wait`…, whose list no one can keep, and C code
/// linked into the program, whose Rust caller says more).
fn is_primitive(name: &str) -> bool {
    !name.contains("::") || starts_with_any(name, PRIMITIVES)
}

/// Code whose wait, found past the primitives, is a runtime's or a pool's idle one (or
/// this profiler's own).
/// (`tokio::loom` is tokio's own wrapper of std's locks, which its runtime takes while it
/// parks, contended at times.)
const IDLE: &[&str] = &[
    "tokio::runtime::",
    "tokio::loom::",
    "rayon_core::",
    "krabka_pprof::",
];

/// Functions of a runtime that poll async tasks: a stack with one of them sleeps inside a
/// poll, unless one of [`MAY_BLOCK`] is nearer its leaf. Not generic, so that a build
/// without line tables (symbols only, where generic code is inlined) names them too; and
/// only those that poll (a worker's `run`, say, also parks it).
const TASK_POLLS: &[&str] = &[
    "tokio::runtime::scheduler::multi_thread::worker::Context::run_task",
    "tokio::runtime::scheduler::current_thread::Context::run_task",
    "tokio::runtime::scheduler::current_thread::CoreGuard::block_on",
    "tokio::runtime::park::CachedParkThread::block_on",
    "futures_executor::",
];

/// Of [`TASK_POLLS`], a runtime's polls of its tasks: what an idle wait's stack is read
/// for (a `block_on` further out than an idle wait is that `block_on` parking).
const WORKER_POLLS: &[&str] = &[
    "tokio::runtime::scheduler::multi_thread::worker::Context::run_task",
    "tokio::runtime::scheduler::current_thread::Context::run_task",
];

/// Code where blocking is allowed: tokio's blocking pool (`spawn_blocking`; tokio's
/// workers themselves run inside it, further out than the tasks they poll) and
/// `block_in_place`. Looked for before [`TASK_POLLS`] in each frame, since
/// `block_in_place` is a scheduler's function.
const MAY_BLOCK: &[&str] = &[
    "tokio::runtime::blocking::",
    "tokio::runtime::scheduler::block_in_place",
    "tokio::runtime::scheduler::multi_thread::worker::block_in_place",
    "tokio::task::blocking::block_in_place",
];

/// What a sleeping stack shows of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing past the waiting primitives (a stack cut in a C library without tables).
    Nothing,
    /// A runtime's or a pool's idle wait, and the innermost of a runtime's polls and the
    /// places blocking is allowed on its stack (`block_in_place` around a wait in the
    /// runtime's own code: allowed, whatever the task hooks say).
    Idle { poll: PollFrame },
    /// The program's own wait, and the innermost of a runtime's polls and the places
    /// blocking is allowed on its stack.
    Program { poll: PollFrame },
}

/// The innermost frame of a sleeping stack that says whether it sleeps inside an async
/// task's poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PollFrame {
    /// A runtime's poll of a task ([`TASK_POLLS`]): inside it.
    Task,
    /// A place where blocking is allowed ([`MAY_BLOCK`]): not inside one.
    MayBlock,
    /// Neither on the stack (as far as it was read).
    Neither,
}

/// How a place of the blocking view was told to be inside a task's poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToldBy {
    /// A task's poll on its stack.
    Stack,
    /// tokio's task hooks (`crate::task_hooks`).
    Hooks,
    /// The labels of a labelled future or span, where the stack could not be read that
    /// far.
    Labels,
}

/// Whether a place off the CPU, whose stack shows `seen`, is inside an async task's poll,
/// and how that was told: the stack's own frames where they say (a place blocking is
/// allowed is never inside one, whatever else says so), then the task hooks, then the
/// labels where the stack shows nothing of the program.
fn told_in_poll(seen: Seen, key: &OffCpu) -> Option<ToldBy> {
    if !matches!(key.state, State::Asleep { .. } | State::AsleepUnread { .. }) {
        return None;
    }
    match seen {
        Seen::Program {
            poll: PollFrame::MayBlock,
        }
        | Seen::Idle {
            poll: PollFrame::MayBlock,
        } => None,
        Seen::Program {
            poll: PollFrame::Task,
        } => Some(ToldBy::Stack),
        _ if key.polling => Some(ToldBy::Hooks),
        Seen::Nothing if key.labels != SampleLabels::default() => Some(ToldBy::Labels),
        _ => None,
    }
}

/// Whether `name` starts with one of `prefixes`, also as a trait method's `<Type as
/// Trait>::method`.
fn starts_with_any(name: &str, prefixes: &[&str]) -> bool {
    let name = name.strip_prefix('<').unwrap_or(name);
    prefixes.iter().any(|prefix| name.starts_with(prefix))
}

/// What a sleeping stack shows: past the waiting primitives from its leaf, the first
/// function named is a runtime's or a pool's (an idle wait) or the program's, or there is
/// none (read no further than a C library without unwind tables, static musl's: nothing
/// of the program, which counts as idle unless the thread is inside labels, as a stack
/// that cannot be read does).
fn seen(frames: &[Frame], resolved: &Resolved) -> Seen {
    let names: Vec<&str> = frames
        .iter()
        .flat_map(|frame| match frame {
            Frame::Code(address) => resolved.functions(*address).unwrap_or_default(),
            _ => &[],
        })
        .map(|function| function.name.as_str())
        .collect();
    seen_in(&names)
}

/// [`seen`] of a stack's function names, leaf first (inlined ones innermost first).
fn seen_in(names: &[&str]) -> Seen {
    let Some(first) = names.iter().find(|name| !is_primitive(name)) else {
        return Seen::Nothing;
    };
    // The innermost of a runtime's polls and the places blocking is allowed decides. Past
    // an idle wait, a `block_on` is that `block_on`'s own park (`blocking_recv` in
    // `block_in_place`, say), not a poll: only a runtime's poll of a task counts there.
    let idle = starts_with_any(first, IDLE);
    let polls = if idle { WORKER_POLLS } else { TASK_POLLS };
    let poll = match names
        .iter()
        .find(|name| starts_with_any(name, MAY_BLOCK) || starts_with_any(name, polls))
    {
        Some(name) if starts_with_any(name, MAY_BLOCK) => PollFrame::MayBlock,
        Some(_) => PollFrame::Task,
        None => PollFrame::Neither,
    };
    if idle {
        Seen::Idle { poll }
    } else {
        Seen::Program { poll }
    }
}

/// The marker that ends a stack read asleep in part.
const PART_MARKER: &str = "[read asleep up to here: the next frame needs the frame pointer, \
                           which a sleeping thread's registers in /proc do not give]";

/// The wall profile of `parts` at `frequency`.
pub(crate) fn wall_profile(parts: WallParts, options: WallOptions) -> Profile {
    let WallParts {
        collected,
        shared_with,
        symbolize,
        before,
        swept,
    } = parts;
    let objects: &Objects = &collected.objects;
    let period = 1_000_000_000 / i64::from(collected.frequency.max(1));
    let tid_of = |tid: u32| options.thread_ids.then_some(tid);
    let unnamed: Arc<str> = Arc::from(sampler::UNNAMED_THREAD);

    // Off the CPU: each key's frames, with markers where the stack is not whole.
    let mut off: Vec<(Vec<Frame>, &OffCpu, u64, u64)> = Vec::new();
    if let Some(swept) = &swept {
        for (key, charged) in &swept.off_cpu {
            let frames = match &key.state {
                State::Asleep {
                    frames,
                    flags,
                    whole,
                    ..
                } => {
                    let mut stack = stack_frames(frames, *flags, objects);
                    if !whole {
                        stack.push(Frame::Marker(PART_MARKER.to_owned()));
                    }
                    stack
                }
                State::AsleepUnread { .. } => vec![Frame::Marker(
                    "[asleep: its stack cannot be read without a signal on this platform]"
                        .to_owned(),
                )],
                State::Runnable => vec![Frame::Marker("[runnable: waiting for a CPU]".to_owned())],
                State::AsleepUnseen => vec![Frame::Marker(
                    "[asleep between two looks that found it running]".to_owned(),
                )],
            };
            off.push((frames, key, charged.looks, charged.nanos));
        }
    }
    // Names for the sleeping stacks, to tell idle waits (and to build the profile with).
    let mut resolved = before;
    let addresses: Vec<u64> = off
        .iter()
        .flat_map(|(frames, ..)| frames)
        .filter_map(|frame| match frame {
            Frame::Code(address) if !resolved.has_tried(*address) => Some(*address),
            _ => None,
        })
        .collect();
    resolved.add(objects, addresses);

    let mut builder = ProfileBuilder::new(objects).symbolize(symbolize);
    let mut left_out = (0u64, 0u64);
    // Of the blocking view's places, those told by the stack, by the hooks, by the labels.
    let mut decided = (0u64, 0u64, 0u64);
    let mut threads_shown = std::collections::HashSet::new();
    for (frames, key, looks, nanos) in off {
        let seen = match &key.state {
            State::Asleep { whole, .. } => match seen(&frames, &resolved) {
                // A part read up to a frame that needs the frame pointer may have its
                // task's poll further out: not known.
                Seen::Program {
                    poll: PollFrame::Neither,
                } if !whole => Seen::Nothing,
                seen => seen,
            },
            State::AsleepUnread { .. } => Seen::Nothing,
            State::Runnable | State::AsleepUnseen => Seen::Program {
                poll: PollFrame::Neither,
            },
        };
        let keep = match options.view {
            WallView::Wall => {
                options.every_thread || key.working() || matches!(seen, Seen::Program { .. })
            }
            WallView::Blocking => match told_in_poll(seen, key) {
                Some(ToldBy::Stack) => {
                    decided.0 += 1;
                    true
                }
                Some(ToldBy::Hooks) => {
                    decided.1 += 1;
                    true
                }
                Some(ToldBy::Labels) => {
                    decided.2 += 1;
                    true
                }
                None => false,
            },
        };
        if !keep {
            left_out.0 += 1;
            left_out.1 += nanos;
            continue;
        }
        threads_shown.insert(key.tid);
        let name = swept
            .as_ref()
            .and_then(|swept| swept.names.get(&key.tid))
            .unwrap_or(&unnamed);
        let mut labels = crate::profile::thread_labels(name, tid_of(key.tid), key.labels.pairs());
        let (state, syscall) = match &key.state {
            State::Asleep { syscall, .. } | State::AsleepUnread { syscall } => {
                ("sleeping", Some(*syscall))
            }
            State::Runnable => ("runnable", None),
            State::AsleepUnseen => ("sleeping", None),
        };
        labels.push(("thread_state".into(), LabelValue::Str(state.to_owned())));
        if let Some(syscall) = syscall {
            labels.push((
                "syscall".into(),
                LabelValue::Str(crate::process::syscall_name(syscall)),
            ));
        }
        builder.add(frames, vec![looks as i64, nanos as i64], labels);
    }
    // On the CPU: the CPU sampler's samples, each period a period of the thread's time
    // (none in the blocking view: a thread on a CPU does not block).
    let running_part = options.view == WallView::Wall;
    let mut merged: HashMap<RunningKey<'_>, sampler::Tally> = HashMap::new();
    for (stack, tally) in collected.stacks.iter().filter(|_| running_part) {
        let name = collected.names.get(&stack.tid).unwrap_or(&unnamed).clone();
        let key = (
            name,
            tid_of(stack.tid),
            stack.flags,
            &stack.frames[..],
            &stack.labels,
        );
        let sum = merged.entry(key).or_default();
        sum.samples += tally.samples;
        sum.periods += tally.periods;
    }
    for ((name, tid, flags, frames, labels), tally) in merged {
        let mut sample_labels = crate::profile::thread_labels(&name, tid, labels.pairs());
        sample_labels.push(running());
        builder.add(
            stack_frames(frames, flags, objects),
            vec![tally.samples as i64, tally.periods as i64 * period],
            sample_labels,
        );
    }
    if running_part && collected.lost.samples > 0 {
        builder.add(
            vec![Frame::Marker("[lost: sample buffer full]".into())],
            vec![
                collected.lost.samples as i64,
                collected.lost.periods as i64 * period,
            ],
            vec![running()],
        );
    }
    let unattributed = collected.unattributed.as_nanos() as i64;
    if running_part && unattributed > 2 * period {
        builder.add(
            vec![Frame::Marker(
                "[threads too short-lived to be sampled, or without a CPU timer]".to_owned(),
            )],
            vec![(unattributed + period / 2) / period, unattributed],
            vec![running()],
        );
    }
    let comments = comments(
        &collected,
        swept.as_ref(),
        shared_with,
        options,
        (left_out, decided),
        threads_shown.len(),
    );
    builder = builder.resolved_before(resolved);
    builder.finish(
        &Meta {
            sample_types: &[("samples", "count"), ("wall", "nanoseconds")],
            period_type: ("wall", "nanoseconds"),
            period,
            time: collected.started,
            duration: collected.duration,
            default_sample_type: None,
            comments,
        },
        &|_| false,
    )
}

/// What the running samples of one thread name are merged by: the name, the thread's id
/// if asked, the stack's flags and frames, the labels.
type RunningKey<'c> = (Arc<str>, Option<u32>, u8, &'c [u64], &'c SampleLabels);

fn running() -> (Cow<'static, str>, LabelValue) {
    ("thread_state".into(), LabelValue::Str("running".to_owned()))
}

/// What `go tool pprof -comments` shows of how the window went.
fn comments(
    collected: &sampler::Collected,
    swept: Option<&Swept>,
    shared_with: usize,
    options: WallOptions,
    ((left_places, left_nanos), (by_stack, by_hooks, by_labels)): ((u64, u64), (u64, u64, u64)),
    threads_shown: usize,
) -> Vec<String> {
    let mut comments = vec![format!(
        "krabka-pprof wall-clock profile: time on a CPU from {} Hz per-thread CPU timers \
         (stacks read with {}); time off it from looks at every thread {} times a second, \
         without a signal",
        collected.frequency, collected.report.reader, collected.frequency
    )];
    match swept {
        Some(swept) => comments.push(format!(
            "{} looks over {} ms: {} stacks read asleep ({} found where the thread was last \
             read, with the same stack words, and not unwound again), {} places counted again \
             unread (the thread had not run), {} looks at quiet threads put off (no thread \
             of the service had run since their last), {} first looks taken from the last \
             window's end (the thread had not run since); the looks took {} ms of CPU",
            swept.looks,
            swept.elapsed.as_millis(),
            swept.stacks_read,
            swept.same_again,
            swept.counted_again,
            swept.put_off,
            swept.remembered,
            swept.cpu.as_millis()
        )),
        None => comments.push(
            "time off the CPU is missing: the thread that looks at sleeping threads could not \
             be started"
                .to_owned(),
        ),
    }
    match options.view {
        WallView::Blocking => {
            let hooks = if crate::labels::current::hooked() {
                "tokio's task hooks installed"
            } else {
                "tokio's task hooks not installed (krabka_pprof::task_hooks)"
            };
            comments.push(format!(
                "blocking view: time threads slept inside an async task's poll \
                 ({threads_shown} threads); {by_stack} places told by a task's poll on the \
                 stack, {by_hooks} by tokio's task hooks ({hooks}), {by_labels} by the \
                 labels of a labelled future or span where the stack could not be read that \
                 far; {left_places} other places, {} ms, left out",
                left_nanos / 1_000_000
            ));
        }
        WallView::Wall if options.every_thread => {
            comments.push("every thread, idle ones too (?threads=all)".to_owned());
        }
        WallView::Wall => comments.push(format!(
            "threads doing work only ({threads_shown} off the CPU shown): left out, \
             {left_places} places without labels in a runtime's or pool's idle wait, or whose \
             stack shows nothing of the program, {} ms (?threads=all shows them)",
            left_nanos / 1_000_000
        )),
    }
    if !cfg!(target_arch = "x86_64") {
        comments.push(
            "on this architecture a sleeping thread's stack cannot be read without a signal, \
             and none is sent: time asleep carries its labels and system call under a marker"
                .to_owned(),
        );
    }
    if shared_with > 1 {
        comments.push(format!(
            "{shared_with} windows shared the CPU sampler while this one was open; this \
             profile holds the samples of its own window only"
        ));
    }
    comments
}

#[cfg(test)]
mod tests {
    use super::{
        IDLE, PollFrame, Seen, State, ToldBy, is_primitive, seen_in, starts_with_any, told_in_poll,
    };
    use crate::labels::table::SampleLabels;
    use crate::wall::sweep::OffCpu;

    #[test]
    fn a_place_is_inside_a_poll_by_its_stack_then_the_hooks_then_the_labels() {
        let asleep = |polling| OffCpu {
            tid: 1,
            state: State::AsleepUnread { syscall: 7 },
            labels: SampleLabels::default(),
            polling,
        };
        let task = Seen::Program {
            poll: PollFrame::Task,
        };
        let may_block = Seen::Program {
            poll: PollFrame::MayBlock,
        };
        let neither = Seen::Program {
            poll: PollFrame::Neither,
        };
        assert_eq!(told_in_poll(task, &asleep(false)), Some(ToldBy::Stack));
        assert_eq!(told_in_poll(task, &asleep(true)), Some(ToldBy::Stack));
        // `block_in_place` inside a poll: allowed, whatever the hooks say.
        assert_eq!(told_in_poll(may_block, &asleep(true)), None);
        // A stack cut short, or one whose poll frame no build names: the hooks tell.
        assert_eq!(
            told_in_poll(Seen::Nothing, &asleep(true)),
            Some(ToldBy::Hooks)
        );
        assert_eq!(told_in_poll(neither, &asleep(true)), Some(ToldBy::Hooks));
        let idle = |poll| Seen::Idle { poll };
        assert_eq!(
            told_in_poll(idle(PollFrame::Neither), &asleep(true)),
            Some(ToldBy::Hooks)
        );
        // `block_in_place(|| rx.blocking_recv())`: the wait is in the runtime's own code,
        // inside a place where blocking is allowed, inside a hooked poll.
        assert_eq!(told_in_poll(idle(PollFrame::MayBlock), &asleep(true)), None);
        assert_eq!(told_in_poll(neither, &asleep(false)), None);
        assert_eq!(told_in_poll(Seen::Nothing, &asleep(false)), None);
        // Ready to run is not asleep in a poll, hooks or not.
        let runnable = OffCpu {
            state: State::Runnable,
            ..asleep(true)
        };
        assert_eq!(told_in_poll(task, &runnable), None);
    }

    #[test]
    fn a_sleep_is_inside_a_poll_where_a_runtime_polls_it_and_not_where_blocking_is_allowed() {
        let worker = "tokio::runtime::scheduler::multi_thread::worker::Context::run_task";
        let pool = "tokio::runtime::blocking::pool::Inner::run";
        // A task on a worker (tokio's workers run inside the blocking pool, further out).
        let task = [
            "clock_nanosleep",
            "std::thread::sleep",
            "app::handler",
            worker,
            pool,
        ];
        assert_eq!(
            seen_in(&task),
            Seen::Program {
                poll: PollFrame::Task
            }
        );
        // A `spawn_blocking` closure.
        let blocking = ["clock_nanosleep", "std::thread::sleep", "app::job", pool];
        assert_eq!(
            seen_in(&blocking),
            Seen::Program {
                poll: PollFrame::MayBlock
            }
        );
        // `block_in_place` on a worker.
        let in_place = [
            "read",
            "app::load",
            "tokio::runtime::scheduler::multi_thread::worker::block_in_place",
            "app::handler",
            worker,
            pool,
        ];
        assert_eq!(
            seen_in(&in_place),
            Seen::Program {
                poll: PollFrame::MayBlock
            }
        );
        // `block_on`'s own future, on the thread that called it.
        let main = [
            "futex",
            "app::wait",
            "tokio::runtime::park::CachedParkThread::block_on",
        ];
        assert_eq!(
            seen_in(&main),
            Seen::Program {
                poll: PollFrame::Task
            }
        );
        // A thread of the program's own, no runtime: not inside a poll.
        let own = ["clock_nanosleep", "std::thread::sleep", "app::ticker"];
        assert_eq!(
            seen_in(&own),
            Seen::Program {
                poll: PollFrame::Neither
            }
        );
        // An idle worker, and a stack cut in the C library.
        let idle = [
            "epoll_wait",
            "mio::poll::Poll::poll",
            "tokio::runtime::io::driver::Driver::turn",
            worker,
        ];
        assert_eq!(
            seen_in(&idle),
            Seen::Idle {
                poll: PollFrame::Task
            }
        );
        // A worker parking, its timer's lock contended: idle, not a poll that blocks.
        let parking = [
            "syscall",
            "std::sys::pal::unix::futex::futex_wait",
            "lock",
            "std::sync::poison::mutex::Mutex<T>::lock",
            "tokio::loom::std::mutex::Mutex<T>::lock",
            "tokio::runtime::time::Inner::lock",
            "tokio::runtime::scheduler::multi_thread::park::Parker::park",
            "tokio::runtime::scheduler::multi_thread::worker::Context::park",
            "tokio::runtime::scheduler::multi_thread::worker::Context::run",
            pool,
        ];
        assert_eq!(
            seen_in(&parking),
            Seen::Idle {
                poll: PollFrame::MayBlock
            }
        );
        // A blocking receive inside `block_in_place` inside a task's poll: idle code, in
        // a place where blocking is allowed.
        let in_place_recv = [
            "syscall",
            "std::sys::pal::unix::futex::futex_wait",
            "tokio::runtime::park::Inner::park",
            "tokio::runtime::park::CachedParkThread::park",
            "tokio::runtime::park::CachedParkThread::block_on",
            "tokio::sync::mpsc::Receiver<T>::blocking_recv",
            "app::handler::{{closure}}",
            "tokio::runtime::scheduler::multi_thread::worker::block_in_place",
            "app::handler",
            worker,
            pool,
        ];
        assert_eq!(
            seen_in(&in_place_recv),
            Seen::Idle {
                poll: PollFrame::MayBlock
            }
        );
        // User code run from a worker's park (a waker, a drop), not from a task's poll:
        // the pool a worker runs in is the innermost of the places that say.
        let from_park = [
            "futex",
            "app::on_wake",
            "tokio::runtime::scheduler::multi_thread::park::Parker::park",
            "tokio::runtime::scheduler::multi_thread::worker::Context::run",
            pool,
        ];
        assert_eq!(
            seen_in(&from_park),
            Seen::Program {
                poll: PollFrame::MayBlock
            }
        );
        assert_eq!(seen_in(&["__syscall_cp_asm"]), Seen::Nothing);
    }

    #[test]
    fn idle_waits_are_told_by_the_first_function_past_the_primitives() {
        for primitive in [
            "std::sys::pal::unix::futex::futex_wait",
            "<std::sync::mpsc::Receiver<T>>::recv",
            "parking_lot_core::parking_lot::park",
            "mio::poll::Poll::poll",
            "__GI___poll",
            "epoll_wait",
            "clock_nanosleep",
            "read",
            "__syscall_cp_asm",
            "pthread_cond_timedwait",
        ] {
            assert!(is_primitive(primitive), "{primitive}");
        }
        for idle in [
            "tokio::runtime::scheduler::multi_thread::park::Parker::park",
            "<tokio::runtime::blocking::pool::Inner>::run",
            "rayon_core::sleep::Sleep::sleep",
        ] {
            assert!(starts_with_any(idle, IDLE), "{idle}");
            assert!(!is_primitive(idle), "{idle}");
        }
        for working in [
            "my_service::handlers::checkout",
            "tokio::fs::read::{{closure}}",
            "hyper::proto::h1::dispatch::Dispatcher::poll_loop",
        ] {
            assert!(!starts_with_any(working, IDLE), "{working}");
            assert!(!is_primitive(working), "{working}");
        }
    }
}
