//! Functions with names the tests search for in profiles.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// Three functions with the same loop, so CPU time is about proportional to iterations.
macro_rules! split {
    ($($name:ident),*) => {$(
        #[inline(never)]
        pub fn $name(rounds: u64) -> u64 {
            let mut x = black_box(0x2545_f491_4f6c_dd1du64);
            for i in 0..rounds {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i);
            }
            black_box(x)
        }
    )*};
}
split!(split_fifty, split_thirty, split_twenty);
// The two phases of the recorder's tests: a process's first seconds, and after.
split!(krabka_early_phase, krabka_late_phase);

/// CPU time spent in each of the three split functions, for the tests' ground truth.
pub static SPLIT_CPU_NANOS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// One round of the workload: 5000, 3000 and 2000 iterations of the same loop, about
/// 50/30/20 of the CPU. The exact split (code alignment can make one copy of the loop
/// a little faster) is measured per call in [`SPLIT_CPU_NANOS`].
pub fn split_round() {
    timed_into(&SPLIT_CPU_NANOS, 0, || split_fifty(black_box(5_000)));
    timed_into(&SPLIT_CPU_NANOS, 1, || split_thirty(black_box(3_000)));
    timed_into(&SPLIT_CPU_NANOS, 2, || split_twenty(black_box(2_000)));
}

/// Three counters' values now (such as [`SPLIT_CPU_NANOS`]'s), for [`crate::Readings`].
pub fn read(counters: &[AtomicU64; 3]) -> [u64; 3] {
    counters.each_ref().map(|c| c.load(Ordering::Relaxed))
}

fn thread_cpu_nanos() -> u64 {
    super::thread_cpu_time().as_nanos() as u64
}

/// CPU time spent in each part of [`copy_round`], for the tests' ground truth.
pub static COPY_CPU_NANOS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// One round of about 40 % arithmetic, 40 % `copy_from_slice` (libc's `memcpy`, whose
/// samples must be unwound to [`copy_forty`]) and 20 % other arithmetic, each part
/// timed by the thread's own CPU clock into [`COPY_CPU_NANOS`]. The copy's length is
/// calibrated once per thread against the arithmetic, since memory speed varies more
/// than arithmetic between machines and with what else runs.
pub fn copy_round() {
    thread_local! {
        static STATE: std::cell::RefCell<(Vec<u8>, Vec<u8>, usize)> =
            std::cell::RefCell::new((vec![1u8; 1 << 20], vec![0u8; 1 << 20], 0));
    }
    STATE.with_borrow_mut(|(from, to, length)| {
        if *length == 0 {
            *length = calibrate_copy(from, to);
        }
        timed_into(&COPY_CPU_NANOS, 0, || split_fifty(black_box(4_000)));
        timed_into(&COPY_CPU_NANOS, 1, || {
            copy_forty(&from[..*length], &mut to[..*length])
        });
        timed_into(&COPY_CPU_NANOS, 2, || split_twenty(black_box(2_000)));
    });
}

/// The copy length that takes as long as 4000 rounds of the arithmetic loop.
fn calibrate_copy(from: &[u8], to: &mut [u8]) -> usize {
    let time = |f: &mut dyn FnMut()| {
        let before = thread_cpu_nanos();
        for _ in 0..200 {
            f();
        }
        (thread_cpu_nanos() - before).max(1)
    };
    let arithmetic = time(&mut || {
        black_box(split_fifty(black_box(4_000)));
    });
    let probe = 64 * 1024;
    let copying = time(&mut || {
        black_box(copy_forty(&from[..probe], &mut to[..probe]));
    });
    let length = (probe as u64 * arithmetic / copying) as usize;
    length.clamp(4 * 1024, from.len())
}

/// Copies `from` into `to` three times with `copy_from_slice`.
#[inline(never)]
pub fn copy_forty(from: &[u8], to: &mut [u8]) -> u64 {
    let mut copied = 0;
    for _ in 0..3 {
        to.copy_from_slice(black_box(from));
        copied += u64::from(black_box(to[7]));
    }
    copied
}

/// Runs `work`, adding the CPU time it took on this thread to `counters[index]`.
fn timed_into(counters: &[AtomicU64; 3], index: usize, work: impl FnOnce() -> u64) {
    let before = thread_cpu_nanos();
    black_box(work());
    counters[index].fetch_add(thread_cpu_nanos() - before, Ordering::Relaxed);
}

