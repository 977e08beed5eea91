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
/// The shortest history the recorder may keep (`recent`): ten one-second slices.
pub const MIN_RECENT: Duration = Duration::from_secs(10);
/// The longest history the recorder may keep (`recent`).
pub const MAX_RECENT: Duration = Duration::from_secs(3600);
/// The least memory the recorder may keep its history in (`recent_memory`), in bytes.
pub const MIN_RECENT_MEMORY: usize = 256 * 1024;
/// The most memory the recorder may keep its history in (`recent_memory`), in bytes.
pub const MAX_RECENT_MEMORY: usize = 1024 * 1024 * 1024;
/// The recorder's memory bound unless `recent_memory` sets one: 8 MiB.
pub const DEFAULT_RECENT_MEMORY: usize = 8 * 1024 * 1024;
/// The highest frequency a request may ask for when `frequency_max` is unset (and
/// `frequency` is not higher), in Hz.
pub const DEFAULT_FREQUENCY_MAX: u32 = 250;
/// The shortest window a pusher sends (`push_interval`).
pub const MIN_PUSH_INTERVAL: Duration = Duration::from_secs(1);
/// The longest window a pusher sends (`push_interval`): Pyroscope and the Collector
/// expect profiles every few seconds, and a longer window delays what the store shows.
pub const MAX_PUSH_INTERVAL: Duration = Duration::from_secs(60);
/// How much more history than a window the recorder keeps when it pushes (`recent` ≥
/// `push_interval` + this): a window is taken some seconds after its end, whole.
pub const PUSH_HISTORY_MARGIN: Duration = Duration::from_secs(10);
/// The pusher's window unless `push_interval` sets one, as pyroscope-go and Grafana
/// Alloy scrape by default.
pub const DEFAULT_PUSH_INTERVAL: Duration = Duration::from_secs(15);
