//! The tests of asking threads for their stacks: turns, the collector's timetable, what
//! a thread that does not answer is listed as.

use super::*;

/// The turn is the process's: the tests that take it take turns.
static TURNS: Mutex<()> = Mutex::new(());

/// While set, a dump reads no thread asleep: it signals every thread it asks (the
/// differential test's second reading).
pub(super) static SIGNAL_EVERY_THREAD: AtomicBool = AtomicBool::new(false);

/// Parks `depth` calls deep until `go` is set: a futex wait, which a signal leaves alone.
#[inline(never)]
#[unsafe(no_mangle)]
fn krabka_test_parked(depth: u32, go: &AtomicBool) {
    if depth == 0 {
        while !go.load(Ordering::SeqCst) {
            std::thread::park();
        }
    } else {
        krabka_test_parked(std::hint::black_box(depth - 1), go);
        std::hint::black_box(());
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_stack_read_asleep_is_the_one_its_thread_gives_when_signalled_or_a_prefix_of_it() {
    use crate::process::InKernel;
    let _turns = TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    let go = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let parked = std::thread::spawn({
        let go = Arc::clone(&go);
        move || {
            tid_tx.send(current_tid()).unwrap();
            krabka_test_parked(12, &go);
        }
    });
    let tid = tid_rx.recv().unwrap();
    let objects = Objects::current();
    let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
    let mut reader = Asleep::new();
    // Read asleep once the thread waits on its futex.
    let limit = Instant::now() + Duration::from_secs(10);
    let asleep = loop {
        assert!(
            Instant::now() < limit,
            "the thread never slept on its futex"
        );
        if matches!(ProcThread::in_kernel(tid), Some(InKernel::Asleep { nr, .. }) if nr == libc::SYS_futex)
        {
            match reader.read(&unwinding, &objects, tid) {
                Read::Whole { stack, .. } => break (stack, true),
                Read::Part { stack, .. } => break (stack, false),
                Read::NotAsleep => {}
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    // The same thread, signalled: it unwinds itself in the dump's handler.
    SIGNAL_EVERY_THREAD.store(true, Ordering::SeqCst);
    let turn = DumpTurn::take(Duration::from_secs(5)).expect("the turn is free");
    let dump = take_dump(&turn, &[tid], &[], Duration::from_secs(5), |_, _, _| true);
    SIGNAL_EVERY_THREAD.store(false, Ordering::SeqCst);
    drop(turn);
    go.store(true, Ordering::SeqCst);
    parked.thread().unpark();
    parked.join().unwrap();
    let mut dump = dump.expect("a dump");
    let signalled = match dump.stacks.pop() {
        Some((_, ThreadAnswer::Unwound(stack))) => stack,
        Some((_, other)) => panic!(
            "not unwound when signalled: {}",
            match other {
                ThreadAnswer::NoAnswer { .. } => "no answer",
                ThreadAnswer::Exited => "exited",
                ThreadAnswer::SignalBlocked { .. } => "signal blocked",
                ThreadAnswer::AsleepInPart { .. } => "read asleep in part",
                ThreadAnswer::NotSignalled(_) => "not signalled",
                ThreadAnswer::Unwound(_) => unreachable!(),
            }
        ),
        None => panic!("no answer at all"),
    };
    let ((asleep, whole), signalled) = (asleep, signalled);
    // The leaf: the instruction after `syscall` asleep; signalled, the same, or the
    // `syscall` itself where the kernel set the wait to restart (2 bytes before).
    let leaf_gap = asleep.frames[0].wrapping_sub(signalled.frames[0]);
    assert!(
        leaf_gap == 0 || leaf_gap == 2,
        "{:#x} against {:#x}",
        asleep.frames[0],
        signalled.frames[0]
    );
    let (asleep_callers, signalled_callers) = (&asleep.frames[1..], &signalled.frames[1..]);
    // With glibc, whose futex wrapper keeps its frame by the stack pointer, std's wait
    // above it is read through by its prologue: whole.
    if cfg!(target_env = "gnu") {
        assert!(whole, "read in part: {asleep_callers:x?}");
    }
    if whole {
        assert_eq!(
            asleep_callers, signalled_callers,
            "read whole: the same stack"
        );
    } else {
        assert!(
            signalled_callers.starts_with(asleep_callers),
            "read in part: a prefix of {signalled_callers:x?}: {asleep_callers:x?}"
        );
    }
    // And deep enough to have gone through the parked calls.
    assert!(signalled.frames.len() > 12, "{:x?}", signalled.frames);
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn one_turn_at_a_time_and_the_second_learns_how_long_the_first_waits() {
    let _turns = TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    let first = DumpTurn::take(Duration::from_secs(2)).expect("the turn is free");
    let refused = DumpTurn::take(Duration::from_secs(2))
        .err()
        .expect("it is taken");
    assert!(
        refused > Duration::from_millis(1500) && refused <= Duration::from_secs(2),
        "{refused:?}"
    );
    let cancel = first.canceller();
    assert!(!first.is_cancelled());
    cancel.cancel();
    assert!(first.is_cancelled());
    drop(first);
    drop(DumpTurn::take(Duration::from_millis(1)).expect("given back when dropped"));
}

/// The collector waits for, and signals again, only the threads it asked that have
/// neither been settled nor answered (or begun to): whether a reply is waited for is
/// each of the three, not any of them.
#[test]
fn only_threads_asked_unsettled_and_unanswered_are_waited_for() {
    let objects = Objects::current();
    let reply = |state| Reply {
        tid: 1,
        state: AtomicU8::new(state),
        filtered: AtomicBool::new(false),
        answer: UnsafeCell::new(Answer::new()),
    };
    let dump = Dump {
        id: 1,
        unwinding: Unwinding::new(&objects, &[], Memory::choose().memory),
        scratch: Box::new([]),
        // 0: pending; 1: done; 2: being written; 3: pending, never asked;
        // 4: pending, settled meanwhile (its state left pending here).
        replies: [PENDING, DONE, WRITING, PENDING, PENDING]
            .into_iter()
            .map(reply)
            .collect(),
        answered: AtomicU32::new(0),
        wake: Arc::new(Wake::default()),
        released: AtomicU32::new(0),
        expired: AtomicBool::new(false),
    };
    let mut collector = Collector::new(&dump, &objects);
    collector.asked = vec![true, true, true, false, true];
    collector.outcome[4] = Some(ThreadAnswer::Exited);
    let waited: Vec<bool> = (0..5).map(|i| collector.is_waited_for(i)).collect();
    assert_eq!(waited, [true, false, false, false, false]);
}

/// A finished dump is freed and no longer published: nothing of it outlives
/// `take_dump` (here its share of the turn's wake, which a dump left allocated keeps).
#[test]
fn a_finished_dump_is_freed() {
    let _turns = TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    let turn = DumpTurn::take(Duration::from_secs(2)).expect("the turn is free");
    assert_eq!(Arc::strong_count(&turn.wake), 1);
    let dump = take_dump(&turn, &[], &[], Duration::from_secs(2), |_, _, _| true).expect("a dump");
    assert!(dump.stacks.is_empty());
    assert!(
        DUMP.load(Ordering::SeqCst).is_null(),
        "the dump is still published"
    );
    assert_eq!(Arc::strong_count(&turn.wake), 1, "the dump was not freed");
}

/// The wait ends at its deadline; the deferred threads are looked at every
/// millisecond, the threads waited for checked and signalled again every 10 ms, each
/// counted from the last time it was done, none putting off the others.
#[test]
fn the_collector_looks_checks_and_resends_each_on_its_own_time() {
    let t0 = Instant::now();
    let mut pacing = Pacing::new(t0, ms(500));
    assert!(!pacing.is_over(t0) && !pacing.is_over(t0 + ms(499)));
    assert!(pacing.is_over(t0 + ms(500)) && pacing.is_over(t0 + ms(600)));

    assert!(!pacing.look_due(t0 + Duration::from_micros(999)));
    assert!(pacing.look_due(t0 + ms(1)));
    assert!(!pacing.check_due(t0 + ms(9)) && pacing.check_due(t0 + ms(10)));
    assert!(!pacing.resend_due(t0 + ms(9)) && pacing.resend_due(t0 + ms(10)));

    pacing.looked(t0 + ms(3));
    assert!(!pacing.look_due(t0 + ms(3) + Duration::from_micros(999)));
    assert!(pacing.look_due(t0 + ms(4)));
    pacing.sent(t0 + ms(12));
    assert!(!pacing.resend_due(t0 + ms(21)) && pacing.resend_due(t0 + ms(22)));
    assert!(pacing.check_due(t0 + ms(12)), "sending put off the check");
    pacing.checked(t0 + ms(15), false, true);
    assert!(!pacing.check_due(t0 + ms(24)) && pacing.check_due(t0 + ms(25)));
    assert!(
        pacing.resend_due(t0 + ms(22)),
        "checking put off the resend"
    );
    assert!(
        pacing.look_due(t0 + ms(15)),
        "checking or sending put off the look"
    );
}

/// Threads that can no longer answer end the wait only when two checks in a row find
/// every one of them so (a thread's mask holds the signal while its own handler runs)
/// and no thread is deferred.
#[test]
fn the_wait_ends_on_two_checks_in_a_row_finding_no_thread_able_to_answer() {
    let t0 = Instant::now();
    let mut pacing = Pacing::new(t0, ms(500));
    assert!(!pacing.checked(t0, true, true), "one check was enough");
    assert!(pacing.checked(t0, true, true));

    let mut pacing = Pacing::new(t0, ms(500));
    assert!(!pacing.checked(t0, true, true));
    assert!(!pacing.checked(t0, false, true));
    assert!(
        !pacing.checked(t0, true, true),
        "an able thread between did not count"
    );
    assert!(pacing.checked(t0, true, true));

    let mut pacing = Pacing::new(t0, ms(500));
    assert!(!pacing.checked(t0, true, false));
    assert!(
        !pacing.checked(t0, true, false),
        "ended with a thread deferred"
    );
    assert!(!pacing.checked(t0, false, true));
    assert!(!pacing.checked(t0, false, true));
}

/// The collector sleeps until its next step is due: the deadline, the next resend, or
/// the next look while threads are deferred; never less than 100 µs.
#[test]
fn the_collector_sleeps_until_its_next_step() {
    let t0 = Instant::now();
    let mut pacing = Pacing::new(t0, ms(500));
    assert_eq!(pacing.sleep(t0, true), ms(10), "to the resend");
    assert_eq!(pacing.sleep(t0 + ms(4), true), ms(6));
    assert_eq!(pacing.sleep(t0, false), ms(1), "to the look");
    pacing.looked(t0 + ms(2));
    assert_eq!(pacing.sleep(t0 + ms(2), false), ms(1));
    pacing.sent(t0 + ms(494));
    assert_eq!(pacing.sleep(t0 + ms(495), true), ms(5), "to the deadline");
    assert_eq!(
        pacing.sleep(t0 + ms(505), true),
        Duration::from_micros(100),
        "past every step"
    );
    assert_eq!(
        pacing.sleep(t0 + ms(100), false),
        Duration::from_micros(100)
    );
}

/// A thread that did not answer by the end is listed by its status then, with what
/// was read of its stack while it slept.
#[test]
fn a_thread_that_did_not_answer_is_listed_by_its_status_at_the_end() {
    let part = || {
        Some(Stack {
            frames: vec![1, 2],
            flags: 0,
            complete: false,
        })
    };
    let mask = 1 << (DUMP_SIGNAL - 1);
    let blocking = ThreadStatus {
        blocked: mask,
        seccomp: None,
    };
    let open = ThreadStatus {
        blocked: !mask,
        seccomp: None,
    };
    assert!(matches!(
        unanswered(Some(blocking), part()),
        ThreadAnswer::SignalBlocked { part: Some(part) } if part.frames == [1, 2]
    ));
    assert!(matches!(
        unanswered(Some(open), part()),
        ThreadAnswer::NoAnswer { part: Some(part) } if part.frames == [1, 2]
    ));
    assert!(matches!(unanswered(None, part()), ThreadAnswer::Exited));
}

/// A thread the kernel no longer knows (`ESRCH`) has exited; any other error is listed
/// as the reason it was not signalled.
#[test]
fn a_thread_the_signal_cannot_reach_has_exited_or_shows_the_error() {
    let error = std::io::Error::from_raw_os_error;
    assert!(matches!(
        not_signalled(error(libc::ESRCH)),
        ThreadAnswer::Exited
    ));
    assert!(matches!(
        not_signalled(error(libc::EPERM)),
        ThreadAnswer::NotSignalled(err) if err.raw_os_error() == Some(libc::EPERM)
    ));
}
