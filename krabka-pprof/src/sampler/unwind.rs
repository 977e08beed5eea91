//! Unwinding in the signal handler (step 8 of the contract in `sampler.rs`): framehop
//! over the unwind tables of the loaded objects, with fixed storage so that it never
//! allocates; the tables of the executable and the vDSO read where they are, those of
//! libraries copied (so that the app's `dlclose` is never held back, and the handler never
//! reads a library's pages, which a `dlclose` could unmap); the blocklist; the registers
//! of the interrupted context. One [`Unwinding`] serves CPU samples and thread dumps alike;
//! a session builds a new one when libraries are loaded or unloaded.

use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::sync::Mutex;

use framehop::{
    AllocationPolicy, CacheNative, ExplicitModuleSectionInfo, Module, UnwindRegsNative,
    Unwinder as _, UnwinderNative,
};

use super::buffer::{FLAG_BLOCKLISTED, FLAG_NO_STACK_READ, FLAG_STACK_UNREAD, FLAG_TRUNCATED};
use super::memory::{Copies, Memory, Pipe, StackReader};
use crate::objects::{LoadedObject, Objects};

/// Deepest stack recorded, in frames; a deeper one ends in a `[truncated]` frame.
pub(crate) const MAX_DEPTH: usize = 128;

/// How many addresses an unwinder remembers [`Unwinding::covers`] of (16 bytes and the
/// map's overhead each): more than the return addresses of a large service's hot stacks;
/// past it, it starts over.
const MAX_COVERED: usize = 1 << 14;

