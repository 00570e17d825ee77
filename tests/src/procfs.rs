//! CPU time and resident memory of a process from `/proc` (Linux).

use std::time::Duration;

/// utime + stime of `pid` and its direct children, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let ticks: u64 = with_children(pid).iter().filter_map(|p| own_ticks(*p)).sum();
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks_per_sec()))
}

/// Resident set size of `pid` and its direct children, bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let kb: u64 = with_children(pid)
        .iter()
        .filter_map(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum();
    Some(kb * 1024)
}

fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    for task in tasks {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn own_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after its ')' are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime = fields.get(11)?.parse::<u64>().ok()?;
    let stime = fields.get(12)?.parse::<u64>().ok()?;
    Some(utime + stime)
}

/// `USER_HZ`; 100 on every Linux we run on (fixed by the kernel ABI for /proc).
fn clock_ticks_per_sec() -> f64 {
    100.0
}

#[cfg(test)]
mod tests;
