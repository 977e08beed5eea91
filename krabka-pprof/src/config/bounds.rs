//! The bounds the rules check values against, public so that users can build configs
//! against them: `config/rules.rs` checks them, `config/error.rs` names them, and the
//! macro's twin (`krabka-pprof-macros/src/rules.rs`) repeats them under the same names.

use std::time::Duration;

/// The shortest duration any of the `*_default`/`*_max` settings may take.
pub const MIN_DURATION: Duration = Duration::from_secs(1);
/// The longest duration any of the `*_default`/`*_max` settings may take.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The lowest sampling frequency, in Hz.
pub const MIN_FREQUENCY: u32 = 1;
/// The highest sampling frequency, in Hz. Above it the signal handler's own cost starts to
/// distort what it measures.
pub const MAX_FREQUENCY: u32 = 1000;
/// The fewest CPU profile windows that may share one sampler: 1 is one profile at a time.
pub const MIN_WINDOWS: u32 = 1;
/// The most CPU profile windows that may share one sampler. Each holds its own stack
/// counts while it is open.
pub const MAX_WINDOWS: u32 = 64;
/// The fewest allocation stacks the cumulative counts may keep, unless `0` turns them
/// off: fewer could not hold the allocation sites of the runtime and the HTTP stack alone.
pub const MIN_ALLOC_STACKS: u32 = 64;
/// The most allocation stacks the cumulative counts may keep: about 560 bytes each at
/// most (its counters and 64 frames), so at most about 36 MB, resident only as stacks
/// arrive.
pub const MAX_ALLOC_STACKS: u32 = 65_536;
