//! Scratch memory for signal handlers: a slot per handler that may unwind at once, taken
//! with a compare-and-swap (step 6 of the contract in `sampler.rs`), holding the unwinder's
//! cache, a copy of the interrupted stack and the frames found, so that the handler
//! uses little of the interrupted thread's own stack.

use std::cell::UnsafeCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};

use super::memory::Pipe;
use super::unwind::{Cache, MAX_DEPTH};

/// How far above the stack pointer the handler may copy the stack.
pub(crate) const MAX_STACK_COPY: usize = 256 * 1024;

/// One handler's working memory: kept off the interrupted thread's stack, which may have
/// little room left.
pub(crate) struct Scratch {
    pub(crate) cache: Cache,
    pub(crate) stack: FreshPages,
    pub(crate) frames: [u64; MAX_DEPTH],
}

/// Zeroed memory mapped straight from the kernel: its pages become resident only when
/// written. (`calloc` of the same size may reuse freed heap memory and zero it all, making
/// every page resident: a stack copy is sized for the deepest stack, but a typical one
/// uses a few pages of it.)
pub(crate) struct FreshPages {
    start: *mut u8,
    len: usize,
}

impl FreshPages {
    pub(crate) fn new(len: usize) -> FreshPages {
        // SAFETY: an anonymous private mapping; the result is checked.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            start != libc::MAP_FAILED,
            "mmap of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        FreshPages {
            start: start.cast(),
            len,
        }
    }
}

impl Deref for FreshPages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

impl std::ops::DerefMut for FreshPages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, writable, and borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

impl Drop for FreshPages {
    fn drop(&mut self) {
        // SAFETY: the mapping came from `mmap` in `new` and is unmapped once.
        unsafe { libc::munmap(self.start.cast(), self.len) };
    }
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for FreshPages {}

/// How many handlers can unwind at once, each in a scratch slot of its own: one per CPU
/// and two more, 4 to 16. The two more are for handlers that hold a slot while they are
/// not running: preempted on a loaded machine, or waiting in a stack read for the kernel's
/// memory-map lock while another thread maps or unmaps. With one slot per CPU alone, a
/// third handler on 2 CPUs found none and recorded its PC alone ("sampler busy"), which a
/// profile of a loaded 2-core machine showed.
pub(crate) fn scratch_slots() -> usize {
    slots_for(std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// [`scratch_slots`] for `cpus` CPUs.
fn slots_for(cpus: usize) -> usize {
    (cpus + 2).clamp(4, 16)
}

pub(crate) struct Slot {
    pub(crate) busy: AtomicBool,
    pub(crate) scratch: UnsafeCell<Scratch>,
    /// The pipe its handler copies the stack of a thread with its own seccomp filter
    /// through; closed until the drain sees such a thread.
    pub(crate) pipe: Pipe,
}

// SAFETY: `scratch` is only touched by the handler that set `busy` from false to true, until
// it stores false again.
unsafe impl Sync for Slot {}

impl Slot {
    pub(crate) fn new() -> Slot {
        Slot {
            busy: AtomicBool::new(false),
            scratch: UnsafeCell::new(Scratch {
                cache: Cache::new_in(),
                stack: FreshPages::new(MAX_STACK_COPY),
                frames: [0; MAX_DEPTH],
            }),
            pipe: Pipe::closed(),
        }
    }

    /// Takes the slot if no handler holds it; async-signal-safe.
    pub(crate) fn try_take(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_pages_are_as_long_as_asked_zeroed_and_writable() {
        let mut pages = FreshPages::new(3 * 4096);
        assert_eq!(pages.len(), 3 * 4096);
        assert!(pages.iter().all(|&b| b == 0));
        pages[4096] = 0x5a;
        pages[3 * 4096 - 1] = 0xa5;
        assert_eq!(
            (pages[4096], pages[3 * 4096 - 1], pages[0]),
            (0x5a, 0xa5, 0)
        );
    }

    /// Dropped, the pages are given back to the kernel. Read through `process_vm_readv`,
    /// which fails on unmapped memory rather than faulting; another test's thread may map
    /// something at the same address meanwhile, so what is read is compared with what
    /// was written there.
    #[test]
    fn fresh_pages_are_unmapped_when_dropped() {
        let mut pages = FreshPages::new(2 * 4096);
        let start = pages.as_ptr() as usize;
        let marker = (start as u128 ^ 0x9e37_79b9_7f4a_7c15_d1b5_4a32_d192_ed03).to_ne_bytes();
        pages[..16].copy_from_slice(&marker);
        assert_eq!(read_own(start).as_ref(), Some(&marker), "mapped while held");
        drop(pages);
        assert_ne!(
            read_own(start).as_ref(),
            Some(&marker),
            "the pages at {start:#x} are still mapped"
        );
    }

    /// 16 bytes of this process's memory at `address`, or `None` where none is mapped.
    fn read_own(address: usize) -> Option<[u8; 16]> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let mut bytes = [0u8; 16];
        let read = crate::sampler::memory::Memory::VmReadv { pid }.read(address as u64, &mut bytes);
        (read == 16).then_some(bytes)
    }

    #[test]
    fn a_slot_is_taken_by_one_handler_until_it_is_given_back() {
        let slot = Slot::new();
        assert!(slot.try_take());
        assert!(!slot.try_take(), "held");
        slot.busy.store(false, Ordering::Release);
        assert!(slot.try_take(), "given back");
    }

    #[test]
    fn slots_are_the_cpus_and_two_more_from_4_to_16() {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let slots = scratch_slots();
        assert!((4..=16).contains(&slots), "{slots}");
        assert!(slots >= (cpus + 2).min(16), "{slots} slots for {cpus} CPUs");
        assert_eq!(slots, slots_for(cpus));
        let counts = [1, 2, 3, 8, 14, 15, 64].map(|cpus| (cpus, slots_for(cpus)));
        assert_eq!(
            counts,
            [
                (1, 4),
                (2, 4),
                (3, 5),
                (8, 10),
                (14, 16),
                (15, 16),
                (64, 16)
            ]
        );
    }
}
