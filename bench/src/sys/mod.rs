//! Small OS helpers: CPU pinning, clocks, `/proc` readings, statistics and machine description.
use std::time::{SystemTime, UNIX_EPOCH};

/// Online CPUs (read before any pinning: `available_parallelism` follows the affinity mask).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 { n as usize } else { 1 }
}

/// Pin the calling thread (or, before any thread exists, the process) to one CPU.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the macros only touch the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Monotonic clock.
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`).
pub fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// `(RssAnon, RssFile, RssShmem)` in kB.
pub fn rss_parts() -> (u64, u64, u64) {
    (status_kb("RssAnon").unwrap_or(0), status_kb("RssFile").unwrap_or(0), status_kb("RssShmem").unwrap_or(0))
}

/// The 1-minute load average (other work on the machine makes every number noisier).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Bytes of kernel memory charged to the BPF maps this process holds (sum of `memlock` over the
/// `/proc/self/fdinfo` entries of map fds).
pub fn bpf_map_memlock() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else { return 0 };
    let mut total = 0;
    for e in dir.flatten() {
        let Ok(s) = std::fs::read_to_string(e.path()) else { continue };
        if !s.contains("map_type:") {
            continue;
        }
        if let Some(v) = s.lines().find_map(|l| l.strip_prefix("memlock:")) {
            total += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// Median (mean of the middle two for an even count); NaN for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// What the numbers were measured on.
#[derive(Clone, Debug)]
pub struct Machine {
    pub kernel: String,
    pub cpu_model: String,
    pub nproc: usize,
    pub date_utc: String,
    pub bpftrace: Option<String>,
}

impl Machine {
    pub fn detect(nproc: usize) -> Self {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
                })
            })
            .unwrap_or_else(|| "unknown".into());
        let bpftrace = std::process::Command::new("bpftrace")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        Machine { kernel, cpu_model, nproc, date_utc: utc_now(), bpftrace }
    }
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

/// Proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

/// Attachment fds this process holds: perf events and BPF links (aya keeps one of the two per
/// attached uprobe, kprobe or tracepoint, depending on the kernel's support for perf links).
pub fn attachment_fds() -> usize {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    rd.filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.as_os_str() == "anon_inode:[perf_event]" || l.as_os_str() == "anon_inode:bpf_link")
        })
        .count()
}

#[cfg(test)]
mod tests;
