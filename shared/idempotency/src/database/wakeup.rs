//! Lets SQLite's writer, once woken, wait for the thread that woke it to stop running rather than
//! interrupt it.
//!
//! Why: every query is a hand-off from the writer to sqlx's connection thread and back, the two
//! on one CPU (see [`super::affinity`]). The connection thread wakes the writer with a query's
//! first result. A writer that runs at once finds the rest of the query's results not sent yet
//! and sleeps again, and the connection thread is switched back in to send them and return to
//! waiting: three or four switches per query where two do. Under Linux's `SCHED_BATCH` policy a
//! woken thread does not preempt the running one: the writer runs once the connection thread
//! waits for its next query (or its time slice ends), and its share of the CPU is what it was.
//! Under load this about halves the process's context switches. The connection thread keeps the
//! normal policy, so that it still starts a query as soon as the writer sends one: the writer
//! switches after it has connected, and a thread starts with its creator's policy.

/// Puts the calling thread under `SCHED_BATCH`. A system that refuses leaves it as it was, which
/// costs only speed.
#[cfg(target_os = "linux")]
pub(super) fn wait_for_the_waker() {
    // rustix has no `sched_setscheduler`; libc's is one call.
    let parameters = libc::sched_param { sched_priority: 0 };
    // SAFETY: `parameters` is a valid `sched_param` for the call's duration, and pid 0 names
    // the calling thread.
    let refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &parameters) } != 0;
    if refused {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the SQLite writer keeps the normal scheduling policy");
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn wait_for_the_waker() {}
