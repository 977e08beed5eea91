//! The process's run-time switches, which a service turns without a restart: profiling
//! on or off (every route answers 503 after its access check, and the recorder stops
//! sampling, keeping its history), and the bearer token, replaced in place (as a
//! Kubernetes Secret mounted as a file is replaced). Plain atomics and a lock the
//! handlers of requests take for a compare: nothing here is read on the signal path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

static OFF: AtomicBool = AtomicBool::new(false);

/// The token set at run time, if one was: it replaces every router's `token_env` value.
static TOKEN: RwLock<Option<Arc<[u8]>>> = RwLock::new(None);

/// Whether profiling is on (it is unless switched off).
pub(crate) fn is_on() -> bool {
    !OFF.load(Ordering::SeqCst)
}

/// Turns profiling on or off.
pub(crate) fn set(on: bool) {
    OFF.store(!on, Ordering::SeqCst);
}

/// The token set at run time, if one was.
pub(crate) fn token() -> Option<Arc<[u8]>> {
    TOKEN.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Replaces the token.
pub(crate) fn set_token(token: &[u8]) {
    *TOKEN.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::from(token));
}

/// Why a route answers 503 while profiling is off.
pub(crate) const SWITCHED_OFF: &str = "profiling is switched off in this process \
     (krabka_pprof::set_profiling_enabled(false)); the service switches it on again, with \
     set_profiling_enabled(true), without a restart";
