//! Work that takes more than microseconds (starting and stopping the sampler, symbolizing,
//! encoding, drawing, gzipping, heap dumps) runs on tokio's blocking pool, so that the
//! async workers keep serving the app, also on a `current_thread` runtime.

#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

/// Runs `f` on tokio's blocking pool. A panic inside becomes `failed(reason)`, an error
/// the route turns into a 500, never a crash of the service.
pub(crate) async fn on_blocking_pool<T, E, F>(f: F, failed: fn(String) -> E) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|join| Err(failed(format!("the profiler's task failed: {join}"))))
}
