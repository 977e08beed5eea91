//! Reading the interrupted thread's stack from the signal handler without ever faulting:
//! every byte goes through a system call that reports unreadable memory as an error.
//!
//! Two readers, chosen once per profile before any timer is armed ([`Memory::choose`]):
//! - `pread` on `/proc/self/mem`, opened before the window: what seccomp filters allow
//!   (hardened systemd units, sandboxes, container runtimes with strict profiles answer
//!   `process_vm_readv` with `EPERM`, or kill the process for calling it);
//! - `process_vm_readv` on our own pid, where `/proc` cannot be read and no filter is
//!   installed. With a filter installed, `process_vm_readv` is never called, not even to
//!   probe.
//!
//! If neither works, samples keep their leaf alone under a marker, and the choice says why.
//!
//! [`StackReader`] is what the unwinder reads through (step 9 of the contract in
//! `sampler.rs`): plain loads inside the thread's own stack (learned by the thread table), else
//! the system-call copy.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

pub(crate) const PAGE: u64 = 4096;
/// Pages one read may ask for at most.
pub(crate) const MAX_PAGES: usize = 4;

/// How the handler reads stack memory.
pub(crate) enum Memory {
    VmReadv { pid: libc::pid_t },
    ProcMem { file: OwnedFd },
    Unreadable,
}

/// The reader a session uses, and why it was chosen (for the profile's log line).
pub(crate) struct Choice {
    pub(crate) memory: Memory,
    pub(crate) why: String,
    /// The reader chosen first, for the usual reason (`pread` works and no seccomp filter
    /// is installed): nothing a reader of the profile needs to be told.
    pub(crate) usual: bool,
}

impl Memory {
    /// Picks the reader for this process as it is now: `pread` of `/proc/self/mem` where
    /// it works, else `process_vm_readv` where no seccomp filter is installed (on the
    /// process's main thread, the one `/proc/self/status` describes), else none.
    ///
    /// `pread` comes first because it is what seccomp filters allow: container runtimes'
    /// default profiles, hardened systemd units and sandboxes forbid `process_vm_readv`
    /// (some by killing the caller) but almost never `pread64`, and any thread may install
    /// a filter of its own at any moment. A thread known to have one is never read with a
    /// system call at all (`thread_table.rs`).
    pub(crate) fn choose() -> Choice {
        let proc_mem_refused = match open_proc_mem() {
            Ok(file) => {
                let memory = Memory::ProcMem { file };
                match probe(&memory) {
                    Ok(()) => {
                        let seccomp = crate::process::seccomp_mode();
                        let why = match seccomp {
                            0 => "pread of /proc/self/mem works here".to_owned(),
                            mode => format!(
                                "a seccomp filter is installed (Seccomp: {mode}): pread of \
                                 /proc/self/mem, which filters allow, never process_vm_readv"
                            ),
                        };
                        return Choice {
                            memory,
                            why,
                            usual: seccomp == 0,
                        };
                    }
                    Err(err) => format!("/proc/self/mem cannot be read ({err})"),
                }
            }
            Err(err) => format!("/proc/self/mem cannot be opened ({err})"),
        };
        let seccomp = crate::process::seccomp_mode();
        if seccomp != 0 {
            return Choice {
                memory: Memory::Unreadable,
                usual: false,
                why: format!(
                    "{proc_mem_refused}, and a seccomp filter is installed (Seccomp: {seccomp}), \
                     which may forbid process_vm_readv: stacks are not unwound"
                ),
            };
        }
        let memory = Memory::VmReadv {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        };
        match probe(&memory) {
            Ok(()) => Choice {
                memory,
                usual: false,
                why: format!("{proc_mem_refused}: reading with process_vm_readv instead"),
            },
            Err(err) => Choice {
                memory: Memory::Unreadable,
                usual: false,
                why: format!(
                    "{proc_mem_refused}, and process_vm_readv failed ({err}): stacks are not \
                     unwound"
                ),
            },
        }
    }

