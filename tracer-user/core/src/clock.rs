//! The clocks the pipeline stamps with: CLOCK_MONOTONIC (the clock of `bpf_ktime_get_ns` and of
//! NVML sample times) and the wall clock, related by one offset taken at start-up.
use std::time::{SystemTime, UNIX_EPOCH};

/// CLOCK_MONOTONIC now, ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The wall clock now, ns since the Unix epoch (0 before the epoch).
pub fn wall_now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// Turns monotonic timestamps (kernel `ktime_ns`) into wall-clock time, with the offset between
/// the two clocks read once (so every event of a run is stamped consistently).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    /// Wall clock minus monotonic clock, ns.
    mono_to_wall_ns: i128,
}

impl WallClock {
    /// Reads both clocks now.
    pub fn new() -> WallClock {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as i128;
        WallClock { mono_to_wall_ns: wall - monotonic_ns() as i128 }
    }

    /// Nanoseconds since the Unix epoch of monotonic time `mono_ns` (0 before the epoch).
    pub fn wall_ns(&self, mono_ns: u64) -> u64 {
        (self.mono_to_wall_ns + mono_ns as i128).max(0) as u64
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::new()
    }
}

/// Clock ticks (`/proc/PID/stat` start times) to nanoseconds.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks.saturating_mul(1_000_000_000 / hz)
}