/// Recurses `depth` frames deep, then spins at the bottom for `rounds`.
#[inline(never)]
pub fn krabka_deep_recursion(depth: u32, rounds: u64) -> u64 {
    if depth == 0 {
        return krabka_hot_spin(rounds);
    }
    // Not a tail call: the addition after it keeps every frame on the stack.
    black_box(krabka_deep_recursion(black_box(depth - 1), rounds)) + u64::from(depth)
}

/// The lowest address of the calling thread's stack.
pub fn stack_floor() -> usize {
    // SAFETY: pthread_getattr_np fills the attribute object we pass, which we destroy.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let mut address = std::ptr::null_mut();
        let mut size = 0;
        assert_eq!(
            libc::pthread_attr_getstack(&attr, &mut address, &mut size),
            0
        );
        libc::pthread_attr_destroy(&mut attr);
        address as usize
    }
}

/// Recurses until fewer than `leave` bytes of the thread's stack (whose lowest address
/// is `floor`) remain below this frame, then spins there for `rounds`.
#[inline(never)]
pub fn krabka_near_stack_end(floor: usize, leave: usize, rounds: u64) -> u64 {
    let marker = 0u8;
    let here = black_box(&raw const marker) as usize;
    if here < floor + leave {
        return krabka_hot_spin(rounds);
    }
    black_box(krabka_near_stack_end(floor, leave, rounds)) + 1
}

/// Work for threads that live a few milliseconds.
#[inline(never)]
pub fn krabka_short_lived(rounds: u64) -> u64 {
    krabka_hot_spin(black_box(rounds))
}

/// Time spent inside libc's `memset`: the leaf of every sample is in libc.
#[inline(never)]
pub fn burn_in_libc() {
    let mut buffer = vec![0u8; 1 << 20];
    for round in 0..64u8 {
        // SAFETY: the buffer is ours and exactly this long.
        unsafe { libc::memset(buffer.as_mut_ptr().cast(), i32::from(round), buffer.len()) };
        black_box(&mut buffer);
    }
}

/// Pure arithmetic: every sample taken in it has it as the leaf.
#[inline(never)]
pub fn krabka_hot_spin(rounds: u64) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for i in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    black_box(x)
}

/// The line just above [`lines_hot`], for the tests of source lines: the function spans
/// `LINES_HOT + 2 ..= LINES_HOT + 8`, calls [`lines_step`] on `LINES_HOT + 5`, and
/// [`lines_step`] starts on `LINES_HOT + 13`, its body on the four lines after.
pub const LINES_HOT: i64 = line!() as i64;
#[inline(never)]
pub fn lines_hot(rounds: u64) -> u64 {
    let mut x = black_box(0x2545_f491_4f6c_dd1du64);
    for i in 0..rounds {
        x = lines_step(x, i);
    }
    black_box(x)
}

/// One step of [`lines_hot`]'s loop, always inlined into it: in a profile with lines it
/// is a frame of its own, at the line of the call.
#[inline(always)]
pub fn lines_step(x: u64, i: u64) -> u64 {
    let x = (x ^ (x >> 12)) ^ ((x ^ (x >> 12)) << 25);
    (x ^ (x >> 27))
        .wrapping_mul(0x2545_f491_4f6c_dd1d)
        .wrapping_add(i)
}

/// One round of [`lines_hot`].
pub fn lines_round() {
    black_box(lines_hot(black_box(20_000)));
}

/// zlib's `crc32`, as `dlsym` finds it.
pub type Crc32 = extern "C" fn(u64, *const u8, u32) -> u64;

/// Calls zlib's `crc32` (found in a library loaded with `dlopen`) over a buffer, a few
/// hundred times: CPU in a library the process loaded late, under a Rust caller the
/// profile must keep.
#[inline(never)]
pub fn krabka_calls_into_zlib(crc32: Crc32) -> u64 {
    let data = black_box([7u8; 4096]);
    let mut crc = 0;
    for _ in 0..200 {
        crc = crc32(crc, data.as_ptr(), data.len() as u32);
    }
    black_box(crc)
}

/// Recurses `depth` frames deep through one of two call sites per frame, chosen by the
/// bits of `pattern`, then spins a little: each pattern is a stack of its own (2^depth of
/// them), for the recorder's memory bound.
#[inline(never)]
pub fn krabka_varied_stack(pattern: u64, depth: u32) -> u64 {
    if depth == 0 {
        return krabka_hot_spin(black_box(3_000));
    }
    if pattern & 1 == 0 {
        black_box(krabka_varied_stack(black_box(pattern >> 1), depth - 1)) + 1
    } else {
        black_box(krabka_varied_stack(black_box(pattern >> 1), depth - 1)) + 2
    }
}
