//! Kernel-side diagnostics: the lines the driver programs write with aya-log (`AYA_LOGS`, a ring
//! buffer) while `TracerConfig::diagnostics` is on — an ioctl copy that faulted, a UVM command or
//! an RM_ALLOC class no capture plan matched — read into the agent's own log (tracing, target
//! `gpu_tracer::kernel`, at warn level so they show with the default `--log warn` once switched
//! on; the kernel's level is a field), counted, and the last few kept ([`KernelLog::recent`]).
//!
//! Off by default (`kernel_log = true` or `--kernel-log` turns it on at start; SIGUSR1 toggles it
//! while running): off, each NVIDIA ioctl pays one load of `CONFIG` and a branch
//! (docs/benchmarks.md §2). Lines are best effort: when `AYA_LOGS` is full the kernel side drops
//! a line without a count (aya-log keeps none); the facts themselves are never lost that way, since
//! every fault and unmatched plan is also in the record's flags and the decoder's counters.
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use aya::Ebpf;
use aya_log::EbpfLogger;

/// Lines kept for [`KernelLog::recent`].
const RECENT: usize = 32;

#[derive(Default)]
struct Seen {
    lines: u64,
    recent: VecDeque<String>,
}

/// Forwards aya-log's records to `tracing` and keeps count.
struct ToTracing(Arc<Mutex<Seen>>);

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        // Asked for (they are off unless switched on), so shown at the default `--log warn`; the
        // kernel's own level is a field.
        let level = record.level().as_str();
        match record.level() {
            log::Level::Error => tracing::error!(target: "gpu_tracer::kernel", kernel_level = level, "{text}"),
            _ => tracing::warn!(target: "gpu_tracer::kernel", kernel_level = level, "{text}"),
        }
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.lines += 1;
        if s.recent.len() == RECENT {
            s.recent.pop_front();
        }
        s.recent.push_back(text);
    }

    fn flush(&self) {}
}

/// The reader of `AYA_LOGS`.
pub struct KernelLog {
    logger: EbpfLogger<ToTracing>,
    seen: Arc<Mutex<Seen>>,
}

impl KernelLog {
    /// Take `AYA_LOGS` out of the loaded object. Errors when the object has no log map.
    pub fn take(ebpf: &mut Ebpf) -> Result<KernelLog, aya_log::Error> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let logger = EbpfLogger::init_with_logger(ebpf, ToTracing(seen.clone()))?;
        Ok(KernelLog { logger, seen })
    }

    /// Read every line written since the last call into the log.
    pub fn flush(&mut self) {
        self.logger.flush();
    }

    /// Lines read so far.
    pub fn lines(&self) -> u64 {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).lines
    }

    /// The last lines read (at most 32), oldest first.
    pub fn recent(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).recent.iter().cloned().collect()
    }
}
