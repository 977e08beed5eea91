//! Process facts from Linux: resident memory, its peak, CPU pinning.

/// `VmRSS` of a process, in bytes.
pub fn rss(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:") * 1024
}

/// `RssAnon` of a process (resident memory not backed by a file), in bytes.
pub fn rss_anon(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:") * 1024
}

/// `VmHWM` (peak resident memory since start or the last [`reset_peak`]), in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:") * 1024
}

/// Resets `VmHWM` to the current RSS (Linux ≥ 4.0).
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Pins the calling process (and the threads it creates later) to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: the set is zeroed, filled with CPU_SET, and only read by the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "warning: could not pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
