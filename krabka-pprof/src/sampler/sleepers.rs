//! Sleeping threads read for wall-clock profiles (`crate::wall`): the thread dump's reader
//! (`asleep.rs`), which sends no signal, with an unwinder of its own, for one window. A
//! thread that runs, or wakes during every try, is not read: its time on the CPU is the
//! CPU sampler's to show. Where a sleeping thread's stack cannot be read without a signal
//! (aarch64), its system call is still known, and it is never signalled for the rest.

use super::asleep::{Asleep, Read};
use super::dump::Stack;
use super::memory::Memory;
use super::unwind::Unwinding;
use crate::objects::Objects;

/// What one look at a thread found.
pub(crate) enum Slept {
    /// Asleep in system call `syscall` (-1: in the kernel without one, a page fault), with
    /// its stack: `whole` when read to the outermost frame or as far as a signal would
    /// read it, else the exact part read, up to a frame that needs the frame pointer.
    Read {
        stack: Stack,
        syscall: i64,
        whole: bool,
    },
    /// Asleep in `syscall`, where its stack cannot be read without a signal (aarch64, or a
    /// process that is not dumpable): the stack is not read.
    Unread { syscall: i64 },
    /// Running, ready to run, woke during the read, or gone.
    NotAsleep,
}

/// The reader of one wall window: the objects loaded when it began, their unwind tables.
pub(crate) struct SleeperReader {
    objects: Objects,
    unwinding: Unwinding,
    asleep: Asleep,
}

impl SleeperReader {
    /// For the objects loaded now, with the app's blocklist (a blocklisted library is not
    /// unwound here either).
    pub(crate) fn new(blocklist: &[&str]) -> SleeperReader {
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, blocklist, Memory::choose().memory);
        SleeperReader {
            objects,
            unwinding,
            asleep: Asleep::new(),
        }
    }

    /// Looks at thread `tid` once, without a signal.
    pub(crate) fn look(&mut self, tid: u32) -> Slept {
        match self.asleep.read(&self.unwinding, &self.objects, tid) {
            Read::Whole { stack, syscall } => Slept::Read {
                stack,
                syscall,
                whole: true,
            },
            Read::Part { stack, syscall } => Slept::Read {
                stack,
                syscall,
                whole: false,
            },
            Read::NotAsleep if cfg!(target_arch = "x86_64") => Slept::NotAsleep,
            Read::NotAsleep => match crate::process::ProcThread::in_kernel(tid) {
                Some(crate::process::InKernel::Asleep { nr, .. }) => Slept::Unread { syscall: nr },
                _ => Slept::NotAsleep,
            },
        }
    }
}
