//! The agent's own process, under the names every Prometheus client library uses (`process_*`,
//! no `gpu_tracer_` prefix, as client_golang's process collector writes them), so the usual
//! dashboards and alerts for an exporter's CPU, memory and file descriptors work on the agent:
//! read from `/proc/self` at scrape time. Only the agent serves them
//! ([`MetricsRegistry::with_process_metrics`](super::MetricsRegistry::with_process_metrics)).
use std::fmt;

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{counter, family::TextEncoder, gauge};

/// What `/proc/self` says, read at once.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
    pub threads: u64,
}

impl ProcessStats {
    /// This process's figures; `None` when `/proc/self/stat` cannot be read or parsed.
    pub(crate) fn of_self() -> Option<ProcessStats> {
        let me = crate::proc::myself(std::path::Path::new("/proc")).ok()?;
        let stat = crate::proc::read_stat(&me).ok()?;
        let btime = crate::proc::boot_time_secs()?;
        let open_fds = me.fd_count().map_or(0, |n| n as u64);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct passed.
        let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 0 };
        // SAFETY: sysconf reads constants of the system.
        let (hz, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        Some(ProcessStats { open_fds, max_fds, ..from_stat(&stat, btime, hz.max(1) as u64, page.max(1) as u64) })
    }
}

/// The figures of a `/proc/PID/stat`, with the boot time (`btime` of `/proc/stat`), clock ticks
/// per second and the page size.
fn from_stat(s: &crate::proc::Stat, btime: u64, hz: u64, page: u64) -> ProcessStats {
    ProcessStats {
        cpu_seconds: (s.utime + s.stime) as f64 / hz as f64,
        resident_bytes: s.rss * page,
        virtual_bytes: s.vsize,
        start_time_seconds: btime as f64 + s.starttime as f64 / hz as f64,
        threads: s.num_threads.max(0) as u64,
        ..ProcessStats::default()
    }
}

/// The `process_*` families of this process (nothing when `/proc/self` cannot be read).
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(p) = ProcessStats::of_self() else { return Ok(()) };
        let mut e = TextEncoder(&mut e);
        counter(
            &mut e,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            p.cpu_seconds,
        )?;
        gauge(&mut e, "process_resident_memory_bytes", "Resident memory size in bytes.", None, p.resident_bytes)?;
        gauge(&mut e, "process_virtual_memory_bytes", "Virtual memory size in bytes.", None, p.virtual_bytes)?;
        gauge(&mut e, "process_open_fds", "Number of open file descriptors.", None, p.open_fds)?;
        gauge(&mut e, "process_max_fds", "Maximum number of open file descriptors.", None, p.max_fds)?;
        gauge(
            &mut e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            None,
            p.start_time_seconds,
        )?;
        gauge(&mut e, "process_threads", "Number of OS threads in the process.", None, p.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_name() {
        // A name with a space and a parenthesis, as a process may name itself.
        let stat = "4242 (gpu tr) cer) S 1 4242 4242 0 -1 4194560 2000 0 0 0 250 50 0 0 20 0 7 0 12345 \
                    104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = from_stat(&crate::proc::parse::stat(stat).unwrap(), 1_700_000_000, 100, 4096);
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_seconds, 1_700_000_000.0 + 123.45);
        assert_eq!((s.virtual_bytes, s.resident_bytes), (104_857_600, 2560 * 4096));
    }

    #[test]
    fn this_process_is_read() {
        let p = ProcessStats::of_self().expect("/proc/self");
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes, "{p:?}");
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds && p.threads >= 1, "{p:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(p.start_time_seconds > now - 3600.0 && p.start_time_seconds <= now + 1.0, "{p:?}");
    }
}
