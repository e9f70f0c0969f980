//! Processes seen through `/proc`: what the compiler-child tests measure.

use crate::common::*;
use std::time::Duration;

/// Resident memory of `pid` once it stops changing (within 1 MiB over
/// 2 s; 30 s at most), in MiB.
pub(super) fn idle_rss_mib(pid: u32) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut samples = vec![rss_kib(pid)];
    loop {
        let recent = &samples[samples.len().saturating_sub(9)..];
        let spread = recent.iter().max().unwrap() - recent.iter().min().unwrap();
        if (recent.len() == 9 && spread < 1024) || std::time::Instant::now() > deadline {
            return samples.last().unwrap() / 1024;
        }
        std::thread::sleep(Duration::from_millis(250));
        samples.push(rss_kib(pid));
    }
}

/// The compiler children of `pid` (working for it) that have spent
/// `cpu_ticks` of CPU time (so have read their input and are compiling),
/// by process id.
pub(super) fn compiler_children(pid: u32, cpu_ticks: u64) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // "pid (comm) state ppid ... utime stime ...": the comm may hold
            // spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(") ")
                .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
            let ticks: u64 = [11, 12]
                .iter()
                .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
                .sum();
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            fields.get(1) == Some(&pid.to_string().as_str())
                && ticks >= cpu_ticks
                && String::from_utf8_lossy(&cmdline).contains("__compile-guest")
        })
        .collect()
}
