//! What a profiling session writes and shows, whoever recorded it (this machine's probes or an
//! agent's): the trace file, the summary and the HTML report ([`write_outputs`]), and the progress
//! while recording ([`Shown`]).
use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{perfetto, summary};
use tracer_core::profile::{Limits, Recording, Target, TargetSpec};

/// How progress is shown while recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing (stderr is not a terminal and no `--json`).
    Off,
    /// A redrawn line on the terminal.
    Bar,
    /// One JSON object per second on stderr.
    Json,
}

impl Progress {
    /// `Bar` on a terminal, `Json` when asked, else `Off`.
    pub fn choose(json: bool) -> Progress {
        if json {
            Progress::Json
        } else if std::io::stderr().is_terminal() {
            Progress::Bar
        } else {
            Progress::Off
        }
    }
}

/// What a session is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: TargetSpec,
    pub duration: Duration,
    pub output: PathBuf,
    pub summary_json: Option<PathBuf>,
    /// Also write the HTML report here.
    pub html: Option<PathBuf>,
    /// Gaps between launches at least this long are idle.
    pub idle_gap: Duration,
    pub limits: Limits,
    pub max_trace_bytes: u64,
    pub progress: Progress,
}

/// The progress shown while recording (a bar on a terminal, JSON lines with `--json`).
pub struct Shown {
    progress: Progress,
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
    duration: Duration,
    max_trace_bytes: u64,
}

/// Bytes a kept event takes in the trace, about (for the progress line's estimate).
const TRACE_BYTES_PER_EVENT: u64 = 120;

impl Shown {
    /// Progress for a session of `opts`, starting now.
    pub fn new(opts: &Options) -> Shown {
        let bar = (opts.progress == Progress::Bar).then(|| {
            let b = indicatif::ProgressBar::new(opts.duration.as_millis() as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} recording [{bar:30}] {elapsed}/{duration_precise} {msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            b
        });
        Shown {
            progress: opts.progress,
            bar,
            started: Instant::now(),
            duration: opts.duration,
            max_trace_bytes: opts.max_trace_bytes,
        }
    }

    /// Show where `rec` stands; `dropped`: the tracer's drops so far, when known.
    pub fn show(&self, rec: &Recording, dropped: Option<u64>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let kept = rec.events_seen - rec.events_over_limit;
        let trace = kept * TRACE_BYTES_PER_EVENT;
        match self.progress {
            Progress::Off => {}
            Progress::Json => {
                let line = serde_json::json!({
                    "elapsed_s": (elapsed * 10.0).round() / 10.0,
                    "duration_s": self.duration.as_secs_f64(),
                    "launches": rec.launches.len(),
                    "memory_calls": rec.memory.len(),
                    "calls": rec.calls.len(),
                    "events_over_limit": rec.events_over_limit,
                    "tracer_dropped": dropped,
                    "trace_bytes_estimate": trace,
                });
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            Progress::Bar => {
                if let Some(b) = &self.bar {
                    b.set_position((elapsed * 1000.0) as u64);
                    b.set_message(format!(
                        "{} launches, {} memory calls, {} other calls, {} dropped, trace ~{}",
                        rec.launches.len(),
                        rec.memory.len(),
                        rec.calls.len(),
                        dropped.unwrap_or(0) + rec.events_over_limit,
                        indicatif::HumanBytes(trace.min(self.max_trace_bytes))
                    ));
                }
            }
        }
    }

    /// Clear the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// What a finished session wrote.
pub struct Outcome {
    pub summary: summary::Summary,
}

/// The trace file, created before anything is loaded or asked: a path that cannot be written
/// fails first.
pub fn create_output(opts: &Options) -> Result<std::fs::File> {
    std::fs::File::create(&opts.output).with_context(|| format!("creating the trace file {}", opts.output.display()))
}

/// Write what `rec` holds: the trace into `file`, the summary and the HTML report where asked.
pub fn write_outputs(rec: &Recording, target: &Target, opts: &Options, file: std::fs::File) -> Result<Outcome> {
    let idle_ns = opts.idle_gap.as_nanos().min(u64::MAX as u128) as u64;
    let stats = perfetto::write(rec, idle_ns, opts.max_trace_bytes, std::io::BufWriter::new(file))
        .with_context(|| format!("writing the trace to {}", opts.output.display()))?;
    let summary = summary::summarize(rec, target, idle_ns, stats);
    if let Some(p) = &opts.summary_json {
        let text = serde_json::to_string_pretty(&summary)? + "\n";
        std::fs::write(p, text).with_context(|| format!("writing the summary to {}", p.display()))?;
    }
    if let Some(p) = &opts.html {
        std::fs::write(p, super::html::render(rec, &summary))
            .with_context(|| format!("writing the HTML report to {}", p.display()))?;
    }
    Ok(Outcome { summary })
}
