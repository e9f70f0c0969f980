//! Reading and bounding what a server process takes from the machine: its
//! resident memory, and a memory cgroup to run it in (as a container or a
//! systemd unit with `MemoryMax` would).

use std::path::PathBuf;

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`, …).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status:\n{status}"))
}

/// Resident memory of process `pid` now, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// The most resident memory process `pid` ever had, in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM")
}

/// Reset process `pid`'s peak (`VmHWM`) to its resident memory now, so a
/// later [`peak_rss_kib`] tells what one operation took (writing 5 to
/// `clear_refs`, Linux ≥ 4.0).
pub fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// A memory cgroup (the v1 memory controller, or v2 where it manages
/// memory) with a limit, removed on drop once its processes are gone.
pub struct MemoryCgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl MemoryCgroup {
    /// A new cgroup limited to `limit` bytes, or `None` (with the reason)
    /// when this machine does not let the tests make one.
    pub fn create(limit: u64) -> Result<MemoryCgroup, String> {
        let name = format!("wasmstate-test-{}", super::unique());
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let controllers =
            std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
        let (dir, limit_file) = if controllers.split_whitespace().any(|c| c == "memory") {
            (v2.join(&name), "memory.max")
        } else {
            (
                PathBuf::from("/sys/fs/cgroup/memory").join(&name),
                "memory.limit_in_bytes",
            )
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = MemoryCgroup {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("cannot limit {}: {e}", cgroup.dir.display()))?;
        Ok(cgroup)
    }

    /// The file that takes a process into the cgroup.
    pub fn procs(&self) -> &std::path::Path {
        &self.procs
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its processes were killed first; the kernel may need a moment to
        // let go of the cgroup.
        super::wait_until(
            "the test cgroup to empty",
            std::time::Duration::from_secs(10),
            || std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists(),
        );
    }
}
