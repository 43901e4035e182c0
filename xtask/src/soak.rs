//! The "one-hour soak" row of `cargo xtask reliability`: the `gpu-tracer agent` binary on a
//! simulated node under steady churn for an hour (`--long`) or a short run (the default, 90 s),
//! its RSS, fds, table sizes and kernel-map occupancy sampled, and a least-squares slope fitted to
//! each series after a warm-up.
//!
//! The node, the churn and the sampling are a root test, `the_agent_binary_holds_steady_under_churn`
//! in tests/tests/churn.rs: it is built from the test harness (fake driver, pod cgroups, workloads,
//! the NVML model, the API server and kubelet doubles), which xtask cannot link (xtask must build
//! before `setup` has installed the eBPF toolchain those crates need). CI runs that test for 15 s,
//! where it checks that the agent is back to its baseline once the churn stops. Here it runs for the
//! soak's duration (`GPU_TRACER_SOAK_SECONDS`); this module reads the `soak-sample:` lines it
//! prints, fits the slopes and judges them ([`Judge`]). The samples are also written to
//! `<logs>/soak-samples.csv`.

use crate::reliability::{figure_lines, run_logged, tail, with_panic};
use crate::test::Summary;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The test that runs the node and prints the samples.
pub const TEST: &str = "the_agent_binary_holds_steady_under_churn";
/// Its test binary (tests/tests/churn.rs).
pub const TEST_BIN: &str = "churn";
/// The short form's duration, seconds.
pub const SHORT_S: u64 = 90;
/// The long form's duration, seconds.
pub const LONG_S: u64 = 3600;
/// What the test runs without `GPU_TRACER_SOAK_SECONDS`, as `cargo xtask test` (CI) runs it
/// (`SOAK_DEFAULT_S` in tests/tests/churn.rs).
pub const CI_S: u64 = 15;

/// How long to soak and how to sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub seconds: u64,
    /// Seconds between samples.
    pub every_s: f64,
    /// Samples before this many seconds are not fitted (tables, caches and the allocator reach
    /// their working size).
    pub warmup_s: f64,
}

impl Plan {
    /// `--soak-seconds N` wins; else `--long` is [`LONG_S`] and the default [`SHORT_S`]. About 120
    /// samples (one a second at most, one every 30 s at least) and a sixth of the run (5 s to 10
    /// min) as warm-up.
    pub fn new(long: bool, seconds: Option<u64>) -> Plan {
        let seconds = seconds.unwrap_or(if long { LONG_S } else { SHORT_S }).max(10);
        Plan {
            seconds,
            every_s: (seconds as f64 / 120.0).clamp(1.0, 30.0),
            warmup_s: (seconds as f64 / 6.0).clamp(5.0, 600.0),
        }
    }

    /// Whether this is the one-hour form.
    pub fn is_long(&self) -> bool {
        self.seconds >= LONG_S
    }
}

/// How a series' trend is judged. `window_h` is the length of the fitted window.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Judge {
    /// The agent's resident set (KiB): its fitted growth over the window may not exceed 1 MiB, or,
    /// over a window longer than an hour, 1 MiB/h. Between samples the RSS moves by a few hundred
    /// KiB (allocator, tokio and HTTP buffers), so a short window cannot resolve less; the hour's
    /// 50 minutes after warm-up make it 1.2 MiB/h. At the soak's churn (over 10,000 pods an hour,
    /// hundreds of times a busy node's) 1 MiB/h is about 100 bytes per pod.
    Rss,
    /// A count that follows the live pods (table rows, map entries, fds): its slope may not exceed
    /// three standard errors of the fit (what the coming and going of pods alone produces, 0.3 %
    /// of the time), nor a growth of 8 over the window. A leak of one entry per pod grows by the
    /// hundreds of pods in the window, caught even when only one pod in twenty leaks, whatever the
    /// series' level; over the hour, a count growing by 10 an hour is caught.
    Count,
    /// Kept by design up to a cap (the attribution keeps 4096 containers' cost, then evicts the
    /// oldest): may not exceed it; the slope is reported, not judged. Until it reaches its cap, the
    /// memory it takes grows by design, so the fit starts once it has (if that leaves at least
    /// half the samples after the warm-up).
    Capped(f64),
    /// Reported only: the number of series and the size of /metrics follow the capped
    /// attribution as well as the tables judged one by one.
    Info,
}

