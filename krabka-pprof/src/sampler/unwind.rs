//! Unwinding in the signal handler (step 8 of the contract in `sampler.rs`): framehop
//! over the in-memory unwind tables of the loaded objects, with fixed storage so that it
//! never allocates; the libraries whose tables it reads pinned with `dlopen(RTLD_NOLOAD)`
//! so that no `dlclose` can unmap them meanwhile; the blocklist; the registers of the
//! interrupted context. One [`Unwinding`] serves CPU samples and thread dumps alike.

use std::ops::{Deref, Range};

use framehop::{
    AllocationPolicy, CacheNative, ExplicitModuleSectionInfo, Module, UnwindRegsNative,
    Unwinder as _, UnwinderNative,
};

use super::buffer::{FLAG_BLOCKLISTED, FLAG_NO_STACK_READ, FLAG_TRUNCATED};
use super::memory::{Memory, StackReader};
use crate::objects::{LoadedObject, Objects};

/// Deepest stack recorded, in frames; a deeper one ends in a `[truncated]` frame.
pub(crate) const MAX_DEPTH: usize = 128;

/// Bytes of a loaded object's memory, for framehop.
#[derive(Clone, Copy)]
pub(crate) struct MemorySlice {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the slices point into read-only segments of objects that stay mapped while the
// session uses them: the executable, the vDSO, and libraries the session pinned.
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

/// A `dlopen` reference to a loaded library, released on drop.
pub(crate) struct Library(*mut libc::c_void);

unsafe extern "C" {
    /// glibc and musl both have it; the `libc` crate declares it for glibc only.
    fn dlinfo(
        handle: *mut libc::c_void,
        request: libc::c_int,
        info: *mut libc::c_void,
    ) -> libc::c_int;
}
const RTLD_DI_LINKMAP: libc::c_int = 2;

impl Library {
    /// Pins exactly this loaded library; `None` if that cannot be done (it has no path,
    /// or the path names another copy, as for one loaded into another namespace by
    /// `dlmopen`). Only a pinned library's unwind tables may be read by the handler.
    fn pin(object: &LoadedObject) -> Option<Library> {
        let path = object.file.as_ref()?;
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: RTLD_NOLOAD never loads anything: it only adds a reference to a library
        // that is already loaded in the default namespace, which keeps its pages mapped.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            return None;
        }
        let library = Library(handle);
        // The first field of a `link_map` is its load bias, `l_addr`.
        let mut map: *const u64 = std::ptr::null();
        // SAFETY: RTLD_DI_LINKMAP writes the handle's `struct link_map *` into `map`.
        let found = unsafe { dlinfo(handle, RTLD_DI_LINKMAP, (&raw mut map).cast()) } == 0;
        // SAFETY: a link_map returned by the loader is valid while the handle is open.
        let same = found && !map.is_null() && unsafe { *map } == object.bias;
        same.then_some(library)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

/// Which objects' unwind tables the handler may read: the executable and the vDSO, which
/// are never unmapped, and libraries this call could pin (returned with them).
fn readable_objects(objects: &Objects) -> (Vec<&LoadedObject>, Vec<Library>) {
    let mut readable = Vec::new();
    let mut libraries = Vec::new();
    for object in objects.iter() {
        let permanent = object.is_vdso
            || object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe"));
        if permanent {
            readable.push(object);
        } else if let Some(library) = Library::pin(object) {
            libraries.push(library);
            readable.push(object);
        }
    }
    (readable, libraries)
}

/// An unwinder over the tables of every object the handler may read, and the pins that
/// keep the libraries among them mapped while it is used.
fn unwinder_for(objects: &Objects) -> (Unwinder, Vec<Library>) {
    let mut unwinder = Unwinder::new();
    let (readable, libraries) = readable_objects(objects);
    for object in readable {
        if let Some(module) = framehop_module(object) {
            unwinder.add_module(module);
        }
    }
    (unwinder, libraries)
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
    /// Code ranges of blocklisted objects, sorted.
    blocked: Box<[Range<u64>]>,
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
}

impl Unwinding {
    /// For `objects` as loaded now; also the pins that keep the libraries among them
    /// mapped while the tables are read.
    pub(crate) fn new(
        objects: &Objects,
        blocklist: &[&str],
        memory: Memory,
    ) -> (Unwinding, Vec<Library>) {
        let (unwinder, libraries) = unwinder_for(objects);
        let unwinding = Unwinding {
            unwinder,
            blocked: blocked_ranges(objects, blocklist),
            memory,
            code_mask: code_address_mask(objects),
        };
        (unwinding, libraries)
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

    /// Whether `address` lies in blocklisted code.
    fn is_blocked(&self, address: u64) -> bool {
        let i = self.blocked.partition_point(|r| r.start <= address);
        i > 0 && self.blocked[i - 1].contains(&address)
    }

    /// Unwinds from the interrupted `pc` and registers (leaf first) into `frames`,
    /// stopping after the first frame in a blocklisted object and at [`MAX_DEPTH`]
    /// (marked [`FLAG_TRUNCATED`]). The stack is read directly below `direct_high`, else
    /// copied into `stack` by system calls. `cache` and `stack` are a scratch slot's
    /// (`scratch.rs`). Async-signal-safe: framehop with fixed storage.
    pub(crate) fn unwind(
        &self,
        (pc, regs): (u64, UnwindRegsNative),
        direct_high: u64,
        cache: &mut Cache,
        stack: &mut [u8],
        frames: &mut [u64; MAX_DEPTH],
    ) -> Unwound {
        let mut reader = StackReader {
            memory: &self.memory,
            sp: regs.sp(),
            direct_high,
            copy: stack,
            copied: 0,
        };
        let mut read = |address: u64| reader.read(address);
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
                Err(_) => break,
            }
        }
        Unwound {
            depth,
            flags,
            complete,
            copied: reader.copied,
        }
    }
}

/// A framehop module for an object's in-memory unwind tables.
fn framehop_module(object: &LoadedObject) -> Option<Module<MemorySlice>> {
    let hdr = object.eh_frame_hdr.clone()?;
    let hdr_bytes = MemorySlice {
        ptr: hdr.start as *const u8,
        len: (hdr.end - hdr.start) as usize,
    };
    let eh_frame_start = crate::objects::eh_frame_address(&hdr_bytes, hdr.start)?;
    let segment = object
        .segments
        .iter()
        .find(|s| s.avma.contains(&eh_frame_start))?;
    let eh_frame = MemorySlice {
        ptr: eh_frame_start as *const u8,
        len: (segment.avma.end - eh_frame_start) as usize,
    };
    let to_svma = |r: Range<u64>| r.start - object.bias..r.end - object.bias;
    let text = object.text()?;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(to_svma(text.avma.clone())),
        eh_frame_svma: Some(to_svma(eh_frame_start..segment.avma.end)),
        eh_frame: Some(eh_frame),
        eh_frame_hdr_svma: Some(to_svma(hdr.clone())),
        eh_frame_hdr: Some(hdr_bytes),
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
mod tests {
    use super::*;

    #[test]
    fn pointer_authentication_bits_are_stripped_from_return_addresses() {
        // Objects up to a 48-bit address; a signed return address carries a code above.
        let objects = Objects::current();
        let mask = code_address_mask(&objects);
        let highest = objects.iter().map(|o| o.range.end).max().unwrap();
        assert_eq!(mask, u64::MAX >> highest.leading_zeros());
        let code = highest - 0x100;
        let signed = code | (0x2a << 55);
        assert_eq!(signed & mask, code, "the authentication code is removed");
        assert_eq!(code & mask, code, "a plain address is kept");
    }

    #[test]
    fn only_pinned_libraries_give_unwind_tables() {
        let objects = Objects::current();
        let (readable, libraries) = readable_objects(&objects);
        assert!(readable.iter().any(|o| o.is_vdso));
        assert!(
            readable
                .iter()
                .any(|o| o.short_name().starts_with("libc.so")),
            "libc is pinned"
        );
        assert_eq!(
            readable.len(),
            libraries.len() + 2,
            "every library is pinned; only the executable and the vDSO are not"
        );
    }

    #[test]
    fn a_library_is_pinned_only_as_the_copy_that_was_listed() {
        let objects = Objects::current();
        let libc = objects
            .iter()
            .find(|o| o.short_name().starts_with("libc.so"))
            .expect("libc is loaded");
        assert!(Library::pin(libc).is_some());
        // The same path, somewhere else: another copy (another namespace, or a library
        // replaced since the list was taken). Its tables could be unmapped under us.
        let mut elsewhere = libc.clone();
        elsewhere.bias += 0x1000_0000;
        assert!(Library::pin(&elsewhere).is_none());
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn a_library_in_another_namespace_is_not_read() {
        // The same libc, loaded again into a new namespace by dlmopen: RTLD_NOLOAD in the
        // default namespace would find the other copy, which does not pin this one.
        let name = c"libc.so.6";
        // SAFETY: dlmopen loads a fresh copy of libc into a new link-map namespace.
        let handle = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, name.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlmopen of libc");
        let objects = Objects::current();
        let (readable, libraries) = readable_objects(&objects);
        let readable_copies = readable
            .iter()
            .filter(|o| o.short_name().starts_with("libc.so"))
            .count();
        assert_eq!(readable_copies, 1, "only the pinned copy's tables are read");
        drop(libraries);
        // SAFETY: closing the handle opened above, once.
        unsafe { libc::dlclose(handle) };
    }
}
