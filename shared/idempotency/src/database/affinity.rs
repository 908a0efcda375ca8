//! Keeps a thread on the CPU it runs on, and so the threads it starts from then on.
//!
//! Why: SQLite's writer and sqlx's connection thread take turns. Each statement is a hand-off
//! from the writer to the connection's thread and back, and neither runs while the other does.
//! When the thread to wake sleeps on another CPU, every hand-off waits for that CPU to wake
//! up (on a virtual machine, for the host to run it again); on one CPU, it is a switch from
//! one thread to the other, several times cheaper. sqlx starts a connection's thread when it connects, and a thread starts with its parent's
//! CPUs, so the writer stays on its CPU before it connects. Neither needs a CPU of its own
//! (they never run at once), and other threads still use every CPU.

/// Keeps the calling thread on the CPU it is on now. A system that refuses (a CPU set it may
/// not change) leaves the thread free to move, which costs only speed.
#[cfg(target_os = "linux")]
pub(super) fn stay_on_current_cpu() {
    let cpu = rustix::thread::sched_getcpu();
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(error) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::debug!(%error, cpu, "the SQLite writer stays free to move between CPUs");
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn stay_on_current_cpu() {}