/// The series the test samples, in the order they are reported, with their judge.
const SERIES: &[(&str, Judge)] = &[
    ("rss_kib", Judge::Rss),
    ("fds", Judge::Count),
    ("threads", Judge::Count),
    ("processes", Judge::Count),
    ("cgroup_rows", Judge::Count),
    ("cuda_cgroup_rows", Judge::Count),
    ("attribution_containers", Judge::Capped(4096.0)),
    ("series", Judge::Info),
    ("metrics_kib", Judge::Info),
    ("NV_FDS", Judge::Count),
    ("TRACKED_TGIDS", Judge::Count),
    ("INFLIGHT", Judge::Count),
    ("UVM_MAPS", Judge::Count),
    ("CUDA_COUNTS", Judge::Count),
    ("CUDA_INFLIGHT", Judge::Count),
    ("LOST_RECORDS", Judge::Count),
];

/// One `soak-sample:` line.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    t: f64,
    /// `baseline` (before the churn), `churn`, or `end` (after it, once the agent has caught up).
    phase: String,
    values: BTreeMap<String, f64>,
}

/// Parses `soak-sample: t=1.5 phase=churn k=v ...` (anywhere in a line, as libtest may prefix it).
fn parse_sample(line: &str) -> Option<Sample> {
    let (_, rest) = line.split_once("soak-sample: ")?;
    let mut s = Sample { t: f64::NAN, phase: String::new(), values: BTreeMap::new() };
    for (k, v) in rest.split_whitespace().filter_map(|w| w.split_once('=')) {
        match (k, v.parse::<f64>()) {
            ("t", Ok(t)) => s.t = t,
            ("phase", _) => s.phase = v.to_string(),
            (_, Ok(x)) => {
                s.values.insert(k.to_string(), x);
            }
            _ => {}
        }
    }
    (!s.t.is_nan()).then_some(s)
}

/// The least-squares slope of `points` (x, y) and its standard error; `None` with fewer than 3
/// points or one x.
fn slope(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let residuals: f64 = points.iter().map(|p| (p.1 - my - b * (p.0 - mx)).powi(2)).sum();
    Some((b, (residuals / (n - 2.0) / sxx).sqrt()))
}

/// A series' fitted trend and verdict.
#[derive(Clone, Debug, PartialEq)]
struct Trend {
    name: &'static str,
    /// Per hour, in the series' unit (KiB for `rss_kib`).
    per_hour: f64,
    /// What the judge allows per hour over this window (`None`: not judged).
    limit_per_hour: Option<f64>,
    ok: bool,
    /// Why a judged series was not judged this time.
    not_judged: Option<String>,
}

/// What [`trends`] fitted.
#[derive(Debug)]
struct Fit {
    trends: Vec<Trend>,
    /// Samples fitted, and the time (seconds into the run) of the first.
    samples: usize,
    from_s: f64,
    window_h: f64,
}

/// Fits each series over the churn samples after the warm-up (and after every capped series has
/// reached its cap, see [`Judge::Capped`]) and judges it.
fn trends(samples: &[Sample], warmup_s: f64) -> Result<Fit, String> {
    let after_warmup: Vec<&Sample> = samples.iter().filter(|s| s.phase == "churn" && s.t >= warmup_s).collect();
    let capped_at = SERIES
        .iter()
        .filter_map(|(name, j)| match j {
            Judge::Capped(cap) => {
                Some(after_warmup.iter().find(|s| s.values.get(*name).is_some_and(|v| v >= cap)).map(|s| s.t))
            }
            _ => None,
        })
        .collect::<Option<Vec<f64>>>()
        .and_then(|ts| ts.into_iter().reduce(f64::max));
    let fitted: Vec<&Sample> = match capped_at {
        Some(t) if after_warmup.iter().filter(|s| s.t >= t).count() * 2 >= after_warmup.len() => {
            after_warmup.into_iter().filter(|s| s.t >= t).collect()
        }
        _ => after_warmup,
    };
    let (Some(first), Some(last)) = (fitted.first(), fitted.last()) else {
        return Err("no sample after the warm-up".into());
    };
    let (from_s, window_h) = (first.t, (last.t - first.t) / 3600.0);
    let points = |name: &str| -> Vec<(f64, f64)> {
        fitted.iter().filter_map(|s| s.values.get(name).map(|v| (s.t / 3600.0, *v))).collect()
    };
    // A capped table still growing towards its cap takes more memory by design: the RSS is not
    // judged over such a window (the long form's starts once the cap is reached).
    let filling = SERIES.iter().find_map(|(name, j)| {
        let Judge::Capped(cap) = j else { return None };
        let p = points(name);
        let (per_hour, stderr) = slope(&p)?;
        let last = p.last()?.1;
        (last < *cap && per_hour * window_h > 8.0 && per_hour > 3.0 * stderr)
            .then(|| format!("{name} still filling to its cap, {last:.0} of {cap:.0}"))
    });
    let mut out = Vec::new();
    for (name, judge) in SERIES {
        let points = points(name);
        let Some((per_hour, stderr)) = slope(&points) else {
            return Err(format!("too few samples of {name} after the warm-up ({})", points.len()));
        };
        let max = points.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let mut not_judged = None;
        let (limit_per_hour, ok) = match judge {
            Judge::Rss if filling.is_some() => {
                not_judged = filling.clone();
                (None, true)
            }
            Judge::Rss => {
                let limit = (1024.0 / window_h).max(1024.0);
                (Some(limit), per_hour <= limit)
            }
            Judge::Count => {
                let limit = (8.0 / window_h).max(3.0 * stderr);
                (Some(limit), per_hour <= limit)
            }
            Judge::Capped(cap) => (None, max <= *cap),
            Judge::Info => (None, true),
        };
        out.push(Trend { name, per_hour, limit_per_hour, ok, not_judged });
    }
    Ok(Fit { trends: out, samples: fitted.len(), from_s, window_h })
}

