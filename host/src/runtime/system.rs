//! What the machine gives this server: physical memory, the memory limit of
//! its cgroup (a container's or a systemd unit's), and cores. The defaults
//! of the guest budgets derive from them.

use std::path::Path;

/// The share of the memory the server may use that guests get by default:
/// the rest covers the host itself (request bodies, copies of states on
/// their way through, TLS, the git capability) and the kernel's caches.
pub const DEFAULT_GUEST_MEMORY_FRACTION: f64 = 0.5;

/// Where the server's memory limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// Physical memory (`MemTotal` of /proc/meminfo).
    Physical,
    /// The cgroup's limit (`memory.max`, or v1's `memory.limit_in_bytes`),
    /// lower than physical memory.
    Cgroup,
}

/// The memory this process may use: the smaller of physical memory and
/// its cgroup's limit (the cgroup's ancestors included), and which it is.
/// `None` when neither can be read (not Linux).
pub fn memory_limit() -> Option<(u64, MemorySource)> {
    memory_limit_under(Path::new("/"))
}

/// [`memory_limit`], reading `/proc` and `/sys` under `root` (for tests).
pub fn memory_limit_under(root: &Path) -> Option<(u64, MemorySource)> {
    let physical = physical_memory(root);
    let cgroup = cgroup_limit(root);
    match (physical, cgroup) {
        (Some(p), Some(c)) if c < p => Some((c, MemorySource::Cgroup)),
        (Some(p), _) => Some((p, MemorySource::Physical)),
        (None, Some(c)) => Some((c, MemorySource::Cgroup)),
        (None, None) => None,
    }
}

fn physical_memory(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The lowest memory limit on this process's cgroup path, v2 or v1.
fn cgroup_limit(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let mut lowest: Option<u64> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (mounts, file): (&[&str], &str) = if controllers.is_empty() {
            (&["sys/fs/cgroup", "sys/fs/cgroup/unified"], "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (&["sys/fs/cgroup/memory"], "memory.limit_in_bytes")
        } else {
            continue;
        };
        for mount in mounts {
            // The limit of the cgroup and of each of its ancestors.
            let mut dir = Some(Path::new(path.trim_start_matches('/')));
            while let Some(relative) = dir {
                let limit = std::fs::read_to_string(root.join(mount).join(relative).join(file))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                if let Some(limit) = limit {
                    lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
                }
                dir = relative.parent();
            }
        }
    }
    lowest
}

/// Whether the kernel may swap this process's memory out: a swap area is
/// active (`/proc/swaps`) and the cgroup does not forbid swap (v2
/// `memory.swap.max` of 0 forbids it).
pub fn swap_possible() -> bool {
    swap_possible_under(Path::new("/"))
}

/// [`swap_possible`], reading `/proc` and `/sys` under `root` (for tests).
/// What cannot be read counts as possible: "no swap" turns on behaviour
/// that is only safe without swap, so it must be seen, not assumed.
pub fn swap_possible_under(root: &Path) -> bool {
    let Ok(swaps) = std::fs::read_to_string(root.join("proc/swaps")) else {
        return true;
    };
    if swaps.lines().skip(1).all(|l| l.trim().is_empty()) {
        return false;
    }
    let cgroup = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    let forbidden = cgroup.lines().any(|line| {
        let path = line.strip_prefix("0::").map(|p| p.trim_start_matches('/'));
        path.and_then(|p| {
            std::fs::read_to_string(root.join("sys/fs/cgroup").join(p).join("memory.swap.max")).ok()
        })
        .is_some_and(|max| max.trim() == "0")
    });
    !forbidden
}

/// Cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    const MEMINFO: &str = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";

    #[test]
    fn physical_memory_when_the_cgroup_is_unlimited() {
        let root = fake(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/system.slice/wasmstate.service\n"),
            (
                "sys/fs/cgroup/system.slice/wasmstate.service/memory.max",
                "max\n",
            ),
        ]);
        assert_eq!(
            memory_limit_under(root.path()),
            Some((24576000 * 1024, MemorySource::Physical))
        );
    }

    #[test]
    fn the_lowest_cgroup_limit_on_the_path_v2() {
        let root = fake(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/kubepods/pod1/c1\n"),
            ("sys/fs/cgroup/kubepods/memory.max", "8589934592\n"),
            ("sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n"),
            ("sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n"),
        ]);
        assert_eq!(
            memory_limit_under(root.path()),
            Some((2 << 30, MemorySource::Cgroup))
        );
    }

    #[test]
    fn swap_is_possible_only_with_a_swap_area_the_cgroup_allows() {
        const HEADER: &str = "Filename\tType\tSize\tUsed\tPriority\n";
        let none = fake(&[("proc/swaps", HEADER)]);
        assert!(!swap_possible_under(none.path()));
        // Unreadable (issue 27, finding 11): assumed possible.
        let unknown = fake(&[("proc/self/cgroup", "0::/svc\n")]);
        assert!(swap_possible_under(unknown.path()));
        let active = format!("{HEADER}/swapfile file 1048572 0 -2\n");
        let on = fake(&[("proc/swaps", &active), ("proc/self/cgroup", "0::/svc\n")]);
        assert!(swap_possible_under(on.path()));
        let forbidden = fake(&[
            ("proc/swaps", &active),
            ("proc/self/cgroup", "0::/svc\n"),
            ("sys/fs/cgroup/svc/memory.swap.max", "0\n"),
        ]);
        assert!(!swap_possible_under(forbidden.path()));
    }

    #[test]
    fn cgroup_v1_memory_controller() {
        let root = fake(&[
            ("proc/meminfo", MEMINFO),
            (
                "proc/self/cgroup",
                "4:memory:/docker/abc\n3:cpu:/docker/abc\n",
            ),
            (
                "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "1073741824\n",
            ),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(
            memory_limit_under(root.path()),
            Some((1 << 30, MemorySource::Cgroup))
        );
    }
}