/// Bytes of a loaded object's memory, for framehop.
#[derive(Clone, Copy)]
pub(crate) struct MemorySlice {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the slices point into read-only segments of objects that stay mapped for the
// process's life (the executable, the vDSO), or into copies the unwinder owns (`Tables`).
unsafe impl Send for MemorySlice {}
// SAFETY: as above; the bytes are never written.
unsafe impl Sync for MemorySlice {}

impl Default for MemorySlice {
    fn default() -> MemorySlice {
        MemorySlice {
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for MemorySlice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

pub(crate) type Unwinder = UnwinderNative<MemorySlice, FixedStorage>;

/// An object's unwind section as gimli reads it, off the signal path.
type Section<'a> = gimli::EndianSlice<'a, gimli::NativeEndian>;
pub(crate) type Cache = CacheNative<FixedStorage>;

/// framehop's allocation-free unwinding, with storage sized for what unwind tables use.
///
/// framehop's own `MustNotAllocateDuringUnwind` gives gimli room for 192 register rules
/// per row; gimli moves rows by value while it evaluates, so the handler then used about
/// 17 KiB of the interrupted thread's stack, more than a thread near its limit has. Real
/// tables name at most the 17 integer registers of x86_64 (or 33 of aarch64) and a few
/// vector ones; a table that needs more fails to unwind (the stack ends early), never
/// overruns.
pub(crate) struct FixedStorage;

impl<R: gimli::ReaderOffset> gimli::UnwindContextStorage<R> for FixedStorage {
    type Rules = [(gimli::Register, gimli::RegisterRule<R>); 24];
    type Stack = [gimli::UnwindTableRow<R, Self>; 4];
}

impl<R: gimli::Reader> gimli::EvaluationStorage<R> for FixedStorage {
    type Stack = [gimli::Value; 16];
    type ExpressionStack = [(R, R); 4];
    type Result = [gimli::Piece<R>; 1];
}

impl AllocationPolicy for FixedStorage {
    type GimliUnwindContextStorage<R: gimli::ReaderOffset> = FixedStorage;
    type GimliEvaluationStorage<R: gimli::Reader> = FixedStorage;
}

/// Where a library's unwind tables are copied from, and how much may be copied: the
/// longest `.eh_frame` of a real library is some hundreds of KiB.
const MAX_TABLE: usize = 16 << 20;

/// A copy of `len` bytes of this process's memory at `address`, read with `memory` (a
/// system call that fails on unmapped memory instead of faulting: the library may be
/// unloaded meanwhile); `None` if any of it could not be read.
fn copy_of(memory: &Memory, address: u64, len: usize) -> Option<Box<[u8]>> {
    let mut copy = vec![0u8; len].into_boxed_slice();
    let mut done = 0;
    while done < len {
        let got = memory.read(address + done as u64, &mut copy[done..]);
        if got == 0 {
            return None;
        }
        done += got;
    }
    Some(copy)
}

/// The length of the `.eh_frame` section that starts `bytes`: its entries up to the
/// zero-length terminator (or the end of `bytes`, whichever comes first).
fn eh_frame_len(bytes: &[u8]) -> usize {
    let mut at = 0usize;
    while let Some(length) = bytes.get(at..at + 4) {
        let length = u32::from_le_bytes(length.try_into().expect("4 bytes"));
        let next = match length {
            0 => return at + 4,
            0xffff_ffff => bytes
                .get(at + 4..at + 12)
                .map(|l| u64::from_le_bytes(l.try_into().expect("8 bytes")))
                .and_then(|l| usize::try_from(l).ok())
                .and_then(|l| at.checked_add(12)?.checked_add(l)),
            length => at.checked_add(4 + length as usize),
        };
        match next {
            Some(next) if next <= bytes.len() => at = next,
            _ => break,
        }
    }
    bytes.len()
}

/// An object's unwind tables: `.eh_frame_hdr`, and `.eh_frame` from where the header says
/// it starts. The executable's and the vDSO's are read where they are loaded (neither is
/// ever unmapped); a library's are copied into memory the unwinder owns, so that the
/// app's `dlclose` unloads it whenever it likes and the handler never reads its pages.
struct Tables {
    /// The object's addresses, as loaded.
    range: Range<u64>,
    /// Where its code begins, as loaded: the base of text-relative pointers.
    text: u64,
    hdr: MemorySlice,
    hdr_address: u64,
    eh_frame: MemorySlice,
    eh_frame_address: u64,
    /// The copies the slices point into, for a library: the header, then `.eh_frame`.
    _owned: Vec<Box<[u8]>>,
}

impl Tables {
    fn of(object: &LoadedObject, memory: &Memory) -> Option<Tables> {
        let hdr = object.eh_frame_hdr.clone()?;
        let range = object.range.clone();
        let text = object.text().map_or(range.start, |text| text.avma.start);
        let permanent = object.is_vdso
            || object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe"));
        let hdr_len = usize::try_from(hdr.end - hdr.start).ok()?;
        if permanent {
            let hdr_bytes = MemorySlice {
                ptr: hdr.start as *const u8,
                len: hdr_len,
            };
            let eh_frame_start = crate::objects::eh_frame_address(&hdr_bytes, hdr.start)?;
            let segment = object
                .segments
                .iter()
                .find(|s| s.avma.contains(&eh_frame_start))?;
            return Some(Tables {
                range,
                text,
                hdr: hdr_bytes,
                hdr_address: hdr.start,
                eh_frame: MemorySlice {
                    ptr: eh_frame_start as *const u8,
                    len: (segment.avma.end - eh_frame_start) as usize,
                },
                eh_frame_address: eh_frame_start,
                _owned: Vec::new(),
            });
        }
        let hdr_copy = copy_of(memory, hdr.start, hdr_len.min(MAX_TABLE))?;
        let eh_frame_start = crate::objects::eh_frame_address(&hdr_copy, hdr.start)?;
        let segment = object
            .segments
            .iter()
            .find(|s| s.avma.contains(&eh_frame_start))?;
        let rest = usize::try_from(segment.avma.end - eh_frame_start).ok()?;
        // Kept up to its terminator: what follows in the segment is not unwind tables
        // (shrinking gives the rest back to the allocator).
        let mut eh_frame = copy_of(memory, eh_frame_start, rest.min(MAX_TABLE))?.into_vec();
        eh_frame.truncate(eh_frame_len(&eh_frame));
        let eh_frame = eh_frame.into_boxed_slice();
        Some(Tables {
            range,
            text,
            hdr: MemorySlice {
                ptr: hdr_copy.as_ptr(),
                len: hdr_copy.len(),
            },
            hdr_address: hdr.start,
            eh_frame: MemorySlice {
                ptr: eh_frame.as_ptr(),
                len: eh_frame.len(),
            },
            eh_frame_address: eh_frame_start,
            _owned: vec![hdr_copy, eh_frame],
        })
    }
}

/// An unwinder over the tables of every loaded object, and the tables it reads.
fn unwinder_for(objects: &Objects, memory: &Memory) -> (Unwinder, Vec<Tables>) {
    let mut unwinder = Unwinder::new();
    let mut all = Vec::new();
    for object in objects.iter() {
        let Some(tables) = Tables::of(object, memory) else {
            continue;
        };
        if let Some(module) = framehop_module(object, &tables) {
            unwinder.add_module(module);
        }
        all.push(tables);
    }
    (unwinder, all)
}

/// The code ranges of the objects `blocklist` names, sorted.
fn blocked_ranges(objects: &Objects, blocklist: &[&str]) -> Box<[Range<u64>]> {
    let mut blocked = Vec::new();
    for object in objects.iter() {
        if blocklist.iter().any(|entry| object.is_named(entry)) {
            blocked.extend(object.segments.iter().map(|s| s.avma.clone()));
        }
    }
    blocked.sort_by_key(|r| r.start);
    blocked.into_boxed_slice()
}

/// The address bits of a code pointer in this process: everything up to the highest bit
/// any loaded object uses. On aarch64 the bits above may hold a pointer authentication
/// code in return addresses, which must be stripped before they are looked up.
fn code_address_mask(objects: &Objects) -> u64 {
    let highest = objects
        .iter()
        .map(|o| o.range.end)
        .max()
        .unwrap_or(u64::MAX);
    u64::MAX >> highest.leading_zeros()
}

/// What the handler unwinds with, the same for a CPU sample and a thread dump's answer:
/// the unwind tables, the blocklisted code, the stack reader and the code address mask.
pub(crate) struct Unwinding {
    unwinder: Unwinder,
    /// What the unwinder's modules read (and [`covers`](Self::covers) searches); dropped
    /// after it.
    tables: Vec<Tables>,
    /// Code ranges of blocklisted objects, sorted.
    blocked: Box<[Range<u64>]>,
    /// What [`covers`](Self::covers) found, by address; off the signal path only (the
    /// handler never touches it), and gone with the unwinder, which a session builds
    /// anew when libraries come and go.
    covered: Mutex<HashMap<u64, Option<bool>>>,
    /// How often [`covers`](Self::covers) read the tables (test builds only).
    #[cfg(test)]
    looked_up: std::sync::atomic::AtomicUsize,
    pub(crate) memory: Memory,
    /// Bits of a return address that are address (the rest may hold a pointer
    /// authentication code on aarch64).
    pub(crate) code_mask: u64,
}

/// What [`Unwinding::unwind`] wrote.
pub(crate) struct Unwound {
    pub(crate) depth: usize,
    pub(crate) flags: u8,
    /// It reached the stack's outermost frame.
    pub(crate) complete: bool,
    /// Bytes of the stack copied by system calls (0: all read directly).
    pub(crate) copied: usize,
    /// A system call copying the stack was refused as seccomp filters refuse.
    pub(crate) refused: bool,
}

impl Unwinding {
    /// For `objects` as loaded now, reading stacks (and copying libraries' tables) with
    /// `memory`.
    pub(crate) fn new(objects: &Objects, blocklist: &[&str], memory: Memory) -> Unwinding {
        let (unwinder, tables) = unwinder_for(objects, &memory);
        Unwinding {
            unwinder,
            tables,
            blocked: blocked_ranges(objects, blocklist),
            covered: Mutex::default(),
            #[cfg(test)]
            looked_up: Default::default(),
            memory,
            code_mask: code_address_mask(objects),
        }
    }

    /// Why a stack interrupted at `pc` is recorded as its PC alone, if it is: the PC is
    /// in a blocklisted object, or no stack can be read here.
    pub(crate) fn refusal(&self, pc: u64) -> Option<u8> {
        if self.is_blocked(pc) {
            Some(FLAG_BLOCKLISTED)
        } else if matches!(self.memory, Memory::Unreadable) {
            Some(FLAG_NO_STACK_READ)
        } else {
            None
        }
    }

    /// Whether an unwind table covers the code at `address` (a PC, or a return address
    /// minus one): `Some(false)` for code of a loaded object whose tables have no entry for
    /// it, where framehop unwinds by the frame pointer (or, in the leaf, the word at the
    /// stack pointer), a guess in code that keeps none (musl's libc, hand-written
    /// assembly); `None` where no object's tables could tell (none loaded there, no
    /// search table, a table gimli cannot read). Off the signal path: gimli parses the
    /// entry once per address, and remembers up to [`MAX_COVERED`] of them.
    pub(crate) fn covers(&self, address: u64) -> Option<bool> {
        let mut covered = self.covered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = covered.get(&address) {
            return known;
        }
        if covered.len() >= MAX_COVERED {
            covered.clear();
        }
        let found = self.look_up(address);
        covered.insert(address, found);
        found
    }

    /// [`covers`](Self::covers), looked up in the tables.
    fn look_up(&self, address: u64) -> Option<bool> {
        #[cfg(test)]
        (self.looked_up).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.entry_start(address)? {
            Ok(_) => Some(true),
            Err(gimli::Error::NoUnwindInfoForAddress) => Some(false),
            Err(_) => None,
        }
    }

    /// The first address the unwind table entry for `address` covers; the error gimli
    /// gave where none does (`NoUnwindInfoForAddress`) or a table is malformed; `None`
    /// where no object with tables holds `address`, or its search table is unreadable.
    fn entry_start(&self, address: u64) -> Option<Result<u64, gimli::Error>> {
        self.with_entry(address, |entry, _, _| {
            Some(entry.map(|fde| fde.initial_address()))
        })
    }

    /// Calls `then` with the unwind table entry for `address` (or gimli's error where
    /// none covers it), the object's `.eh_frame` and its base addresses; `None` where no
    /// object with tables holds `address`, or its search table is unreadable.
    fn with_entry<T>(
        &self,
        address: u64,
        then: impl FnOnce(
            Result<gimli::FrameDescriptionEntry<Section<'_>>, gimli::Error>,
            &gimli::EhFrame<Section<'_>>,
            &gimli::BaseAddresses,
        ) -> Option<T>,
    ) -> Option<T> {
        use gimli::{BaseAddresses, EhFrame, EhFrameHdr, NativeEndian, UnwindSection as _};
        let tables = self.tables.iter().find(|t| t.range.contains(&address))?;
        let bases = BaseAddresses::default()
            .set_eh_frame_hdr(tables.hdr_address)
            .set_eh_frame(tables.eh_frame_address)
            .set_text(tables.text);
        let size = size_of::<usize>() as u8;
        let hdr = EhFrameHdr::new(&tables.hdr, NativeEndian)
            .parse(&bases, size)
            .ok()?;
        let mut eh_frame = EhFrame::new(&tables.eh_frame, NativeEndian);
        eh_frame.set_address_size(size);
        let entry =
            hdr.table()?
                .fde_for_address(&eh_frame, &bases, address, EhFrame::cie_from_offset);
        then(entry, &eh_frame, &bases)
    }

    /// The canonical frame address rule at `address` (a PC, or a return address minus
    /// one) when it is a register plus an offset (DWARF register number, offset), and the
    /// first address of the function's table entry; off the signal path.
    #[cfg_attr(
        not(target_arch = "x86_64"),
        allow(dead_code, reason = "sleeping threads are read on x86_64 alone")
    )]
    pub(crate) fn cfa_rule(&self, address: u64) -> Option<(u16, i64, u64)> {
        use gimli::{CfaRule, UnwindContext};
        self.with_entry(address, |entry, eh_frame, bases| {
            let fde = entry.ok()?;
            let mut context = Box::new(UnwindContext::new());
            let row = fde
                .unwind_info_for_address(eh_frame, bases, &mut context, address)
                .ok()?;
            match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } => {
                    Some((register.0, *offset, fde.initial_address()))
                }
                CfaRule::Expression(_) => None,
            }
        })
    }