    /// A short name for logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Memory::VmReadv { .. } => "process_vm_readv",
            Memory::ProcMem { .. } => "/proc/self/mem",
            Memory::Unreadable => "none",
        }
    }

    /// Copies `target.len()` bytes from `address` (at most [`MAX_PAGES`] pages), stopping
    /// at the first page that cannot be read. Returns the bytes copied. Async-signal-safe.
    pub(crate) fn read(&self, address: u64, target: &mut [u8]) -> usize {
        match self {
            Memory::VmReadv { pid } => {
                // One remote range per page, so that a partial copy stops exactly at the
                // first unreadable page.
                let mut remote = [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; MAX_PAGES + 1];
                let mut count = 0;
                let mut at = address;
                let end = address + target.len() as u64;
                while at < end && count < remote.len() {
                    let next = ((at / PAGE + 1) * PAGE).min(end);
                    remote[count] = libc::iovec {
                        iov_base: at as *mut libc::c_void,
                        iov_len: (next - at) as usize,
                    };
                    count += 1;
                    at = next;
                }
                let local = libc::iovec {
                    iov_base: target.as_mut_ptr().cast(),
                    iov_len: (at - address) as usize,
                };
                // SAFETY: `local` is inside `target`; the remote ranges are only read, by
                // the kernel, which reports unreadable ones instead of faulting.
                let got = unsafe {
                    libc::process_vm_readv(*pid, &local, 1, remote.as_ptr(), count as _, 0)
                };
                usize::try_from(got).unwrap_or(0)
            }
            Memory::ProcMem { file } => {
                let Ok(offset) = libc::off64_t::try_from(address) else {
                    return 0;
                };
                // SAFETY: the kernel writes at most `target.len()` bytes into `target`; an
                // unreadable page ends the copy (or fails it with EIO).
                let got = unsafe {
                    libc::pread64(
                        file.as_raw_fd(),
                        target.as_mut_ptr().cast(),
                        target.len(),
                        offset,
                    )
                };
                usize::try_from(got).unwrap_or(0)
            }
            Memory::Unreadable => 0,
        }
    }
}