/// `+1.23`-style, with fewer decimals for large values.
fn signed(x: f64) -> String {
    let d = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 1.0 {
        1
    } else {
        2
    };
    format!("{x:+.d$}")
}

/// One series as a figure: `rss=+0.31 MiB/h (≤1.2)`, a failing one marked `FAIL`.
fn trend_figure(t: &Trend) -> String {
    let (name, scale, unit) = if t.name == "rss_kib" { ("rss", 1024.0, " MiB/h") } else { (t.name, 1.0, "/h") };
    let mut s = format!("{name}={}{unit}", signed(t.per_hour / scale));
    if let Some(l) = t.limit_per_hour {
        let _ = write!(s, " (≤{})", signed(l / scale).trim_start_matches('+'));
    }
    if let Some(why) = &t.not_judged {
        let _ = write!(s, " (not judged: {why})");
    }
    if !t.ok {
        s.push_str(" FAIL");
    }
    s
}

/// The samples as CSV, for plotting.
fn csv(samples: &[Sample]) -> String {
    let keys: Vec<&String> = samples.first().map(|s| s.values.keys().collect()).unwrap_or_default();
    let mut out = format!("t,phase,{}\n", keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(","));
    for s in samples {
        let vals: Vec<String> =
            keys.iter().map(|k| s.values.get(*k).map_or(String::new(), |v| v.to_string())).collect();
        let _ = writeln!(out, "{},{},{}", s.t, s.phase, vals.join(","));
    }
    out
}