    /// Whether `address` lies in blocklisted code.
    fn is_blocked(&self, address: u64) -> bool {
        let i = self.blocked.partition_point(|r| r.start <= address);
        i > 0 && self.blocked[i - 1].contains(&address)
    }

    /// Unwinds from the interrupted `pc` and registers (leaf first) into `frames`,
    /// stopping after the first frame in a blocklisted object and at [`MAX_DEPTH`]
    /// (marked [`FLAG_TRUNCATED`]). The stack is read directly below `direct_high`, else
    /// copied into `stack` by system calls: with the session's reader, or through
    /// `pipe` where one is given (a thread with a seccomp filter of its own). `cache`,
    /// `stack` and `pipe` are a scratch slot's (`scratch.rs`). Async-signal-safe: framehop
    /// with fixed storage.
    #[allow(
        clippy::too_many_arguments,
        reason = "one scratch slot's parts, borrowed apart"
    )]
    pub(crate) fn unwind(
        &self,
        (pc, regs): (u64, UnwindRegsNative),
        direct_high: u64,
        pipe: Option<&Pipe>,
        cache: &mut Cache,
        stack: &mut [u8],
        frames: &mut [u64; MAX_DEPTH],
    ) -> Unwound {
        self.unwind_reading(
            (pc, regs),
            direct_high,
            pipe,
            cache,
            stack,
            frames,
            |_, _| {},
        )
    }

    /// [`unwind`](Self::unwind), telling `read` each stack word it read: its address and
    /// the word, or `None` where it could not be read.
    #[allow(
        clippy::too_many_arguments,
        reason = "one scratch slot's parts, borrowed apart"
    )]
    pub(crate) fn unwind_reading(
        &self,
        (pc, regs): (u64, UnwindRegsNative),
        direct_high: u64,
        pipe: Option<&Pipe>,
        cache: &mut Cache,
        stack: &mut [u8],
        frames: &mut [u64; MAX_DEPTH],
        mut read: impl FnMut(u64, Option<u64>),
    ) -> Unwound {
        let mut reader = StackReader {
            copies: pipe.map_or(Copies::Memory(&self.memory), Copies::Pipe),
            sp: regs.sp(),
            direct_high,
            copy: stack,
            copied: 0,
            refused: false,
        };
        let mut read = |address: u64| {
            let word = reader.read(address);
            read(address, word.ok());
            word
        };
        let mut unwinding = self.unwinder.iter_frames(pc, regs, cache, &mut read);
        let mut depth = 0usize;
        let mut flags = 0;
        let mut complete = false;
        loop {
            match unwinding.next() {
                Ok(Some(_)) if depth == MAX_DEPTH => {
                    flags |= FLAG_TRUNCATED;
                    break;
                }
                Ok(Some(frame)) => {
                    let address = frame.address() & self.code_mask;
                    frames[depth] = address;
                    depth += 1;
                    // Do not unwind through a blocklisted library.
                    if depth > 1 && self.is_blocked(address.wrapping_sub(1)) {
                        break;
                    }
                }
                Ok(None) => {
                    complete = true;
                    break;
                }
                // Short of the outermost frame: memory it could not read, or a frame that
                // moves the wrong way (a switch to another stack, below this one).
                Err(_) => {
                    flags |= FLAG_STACK_UNREAD;
                    break;
                }
            }
        }
        Unwound {
            depth,
            flags,
            complete,
            copied: reader.copied,
            refused: reader.refused,
        }
    }
}

