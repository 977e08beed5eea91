//! The drain's side of following the process's threads: timers and table entries for the
//! threads listed, their own stacks learned from `/proc/self/maps`, their own seccomp
//! filters found (`thread_table.rs` is the table the handler reads).

use super::DrainState;
use super::handler::{CPU_HANDLERS, Session};
use super::thread_table::{self, Threads};
use super::timers::Registry;
use crate::process::ProcThread;

/// Gives every thread in `alive` (sorted) a timer and an entry in the session's table, and
/// forgets the threads that exited; rebuilds the table when tombstones would fill it.
pub(super) fn refresh_threads(
    session: &Session,
    state: &mut DrainState,
    registry: &mut Registry,
    alive: &[u32],
    seccomp: Option<(u32, u32)>,
) {
    // SAFETY: the caller holds the drain lock: this is the one writer of the table.
    let mut threads = unsafe { session.threads.get() };
    let known: Vec<u32> = threads.known().collect();
    for tid in known {
        if alive.binary_search(&tid).is_err() {
            threads.forget(tid);
        }
    }
    // Every name of a thread gone, not only the timed ones the registry lists: a thread
    // that lived and died between two listings, sampled by the backstop, was named too,
    // and one session of a service that starts 100 threads a second would otherwise
    // keep a name for each of them (and hand a reused id the dead thread's name).
    state
        .names
        .retain(|tid, _| alive.binary_search(tid).is_ok());
    if threads.needs_rebuild(alive.len()) {
        session
            .threads
            .replace(threads.rebuilt(alive.len()), &CPU_HANDLERS);
        // SAFETY: as above; the new table.
        threads = unsafe { session.threads.get() };
    }
    // A thread's entry, and whether it has a seccomp filter of its own, come before its
    // timer: the timer's first signal may land a period later, while this drain is still
    // busy (on a loaded machine, preempted), and a handler that took the thread for an
    // unfiltered one would copy its stack with a call the filter may kill the process for.
    for &tid in alive {
        let new = threads.find(tid).is_none();
        if let Some(entry) = threads.add(tid)
            && new
            && has_own_filter(tid, seccomp)
        {
            mark_filtered(session, entry);
        }
    }
    let changes = registry.refresh(alive);
    for &tid in alive {
        let Some(entry) = threads.find(tid) else {
            continue;
        };
        let timed = registry.is_timed(tid);
        if timed != entry.is_timed() {
            entry.set_timed(timed);
        }
    }
    for &tid in &changes.timed {
        if let Ok(clock) = crate::process::thread_cpu_time(tid) {
            state.accounting.track(tid, clock);
        }
    }
}

/// Learns the own stacks of `threads` (id, control block) from one read of
/// `/proc/self/maps`, so that their later samples on them are read with plain loads.
pub(super) fn learn_stacks(table: &Threads, threads: &[(u32, u64)]) {
    if threads.is_empty() {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let maps = thread_table::Mappings::parse(&maps);
    let pid = std::process::id();
    for &(tid, tcb) in threads {
        if let Some(entry) = table.find(tid)
            && let Some((low, high)) = maps.own_stack(tcb, tid == pid)
        {
            entry.set_stack(low, high);
        }
    }
}

/// Whether thread `tid` has a seccomp filter the thread that chose the stack reader
/// (`chooser`: its mode and filter count) does not: one it installed itself.
pub(super) fn has_own_filter(tid: u32, chooser: Option<(u32, u32)>) -> bool {
    match ProcThread::seccomp(tid) {
        Some((0, _)) | None => false,
        theirs => theirs != chooser,
    }
}

/// Marks a thread as having a seccomp filter of its own: from now on its stack is copied
/// through the scratch slots' pipes, opened first.
pub(super) fn mark_filtered(session: &Session, entry: &thread_table::Thread) {
    for slot in session.slots.iter() {
        slot.pipe.open();
    }
    entry.set_filtered();
}
