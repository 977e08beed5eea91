//! Wall-clock profiles (`/wall`): where the threads doing work spent their time, on a CPU
//! or off it, with the labels of the request, span or scope they served. The time on a
//! CPU is a window of the CPU sampler's session (the route opens it beside the sweep, so
//! that the two share its lease and its rules); the time off it comes from
//! [`sweep`], which looks at sleeping threads without a signal, as a thread
//! dump reads them: no wait is cut short. [`build`] makes the profile.
//! Knows no HTTP, and no other profile kind: the route hands it what the CPU window
//! collected.

#![cfg_attr(not(sampler), allow(dead_code))]

#[cfg(sampler)]
mod build;
#[cfg(sampler)]
mod sweep;

#[cfg(sampler)]
pub(crate) use build::{WallOptions, WallParts, WallView, wall_profile};
#[cfg(sampler)]
pub(crate) use sweep::Sweeper;

/// Why wall-clock profiles cannot be taken on this target, if they cannot: they need this
/// crate's own sampler.
pub(crate) const UNAVAILABLE: Option<&str> = if cfg!(sampler) {
    None
} else {
    Some(
        "wall-clock profiles are not available on this platform: they need Linux on x86_64 \
         or aarch64, where krabka-pprof's own sampler runs",
    )
};

/// Why they cannot be taken in this process, which takes CPU profiles with the `pprof`
/// crate's sampler.
pub(crate) const NEEDS_OWN_SAMPLER: &str = "wall-clock profiles need krabka-pprof's own CPU \
    sampler; this process takes CPU profiles with the pprof crate's: take /profile?seconds=N \
    instead";