/// Reads a known local through `memory`.
fn probe(memory: &Memory) -> std::io::Result<()> {
    let source = [0x5au8; 16];
    let mut target = [0u8; 16];
    let got = memory.read(source.as_ptr() as u64, &mut target);
    if got == 16 && target == source {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn open_proc_mem() -> std::io::Result<OwnedFd> {
    let file = std::fs::File::open("/proc/self/mem")?;
    Ok(file.into())
}

/// A pipe to copy memory through with `write` and `read`: the two system calls every
/// seccomp filter allows (strict mode allows little else), and `write` reports memory it
/// cannot read with `EFAULT` instead of faulting. For threads with a filter of their own,
/// which may forbid `pread` and `process_vm_readv`. One per scratch slot, since the copy
/// passes through the pipe's buffer; opened off the signal path, only once such a thread
/// is seen (no file descriptors are taken otherwise).
pub(crate) struct Pipe {
    read: AtomicI32,
    write: AtomicI32,
}

impl Pipe {
    pub(crate) const fn closed() -> Pipe {
        Pipe {
            read: AtomicI32::new(-1),
            write: AtomicI32::new(-1),
        }
    }

    /// Whether the pipe is open. Async-signal-safe.
    pub(crate) fn is_open(&self) -> bool {
        self.write.load(Ordering::Acquire) >= 0
    }

    /// Opens the pipe if it is not open; off the signal path, by its slot's one writer.
    pub(crate) fn open(&self) {
        if self.write.load(Ordering::Acquire) >= 0 {
            return;
        }
        let mut fds = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } == 0 {
            self.read.store(fds[0], Ordering::Release);
            self.write.store(fds[1], Ordering::Release);
        }
    }

    /// Copies up to one page of `target.len()` bytes from `address` through the pipe;
    /// returns the bytes copied (0: not open, or nothing readable). Async-signal-safe.
    fn copy(&self, address: u64, target: &mut [u8]) -> usize {
        let (read, write) = (
            self.read.load(Ordering::Acquire),
            self.write.load(Ordering::Acquire),
        );
        if read < 0 || write < 0 {
            return 0;
        }
        // Within one page, at most PIPE_BUF: the pipe takes it whole, never blocking.
        let page_end = (address / PAGE + 1) * PAGE;
        let len = target.len().min((page_end - address) as usize);
        // SAFETY: the kernel reads `len` bytes at `address` (EFAULT where it cannot) and
        // writes them into the pipe; the pipe is this slot's and empty between copies.
        let sent = unsafe { libc::write(write, address as *const libc::c_void, len) };
        let Ok(sent) = usize::try_from(sent) else {
            return 0;
        };
        let mut got = 0;
        while got < sent {
            // SAFETY: reading back what was just written into `target`, within its length.
            let n = unsafe {
                libc::read(
                    read,
                    target[got..sent].as_mut_ptr().cast::<libc::c_void>(),
                    sent - got,
                )
            };
            match usize::try_from(n) {
                Ok(n) if n > 0 => got += n,
                _ => break,
            }
        }
        got
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        for fd in [
            self.read.load(Ordering::Acquire),
            self.write.load(Ordering::Acquire),
        ] {
            if fd >= 0 {
                // SAFETY: descriptors this pipe opened, closed once.
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// How a stack is copied where it cannot be read directly.
#[derive(Clone, Copy)]
pub(crate) enum Copies<'a> {
    /// With the session's reader.
    Memory(&'a Memory),
    /// Through a scratch slot's pipe: for threads with a seccomp filter of their own.
    Pipe(&'a Pipe),
}

impl Copies<'_> {
    fn read(self, address: u64, target: &mut [u8]) -> usize {
        match self {
            Copies::Memory(memory) => memory.read(address, target),
            Copies::Pipe(pipe) => pipe.copy(address, target),
        }
    }
}

/// Reads the interrupted thread's stack: directly below `direct_high` (the end of the
/// thread's own stack, see `thread_table.rs`), else through a lazily grown copy made by
/// system calls.
pub(crate) struct StackReader<'a> {
    pub(crate) copies: Copies<'a>,
    pub(crate) sp: u64,
    /// Zero, or the end of the range above `sp` that may be read with plain loads.
    pub(crate) direct_high: u64,
    pub(crate) copy: &'a mut [u8],
    pub(crate) copied: usize,
    /// A copy was refused as a seccomp filter refuses one (`EPERM`, `EACCES`, `ENOSYS`).
    pub(crate) refused: bool,
}

impl StackReader<'_> {
    pub(crate) fn read(&mut self, address: u64) -> Result<u64, ()> {
        if address >= self.sp
            && address
                .checked_add(8)
                .is_some_and(|end| end <= self.direct_high)
        {
            // SAFETY: `[sp, direct_high)` lies in this thread's own stack mapping, learned
            // off the signal path (`thread_table.rs`): mapped while the thread lives, so
            // the load cannot fault.
            return Ok(unsafe { (address as *const u64).read_unaligned() });
        }
        let offset = usize::try_from(address.checked_sub(self.sp).ok_or(())?).map_err(|_| ())?;
        let end = offset.checked_add(8).ok_or(())?;
        if end > self.copy.len() {
            return Err(());
        }
        // A frame can be larger than one step (a big array on the stack): copy step by
        // step until the address is covered or the stack ends.
        while self.copied < end {
            let from = self.sp + self.copied as u64;
            // Up to the end of the page `end` is on, at most MAX_PAGES pages per call.
            let page_end = (self.sp + end as u64).div_ceil(PAGE) * PAGE;
            let step_end = page_end.min((from / PAGE + MAX_PAGES as u64) * PAGE);
            let limit = (step_end - self.sp).min(self.copy.len() as u64) as usize;
            let got = self.copies.read(from, &mut self.copy[self.copied..limit]);
            if got == 0 {
                // SAFETY: errno is thread-local; the handler restores it before it returns.
                let errno = unsafe { *libc::__errno_location() };
                self.refused |= matches!(errno, libc::EPERM | libc::EACCES | libc::ENOSYS);
                return Err(());
            }
            self.copied += got;
        }
        let bytes: [u8; 8] = self.copy[offset..end].try_into().map_err(|_| ())?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A readable page, then an unmapped one (`/proc/self/mem` reads through protections,
    /// as debuggers need, so only a hole stops it), if the hole is still free.
    fn page_before_a_hole() -> u64 {
        // SAFETY: an anonymous mapping of two pages; the second is unmapped again.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p.cast::<u8>().add(PAGE as usize).cast(), PAGE as usize);
            (p as *mut u64).write(0x1122_3344_5566_7788);
            p as u64
        }
    }

    /// Whether nothing was mapped into the hole meanwhile (by another test's thread).
    fn hole_still_free(base: u64) -> bool {
        let hole = (base + PAGE) as *mut libc::c_void;
        // SAFETY: MAP_FIXED_NOREPLACE maps the hole only if it is free, and we unmap it.
        unsafe {
            let p = libc::mmap(
                hole,
                PAGE as usize,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            let free = p == hole;
            if p != libc::MAP_FAILED {
                libc::munmap(p, PAGE as usize);
            }
            free
        }
    }

    #[test]
    fn both_readers_stop_at_the_first_unmapped_page() {
        let readers = [
            Memory::VmReadv {
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() },
            },
            Memory::ProcMem {
                file: open_proc_mem().unwrap(),
            },
        ];
        for memory in &readers {
            let mut checked = false;
            for _attempt in 0..5 {
                let base = page_before_a_hole();
                let mut target = [0u8; 64];
                let across = memory.read(base + PAGE - 16, &mut target[..32]);
                let first = memory.read(base, &mut target[..8]);
                let value = u64::from_ne_bytes(target[..8].try_into().unwrap());
                let beyond = memory.read(base + PAGE, &mut target[..8]);
                let valid = hole_still_free(base);
                // SAFETY: unmapping the page mapped above.
                unsafe { libc::munmap(base as *mut libc::c_void, PAGE as usize) };
                if valid {
                    assert_eq!(across, 16, "{} stops at the hole", memory.name());
                    assert_eq!((first, value), (8, 0x1122_3344_5566_7788));
                    assert_eq!(beyond, 0, "{} reads nothing in the hole", memory.name());
                    checked = true;
                    break;
                }
            }
            assert!(checked, "the hole was taken five times in a row");
        }
        assert_eq!(Memory::Unreadable.read(0x1000, &mut [0u8; 8]), 0);
    }

    #[test]
    fn proc_self_mem_is_chosen_where_it_can_be_read() {
        let choice = Memory::choose();
        assert_eq!(choice.memory.name(), "/proc/self/mem", "{}", choice.why);
        assert!(probe(&choice.memory).is_ok());
        // Usual (a debug line) only without a filter; with one, the log says why.
        let seccomp = crate::process::seccomp_mode();
        assert_eq!(
            choice.usual,
            seccomp == 0,
            "Seccomp: {seccomp}: {}",
            choice.why
        );
        assert_eq!(
            choice.why.contains("seccomp filter"),
            seccomp != 0,
            "{}",
            choice.why
        );
        assert!(
            probe(&Memory::Unreadable).is_err(),
            "a reader that reads nothing"
        );
    }

    fn this_process() -> Memory {
        Memory::VmReadv {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        }
    }

    #[test]
    fn stack_reader_stops_at_unreadable_memory() {
        // A page we can read, then a hole: reads stop at the boundary.
        let memory = this_process();
        for _attempt in 0..5 {
            let base = page_before_a_hole();
            let mut copy = vec![0u8; super::super::scratch::MAX_STACK_COPY];
            let mut reader = StackReader {
                copies: Copies::Memory(&memory),
                sp: base,
                direct_high: 0,
                copy: &mut copy,
                copied: 0,
                refused: false,
            };
            let reads = [
                reader.read(base),
                reader.read(base + PAGE - 8),
                reader.read(base + PAGE),
                reader.read(base - 8),
                reader.read(base + super::super::scratch::MAX_STACK_COPY as u64),
            ];
            let refused = reader.refused;
            let valid = hole_still_free(base);
            // SAFETY: unmapping the page mapped above.
            unsafe { libc::munmap(base as *mut libc::c_void, PAGE as usize) };
            if valid {
                assert_eq!(reads[0], Ok(0x1122_3344_5566_7788));
                assert_eq!(reads[1], Ok(0));
                assert_eq!(reads[2], Err(()), "the hole is not read");
                assert_eq!(reads[3], Err(()), "below the stack pointer");
                assert_eq!(reads[4], Err(()), "beyond the copy");
                assert!(!refused, "a hole is not a refusal");
                return;
            }
        }
        panic!("the hole was taken five times in a row");
    }

    #[test]
    fn a_copy_a_seccomp_filter_refuses_is_told_from_a_hole() {
        // A thread of its own, with a filter of its own that answers pread64 and
        // process_vm_readv with EPERM, as container runtimes' profiles do.
        std::thread::spawn(|| {
            let memory = this_process();
            let nr = |call: libc::c_long| call as u32;
            let jump_if = |call, to_refusal| libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt: to_refusal,
                jf: 0,
                k: nr(call),
            };
            let answer = |k| libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k,
            };
            let mut program = [
                // The call's number (seccomp_data.nr, at offset 0).
                libc::sock_filter {
                    code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
                    jt: 0,
                    jf: 0,
                    k: 0,
                },
                jump_if(libc::SYS_pread64, 2),
                jump_if(libc::SYS_process_vm_readv, 1),
                answer(libc::SECCOMP_RET_ALLOW),
                answer(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            ];
            crate::process::tests::install_seccomp_filter(&mut program);
            let stack = [7u64; 64];
            let mut copy = vec![0u8; 4 * PAGE as usize];
            let mut reader = StackReader {
                copies: Copies::Memory(&memory),
                sp: stack.as_ptr() as u64,
                direct_high: 0,
                copy: &mut copy,
                copied: 0,
                refused: false,
            };
            assert_eq!(reader.read(stack.as_ptr() as u64), Err(()));
            assert!(reader.refused, "a refused copy is told as one");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn stack_reader_reaches_past_a_frame_larger_than_a_step() {
        let mut stack = vec![7u64; 40 * 1024 / 8];
        stack[36 * 1024 / 8] = 9;
        let memory = this_process();
        let mut copy = vec![0u8; super::super::scratch::MAX_STACK_COPY];
        let mut reader = StackReader {
            copies: Copies::Memory(&memory),
            sp: stack.as_ptr() as u64,
            direct_high: 0,
            copy: &mut copy,
            copied: 0,
            refused: false,
        };
        let far = stack.as_ptr() as u64 + 36 * 1024;
        assert_eq!(
            reader.read(far),
            Ok(9),
            "36 KiB above sp, several steps away"
        );
        assert_eq!(reader.read(far - 8), Ok(7));
    }

    /// Dropped, a pipe closes both its descriptors. Judged by what each number names
    /// (the pipe's inode), not by the number alone: another test's thread may open a file
    /// that takes a freed number at once.
    #[test]
    fn a_dropped_pipe_closes_both_its_descriptors() {
        fn names(fd: i32) -> Option<(u64, u64)> {
            let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: fstat writes a `stat` into `stat`, or fails (EBADF for a closed fd).
            if unsafe { libc::fstat(fd, stat.as_mut_ptr()) } != 0 {
                return None;
            }
            // SAFETY: fstat succeeded, so `stat` is written.
            let stat = unsafe { stat.assume_init() };
            Some((stat.st_dev, stat.st_ino))
        }
        let pipe = Pipe::closed();
        pipe.open();
        let fds = [&pipe.read, &pipe.write].map(|fd| fd.load(Ordering::Relaxed));
        let pipe_inode = names(fds[0]);
        assert!(
            pipe_inode.is_some() && names(fds[1]) == pipe_inode,
            "{fds:?}"
        );
        drop(pipe);
        for fd in fds {
            assert_ne!(
                names(fd),
                pipe_inode,
                "descriptor {fd} still open on the pipe"
            );
        }
    }

    #[test]
    fn a_pipe_copies_what_can_be_read_and_stops_at_a_hole() {
        let pipe = Pipe::closed();
        assert!(!pipe.is_open());
        let source = [0x5au8; 64];
        let mut target = [0u8; 64];
        assert_eq!(
            pipe.copy(source.as_ptr() as u64, &mut target),
            0,
            "closed: nothing"
        );
        pipe.open();
        assert!(pipe.is_open());
        // Never blocking (a full pipe must not stop a signal handler), never inherited.
        let write = pipe.write.load(Ordering::Relaxed);
        // SAFETY: fcntl reads the flags of a descriptor this pipe holds open.
        let (status, descriptor) = unsafe {
            (
                libc::fcntl(write, libc::F_GETFL),
                libc::fcntl(write, libc::F_GETFD),
            )
        };
        assert!(status & libc::O_NONBLOCK != 0 && descriptor & libc::FD_CLOEXEC != 0);
        let mut checked = false;
        for _attempt in 0..5 {
            assert_eq!(pipe.copy(source.as_ptr() as u64, &mut target), 64);
            assert_eq!(target, source);
            let base = page_before_a_hole();
            let mut page = [0u8; 16];
            let first = pipe.copy(base, &mut page[..8]);
            let value = u64::from_ne_bytes(page[..8].try_into().unwrap());
            let beyond = pipe.copy(base + PAGE, &mut page);
            let valid = hole_still_free(base);
            // SAFETY: unmapping the page mapped above.
            unsafe { libc::munmap(base as *mut libc::c_void, PAGE as usize) };
            if valid {
                assert_eq!((first, value), (8, 0x1122_3344_5566_7788));
                assert_eq!(beyond, 0, "the hole is not read, and nothing faults");
                // The pipe is empty again: the next copy reads its own bytes.
                assert_eq!(pipe.copy(source.as_ptr() as u64, &mut target[..8]), 8);
                assert_eq!(target[..8], source[..8]);
                checked = true;
                break;
            }
        }
        assert!(checked, "the hole was taken five times in a row");
    }
}