/// A framehop module for an object's unwind tables.
fn framehop_module(object: &LoadedObject, tables: &Tables) -> Option<Module<MemorySlice>> {
    let to_svma = |r: Range<u64>| r.start - object.bias..r.end - object.bias;
    let text = object.text()?;
    let span = |start: u64, slice: &MemorySlice| start..start + slice.len as u64;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(to_svma(text.avma.clone())),
        eh_frame_svma: Some(to_svma(span(tables.eh_frame_address, &tables.eh_frame))),
        eh_frame: Some(tables.eh_frame),
        eh_frame_hdr_svma: Some(to_svma(span(tables.hdr_address, &tables.hdr))),
        eh_frame_hdr: Some(tables.hdr),
        ..Default::default()
    };
    Some(Module::new(
        object.name.clone(),
        object.range.clone(),
        object.bias,
        info,
    ))
}

/// The interrupted PC and unwind registers.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn registers(
    context: *mut libc::c_void,
    _code_mask: u64,
) -> Option<(u64, UnwindRegsNative)> {
    let context = context.cast::<libc::ucontext_t>();
    if context.is_null() {
        return None;
    }
    // SAFETY: the kernel's ucontext is valid for the handler's duration.
    let gregs = unsafe { &(*context).uc_mcontext.gregs };
    let ip = gregs[libc::REG_RIP as usize] as u64;
    let sp = gregs[libc::REG_RSP as usize] as u64;
    let bp = gregs[libc::REG_RBP as usize] as u64;
    Some((ip, UnwindRegsNative::new(ip, sp, bp)))
}

/// The interrupted PC and unwind registers; return addresses read while unwinding (and the
/// link register) are stripped of pointer authentication bits with `code_mask`.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "aarch64")]
pub(crate) unsafe fn registers(
    context: *mut libc::c_void,
    code_mask: u64,
) -> Option<(u64, UnwindRegsNative)> {
    let context = context.cast::<libc::ucontext_t>();
    if context.is_null() {
        return None;
    }
    // SAFETY: the kernel's ucontext is valid for the handler's duration.
    let mcontext = unsafe { &(*context).uc_mcontext };
    let pc = mcontext.pc;
    Some((
        pc,
        UnwindRegsNative::new_with_ptr_auth_mask(
            framehop::aarch64::PtrAuthMask(code_mask),
            mcontext.regs[30],
            mcontext.sp,
            mcontext.regs[29],
        ),
    ))
}

#[cfg(test)]
mod tests;