/// Runs the soak test executable `exe` (in `dir`, its package's directory) for `plan` and judges
/// the trends: (figures as (test, text), why it failed).
pub fn run(exe: &Path, dir: &Path, logs: &Path, plan: &Plan) -> (Vec<(String, String)>, Option<String>) {
    let log = logs.join(format!("{TEST}.log"));
    let mut c = Command::new(exe);
    c.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .current_dir(dir)
        .env("GPU_TRACER_REQUIRE_PRIVILEGED", "1")
        .env("GPU_TRACER_SOAK_SECONDS", plan.seconds.to_string())
        .env("GPU_TRACER_SOAK_SAMPLE_SECONDS", plan.every_s.to_string());
    let _ = std::fs::write(&log, format!("# {}\n", cargo_test_line(plan.seconds)));
    let limit = Duration::from_secs(plan.seconds + 300);
    let (status, text) = match run_logged(&mut c, &log, limit) {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(format!("{e:#}"))),
    };
    let samples: Vec<Sample> = text.lines().filter_map(parse_sample).collect();
    let _ = std::fs::write(logs.join("soak-samples.csv"), csv(&samples));
    let mut figures = Vec::new();
    let lines = figure_lines(&text);
    if !lines.is_empty() {
        figures.push((TEST.to_string(), lines.join("; ")));
    }
    let mut summary = Summary::default();
    text.lines().for_each(|l| summary.feed(l));
    let mut failure = match status {
        None => Some(format!("killed after {} s", limit.as_secs())),
        Some(st) if !st.success() => Some(with_panic(format!("{TEST} failed ({st})"), &text)),
        Some(_) if summary.passed != 1 || summary.failed != 0 => {
            Some(format!("{} passed, {} failed: is the name still right?", summary.passed, summary.failed))
        }
        Some(_) => None,
    };
    if failure.is_some() {
        eprintln!();
        eprintln!("[reliability] {TEST} failed; the end of {}:", log.display());
        for l in tail(&text, 25) {
            eprintln!("    {l}");
        }
    }
    match trends(&samples, plan.warmup_s) {
        Ok(Fit { trends, samples: n, from_s, window_h }) => {
            let form = if plan.is_long() {
                "the long form".to_string()
            } else {
                format!("a short form; `--long` runs {LONG_S} s")
            };
            let mut s = format!(
                "slopes per hour ({} s run, {form}; fitted over {n} samples from t={from_s:.0} s to t={:.0} s, after a \
                 {:.0} s warm-up): ",
                plan.seconds,
                from_s + window_h * 3600.0,
                plan.warmup_s
            );
            s.push_str(&trends.iter().map(trend_figure).collect::<Vec<_>>().join(", "));
            figures.push(("slopes".to_string(), s));
            let bad: Vec<&str> = trends.iter().filter(|t| !t.ok).map(|t| t.name).collect();
            if !bad.is_empty() {
                let why = format!("growing after the warm-up: {}", bad.join(", "));
                failure = Some(failure.map_or(why.clone(), |f| format!("{f}; {why}")));
            }
        }
        Err(why) if failure.is_none() => failure = Some(why),
        Err(_) => {}
    }
    (figures, failure)
}

