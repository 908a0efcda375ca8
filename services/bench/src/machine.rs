//! Facts about the run that numbers need beside them: the machine, the code, the command, the
//! time, and the process's own memory and CPU time as the kernel counts them.

use std::{
    path::Path,
    process::Command,
    time::{Duration, SystemTime},
};

use serde::Serialize;

/// Where and what was measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Logical processors listed in /proc/cpuinfo.
    pub cores: usize,
    /// Processors this process may run on.
    pub available_parallelism: usize,
    /// The commit checked out, and whether the tree had uncommitted changes.
    pub commit: String,
    pub command: String,
    /// `release` or `debug`.
    pub build: &'static str,
    /// UTC, RFC 3339, when the run started.
    pub date: String,
    /// /proc/loadavg when the run started: other work on the machine.
    pub load_average_at_start: String,
    pub kernel: String,
}

impl Machine {
    /// Reads the facts of this machine; `repository` is where `git` finds the commit.
    pub fn describe(repository: &Path, command: String) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                line.strip_prefix("model name")
                    .and_then(|rest| rest.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown (no model name in /proc/cpuinfo)".into());
        let cores = cpuinfo
            .lines()
            .filter(|line| line.starts_with("processor"))
            .count();
        Self {
            cpu_model,
            cores,
            available_parallelism: std::thread::available_parallelism().map_or(0, usize::from),
            commit: commit(repository),
            command,
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            load_average_at_start: load_average(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        }
    }
}

/// /proc/loadavg as it reads now.
pub fn load_average() -> String {
    read_trimmed("/proc/loadavg")
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map_or_else(
        |_| format!("unknown ({path} unreadable)"),
        |text| text.trim().to_owned(),
    )
}

fn git(repository: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn commit(repository: &Path) -> String {
    let Some(commit) = git(repository, &["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown (not a git checkout, or no git)".into();
    };
    match git(
        repository,
        &["status", "--porcelain", "--untracked-files=no"],
    ) {
        Some(changes) if !changes.is_empty() => format!("{commit} with uncommitted changes"),
        _ => commit,
    }
}

/// The process's memory, from /proc/self/status, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: the most that was ever resident (since the last reset).
    pub peak_rss_kib: u64,
}

impl Memory {
    /// None where /proc/self/status is not there (not Linux).
    pub fn now() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let field = |name: &str| {
            status.lines().find_map(|line| {
                line.strip_prefix(name)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        };
        Some(Self {
            rss_kib: field("VmRSS:")?,
            peak_rss_kib: field("VmHWM:")?,
        })
    }

    /// Sets the peak back to what is resident now (`5` into /proc/self/clear_refs), so that the
    /// next peak is that of what follows. Returns whether the kernel allowed it.
    pub fn reset_peak() -> bool {
        std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }
}

/// CPU time, user and system, that this process's threads have used so far.
pub fn process_cpu_time() -> Duration {
    // The process's CPU-time clock: every thread's user and system time, as getrusage sums them.
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_described() {
        let machine = Machine::describe(Path::new(env!("CARGO_MANIFEST_DIR")), "bench".into());
        assert!(!machine.cpu_model.is_empty());
        assert!(machine.available_parallelism >= 1);
        assert!(machine.date.ends_with('Z'), "{}", machine.date);
    }

    #[test]
    fn the_peak_follows_a_large_allocation_and_resets() {
        let Some(before) = Memory::now() else { return };
        assert!(before.peak_rss_kib >= before.rss_kib);
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let during = Memory::now().unwrap();
        assert!(
            during.peak_rss_kib >= before.rss_kib + (60 << 10),
            "{before:?} → {during:?}"
        );
        drop(block);
        if Memory::reset_peak() {
            let after = Memory::now().unwrap();
            assert!(
                after.peak_rss_kib < during.peak_rss_kib,
                "{during:?} → {after:?}"
            );
        }
    }
}