/// The command line that runs the soak test by hand (without the slopes, which this module fits).
pub fn cargo_test_line(seconds: u64) -> String {
    format!(
        "GPU_TRACER_REQUIRE_PRIVILEGED=1 GPU_TRACER_SOAK_SECONDS={seconds} cargo test --release -p gpu-tracer-tests \
         --test {TEST_BIN} -- --exact {TEST} --nocapture"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_exact_and_noise_averages_out() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 + 2.5 * i as f64)).collect();
        let (b, se) = slope(&line).unwrap();
        assert!((b - 2.5).abs() < 1e-12 && se < 1e-9, "{b} ± {se}");
        let zigzag: Vec<(f64, f64)> =
            (0..100u32).map(|i| (f64::from(i), if i.is_multiple_of(2) { 10.0 } else { 0.0 })).collect();
        let (b, se) = slope(&zigzag).unwrap();
        // Alternating 0 and 10 (σ = 5) over 100 points: the slope's standard error is
        // 5 / sqrt(Σ(x - x̄)²) = 5 / 288.7.
        assert!(b.abs() < 0.01 && (se - 5.0 / 288.66).abs() < 0.001, "{b} ± {se}");
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]), None);
    }

    #[test]
    fn samples_are_read_from_the_test_output() {
        let s = parse_sample("test x ... soak-sample: t=12.5 phase=churn live_pods=3 rss_kib=2048 NV_FDS=9").unwrap();
        assert_eq!((s.t, s.phase.as_str()), (12.5, "churn"));
        assert_eq!(s.values.get("rss_kib"), Some(&2048.0));
        assert_eq!(s.values.len(), 3);
        assert_eq!(parse_sample("reliability: t=1"), None);
        assert_eq!(parse_sample("soak-sample: phase=churn"), None);
    }

    fn samples(n: usize, every_s: f64, f: impl Fn(f64) -> BTreeMap<String, f64>) -> Vec<Sample> {
        (0..n).map(|i| i as f64 * every_s).map(|t| Sample { t, phase: "churn".into(), values: f(t) }).collect()
    }

    fn all(rss_kib: f64, count: f64) -> BTreeMap<String, f64> {
        SERIES.iter().map(|(k, _)| (k.to_string(), if *k == "rss_kib" { rss_kib } else { count })).collect()
    }

    #[test]
    fn steady_series_pass_and_leaks_fail() {
        // 90 s, a sample a second, warm-up 15 s: a noisy but flat agent passes.
        let flat = samples(90, 1.0, |t| all(40_000.0 + if (t as u64).is_multiple_of(2) { 300.0 } else { 0.0 }, 5.0));
        let fit = trends(&flat, 15.0).unwrap();
        assert_eq!((fit.samples, fit.from_s), (75, 15.0));
        assert!(fit.trends.iter().all(|t| t.ok), "{fit:?}");
        // One entry per pod (4 pods a second) in a map, and one per eight pods in a table already
        // large: both caught; a count swinging by 40 with the live pods is not.
        let leak = samples(90, 1.0, |t| {
            let mut m = all(40_000.0, 5.0);
            m.insert("NV_FDS".into(), 5.0 + 4.0 * t);
            m.insert("cgroup_rows".into(), 1000.0 + 0.5 * t);
            m.insert("fds".into(), if (t as u64).is_multiple_of(3) { 120.0 } else { 80.0 });
            m
        });
        let tr = trends(&leak, 15.0).unwrap().trends;
        assert_eq!(tr.iter().filter(|t| !t.ok).map(|t| t.name).collect::<Vec<_>>(), ["cgroup_rows", "NV_FDS"]);
        // RSS growing 3 MiB over the window: caught; 0.5 MiB: not.
        for (grow_kib, fails) in [(3.0 * 1024.0, true), (512.0, false)] {
            let s = samples(90, 1.0, |t| all(40_000.0 + grow_kib * t / 90.0, 5.0));
            let tr = trends(&s, 15.0).unwrap().trends;
            assert_eq!(!tr[0].ok, fails, "{grow_kib} KiB: {:?}", tr[0]);
        }
        // Over an hour, 1 MiB/h is the limit.
        let hour = samples(120, 30.0, |t| all(40_000.0 + 2048.0 * t / 3600.0, 5.0));
        let fit = trends(&hour, 600.0).unwrap();
        let rss = &fit.trends[0];
        assert!(fit.window_h > 0.8 && !rss.ok && rss.limit_per_hour == Some(1024.0 / fit.window_h), "{rss:?}");
        // A capped table ramping to its cap (and the RSS with it) is fitted from where it got there.
        let ramp = samples(120, 30.0, |t| {
            let mut m = all(40_000.0 + 8.0 * (t.min(1200.0)), 5.0);
            m.insert("attribution_containers".into(), (t * 4.0).min(4096.0));
            m
        });
        let fit = trends(&ramp, 600.0).unwrap();
        assert_eq!(fit.from_s, 1050.0);
        assert!(fit.trends[0].per_hour > 0.0 && fit.trends.iter().all(|t| t.ok), "{fit:?}");
        // While the attribution fills towards its cap, the RSS it takes is not judged (short form).
        let filling = samples(90, 1.0, |t| {
            let mut m = all(40_000.0 + 15.0 * t, 5.0);
            m.insert("attribution_containers".into(), 4.0 * t);
            m
        });
        let rss = &trends(&filling, 15.0).unwrap().trends[0];
        assert!(rss.ok && rss.limit_per_hour.is_none() && rss.not_judged.is_some(), "{rss:?}");
        // Baseline and end samples are not fitted.
        let mut only_ends = flat.clone();
        only_ends.iter_mut().for_each(|s| s.phase = "end".into());
        assert!(trends(&only_ends, 15.0).is_err());
    }

    #[test]
    fn plans_follow_the_form() {
        let short = Plan::new(false, None);
        assert_eq!((short.seconds, short.every_s, short.warmup_s), (SHORT_S, 1.0, 15.0));
        let long = Plan::new(true, None);
        assert_eq!((long.seconds, long.every_s, long.warmup_s), (LONG_S, 30.0, 600.0));
        assert!(long.is_long() && !short.is_long());
        assert_eq!(Plan::new(true, Some(600)).seconds, 600);
    }

    #[test]
    fn figures_name_the_unit_and_the_limit() {
        let t = Trend { name: "rss_kib", per_hour: 512.0, limit_per_hour: Some(1228.8), ok: true, not_judged: None };
        assert_eq!(trend_figure(&t), "rss=+0.50 MiB/h (≤1.2)");
        let t = Trend { name: "NV_FDS", per_hour: 15000.0, limit_per_hour: Some(480.0), ok: false, not_judged: None };
        assert_eq!(trend_figure(&t), "NV_FDS=+15000/h (≤480) FAIL");
        let t =
            Trend { name: "rss_kib", per_hour: 51200.0, limit_per_hour: None, ok: true, not_judged: Some("x".into()) };
        assert_eq!(trend_figure(&t), "rss=+50.0 MiB/h (not judged: x)");
    }
}
