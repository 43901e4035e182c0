//! `cargo xtask test`: setup, then every test of the default members in release mode, privileged
//! tests included, then one closing summary line (`N passed, N failed`). Clippy runs first with
//! warnings as errors (the house lints of `[workspace.lints]`); a finding fails the run.
//!
//! Privileged tests must not skip silently: `GPU_TRACER_REQUIRE_PRIVILEGED=1` makes them panic
//! when they lack root, BPF or FUSE, and an `ignored` test fails the run. The only tests ignored
//! here are the guest-only ones ([`ALLOWED_IGNORED`]: kprobes and a kernel module built for
//! Debian's 6.1 and 5.10 kernels, which this machine does not run); the run's last step boots those
//! kernels (`kernel-matrix --test driver_double --test driver_entry`, on 5.10 with the files whose
//! code differs there) and runs them there, and their results join the summary. A guest-only test that did not pass there counts as failed or skipped, and
//! fails the run. Given arguments (a filter, `-p`), the run stops before the guest step and says so.

use crate::{cmd, kernel_matrix, setup};
use anyhow::Context;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

/// Tests ignored on this machine and run in the 6.1 and 5.10 guests instead, with the reason. Names as libtest prints them
/// (`module::test_name`, or `src/lib.rs - item (line N)` for doc tests).
const ALLOWED_IGNORED: &[(&str, &str)] = &[
    // tests/tests/driver_double.rs: the kernel-module double is built for Debian's 6.1 and 5.10
    // kernels, which this machine does not run; `cargo xtask kernel-matrix --test driver_double` runs them there.
    ("nodes_are_character_devices_with_the_real_entry_points", DRIVER_DOUBLE),
    ("init_alloc_free_through_the_modules", DRIVER_DOUBLE),
    ("last_close_and_exit_free_the_clients_before_returning", DRIVER_DOUBLE),
    ("bad_arguments_fail_in_the_module", DRIVER_DOUBLE),
    ("a_managed_mapping_holds_the_uvm_file", DRIVER_DOUBLE),
    ("a_dead_server_fails_pending_calls_at_once", DRIVER_DOUBLE),
    ("a_killed_caller_does_not_wait_for_its_answer", DRIVER_DOUBLE),
    // tests/tests/driver_entry.rs: fentry and kprobes (absent from this kernel) on the module double.
    ("auto_chooses_driver_entry_and_probes_only_the_drivers_entry_points", DRIVER_ENTRY),
    ("three_pods_one_gpu_give_the_same_bytes_in_driver_entry_and_btf_tracepoint_mode", DRIVER_ENTRY),
    ("a_killed_process_releases_its_memory_at_exit_in_driver_entry_mode", DRIVER_ENTRY),
    ("a_dup_fd_is_the_same_file_and_its_release_frees_the_clients", DRIVER_ENTRY),
    ("bad_ioctl_arguments_are_malformed_events_in_driver_entry_mode", DRIVER_ENTRY),
    ("files_opened_before_the_agent_are_registered_at_their_first_call", DRIVER_ENTRY),
    ("under_the_charts_capabilities_auto_takes_driver_entry_only_where_perf_events_are_allowed", DRIVER_ENTRY),
    ("managed_mappings_give_the_same_bytes_in_driver_entry_and_btf_tracepoint_mode", DRIVER_ENTRY),
    ("ioctl_durations_are_measured_where_the_entry_runs", DRIVER_ENTRY),
];
const DRIVER_ENTRY: &str = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry";
const DRIVER_DOUBLE: &str = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double";

/// What libtest reported, summed over every test binary and the doc tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Names of the tests reported as ignored.
    pub ignored_names: Vec<String>,
    /// Names of the tests reported as passed.
    pub ok_names: Vec<String>,
    /// Number of `test result:` lines seen (one per test binary that ran).
    pub results: u64,
}

impl Summary {
    /// Takes one line of `cargo test` output.
    pub fn feed(&mut self, line: &str) {
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("test result: ") {
            // `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s`
            self.results += 1;
            for part in rest.split(['.', ';']) {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next(), words.next()) else { continue };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        } else if let Some(rest) = line.strip_prefix("test ") {
            // `test path::name ... ignored` or `test path::name ... ignored, reason`
            match rest.split_once(" ... ") {
                Some((name, outcome)) if outcome == "ignored" || outcome.starts_with("ignored,") => {
                    self.ignored_names.push(name.to_string())
                }
                Some((name, "ok")) => self.ok_names.push(name.to_string()),
                _ => {}
            }
        }
    }

    /// Ignored tests that are not allowed to be.
    pub fn unexpected_ignored(&self, allowed: &[(&str, &str)]) -> Vec<&str> {
        self.ignored_names.iter().map(String::as_str).filter(|n| !allowed.iter().any(|(a, _)| a == n)).collect()
    }

    /// Adds another run's counts (the guest's); a test ignored here that passed there is no longer
    /// skipped.
    pub fn absorb(&mut self, other: Summary) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.results += other.results;
        let before = self.ignored_names.len();
        self.ignored_names.retain(|n| !other.ok_names.contains(n));
        self.ignored = self.ignored.saturating_sub((before - self.ignored_names.len()) as u64) + other.ignored;
        self.ignored_names.extend(other.ignored_names);
        self.ok_names.extend(other.ok_names);
    }

    /// The closing line CI reads.
    pub fn line(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.passed, self.failed);
        if self.ignored > 0 {
            s.push_str(&format!(", {} skipped", self.ignored));
        }
        s
    }
}

/// Copies `from` to `to` line by line while feeding each line to `summary`.
fn tee(from: impl Read, mut to: impl Write, summary: Arc<Mutex<Summary>>) {
    let mut reader = BufReader::new(from);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let _ = to.write_all(&buf);
                let _ = to.flush();
                summary.lock().unwrap().feed(&String::from_utf8_lossy(&buf));
            }
        }
    }
}

pub fn run(extra_args: &[String]) -> anyhow::Result<()> {
    let mut times = Times::new();
    let env = setup::run_setup()?;
    times.lap("setup");
    // Before the build: whether it and the tests' build will share what they both compile.
    let unification = match features::check(|| env.cargo()) {
        Ok(d) if d.is_empty() => None,
        Ok(d) => Some(format!(
            "`cargo build --release` and `cargo test --release` resolve different features, so the \
             crates below (and everything above them) are compiled twice: {}",
            d.join("; ")
        )),
        Err(e) => Some(format!("could not compare the build's and the tests' features (cargo tree): {e:#}")),
    };
    // The root tests run the real binaries (gpu-tracer, fake-nvidia-driver, nv-workload): build them
    // first, since `cargo test` only builds a package's binaries for its own integration tests.
    let mut build = env.cargo();
    build.args(["build", "--release"]);
    let bline = cmd::display(&build);
    println!("+ {bline}");
    let st = build.status().with_context(|| format!("could not start `{bline}`"))?;
    if !st.success() {
        anyhow::bail!("`{bline}` failed ({st}); 0 passed, 1 failed");
    }
    times.lap("build");
    // The house lints (`[workspace.lints]`, clippy's included) on every default member, warnings
    // as errors; a finding fails the run but the tests still run.
    let mut clippy = env.cargo();
    clippy.args(["clippy", "--tests", "--quiet", "--", "-D", "warnings"]);
    let cline = cmd::display(&clippy);
    println!("+ {cline}");
    let clippy_ok = clippy.status().with_context(|| format!("could not start `{cline}`"))?.success();
    times.lap("clippy");

    // Issue 45 item 6: the suite must not make (or remove) NVIDIA device nodes on this machine; a
    // test double's switch that trusted NVIDIA's library once left a /dev/nvidiactl behind.
    let devices_before = nvidia_device_nodes();
    let mut test = env.cargo();
    test.args(["test", "--release", "--no-fail-fast"])
        .args(extra_args)
        .env("GPU_TRACER_REQUIRE_PRIVILEGED", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let line = cmd::display(&test);
    println!("+ GPU_TRACER_REQUIRE_PRIVILEGED=1 {line}");
    let mut child = test.spawn().with_context(|| format!("could not start `{line}`"))?;
    let summary = Arc::new(Mutex::new(Summary::default()));
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let (s1, s2) = (summary.clone(), summary.clone());
    let t1 = std::thread::spawn(move || tee(out, std::io::stdout(), s1));
    let t2 = std::thread::spawn(move || tee(err, std::io::stderr(), s2));
    let status = child.wait().with_context(|| format!("waiting for `{line}`"))?;
    let _ = (t1.join(), t2.join());
    let mut summary = std::mem::take(&mut *summary.lock().unwrap());
    times.lap("host tests (with their build)");

    let mut problems: Vec<String> = unification.into_iter().collect();
    let allowed = if extra_args.is_empty() {
        guest_step(&mut summary, &mut problems, &mut times);
        &[][..]
    } else {
        println!(
            "xtask test: arguments given, so the guest step did not run: the guest-only tests (ALLOWED_IGNORED) \
             stay skipped; `cargo xtask test` without arguments runs them in the 6.1 and 5.10 guests"
        );
        ALLOWED_IGNORED
    };
    if !clippy_ok {
        problems.push(format!("`{cline}` found something (see above)"));
    }
    if !status.success() {
        problems.push(format!("`{line}` failed ({status})"));
    }
    if summary.failed > 0 {
        problems.push(format!("{} test(s) failed", summary.failed));
    }
    let unexpected = summary.unexpected_ignored(allowed);
    if !unexpected.is_empty() {
        problems.push(format!(
            "{} test(s) were ignored and not run anywhere else (the guest-only ones are in \
             xtask/src/test/mod.rs ALLOWED_IGNORED): {}",
            unexpected.len(),
            unexpected.join(", ")
        ));
    }
    if summary.passed + summary.failed == 0 {
        problems.push("no test ran".to_string());
    }
    let devices_after = nvidia_device_nodes();
    if devices_after != devices_before {
        problems.push(format!(
            "the tests changed this machine's NVIDIA device nodes: /dev/nvidia* was {devices_before:?}, is              {devices_after:?} (a test ran NVIDIA's own library as root without the driver?)"
        ));
    } else {
        println!("xtask test: /dev/nvidia* unchanged by the tests ({} nodes)", devices_after.len());
    }
    println!("xtask test: took {}", times.line());
    for p in &problems {
        println!("xtask test: {p}");
    }
    println!("{}", summary.line());
    if !problems.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// `/dev/nvidia*` on this machine: each name with its type, device number and mode.
fn nvidia_device_nodes() -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let mut nodes = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/dev").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("nvidia") {
            continue;
        }
        let what = match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.file_type().is_char_device() => {
                format!("c {}:{} {:o}", libc::major(m.rdev()), libc::minor(m.rdev()), m.mode() & 0o7777)
            }
            Ok(m) if m.is_dir() => format!("dir {:o}", m.mode() & 0o7777),
            Ok(m) => format!("other {:o}", m.mode() & 0o7777),
            Err(err) => format!("unreadable: {err}"),
        };
        nodes.insert(name, what);
    }
    nodes
}

/// The guest step, two kernels under QEMU: Debian's 6.1 with the kernel-module driver double,
/// running the test files whose tests are ignored here ([`kernel_matrix::KMOD_TESTS`]) with
/// `--include-ignored`; and Debian 11's 5.10, the oldest kernel the agent supports, running the
/// files whose code differs there ([`kernel_matrix::OLD_KERNEL_TESTS`]: the cuda family without
/// attach cookies, the chart's capabilities with map memory charged to RLIMIT_MEMLOCK, driver-entry
/// mode on kprobes on the module double built for 5.10, and that double). Their
/// results join `summary`; a file that failed, or a guest that did not finish, is a problem.
fn guest_step(summary: &mut Summary, problems: &mut Vec<String>, times: &mut Times) {
    let guests = [
        (kernel_matrix::Release::Bookworm, kernel_matrix::KMOD_TESTS, true, "the guest-only tests"),
        (kernel_matrix::Release::Bullseye, kernel_matrix::OLD_KERNEL_TESTS, true, "the oldest kernel supported"),
    ];
    for (release, files, kmod, why) in guests {
        let tests: Vec<String> = files.iter().map(|t| t.to_string()).collect();
        let opts = kernel_matrix::Options {
            arch: kernel_matrix::Arch::X86_64,
            release,
            tests: tests.clone(),
            sysctls: Vec::new(),
            kmod,
            bench_driver_entry: false,
            test_args: Vec::new(),
            cpu: None,
        };
        println!(
            "+ cargo xtask kernel-matrix --kernel {} --test {}  ({why}, in Debian's {} kernel under QEMU)",
            release.series(),
            tests.join(" --test "),
            release.series()
        );
        let started = std::time::Instant::now();
        let g = match kernel_matrix::boot(&opts) {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("the {} guest step could not run: {e:#}", release.series()));
                continue;
            }
        };
        let mut guest = Summary::default();
        for f in &g.files {
            print!("{}", f.log);
            f.log.lines().for_each(|l| guest.feed(l));
            let log = g.out.join(format!("{}.log", f.name));
            println!(
                "kernel-matrix: {} {}: {} ({}); log {}",
                g.version,
                f.name,
                if f.ok() { "ok" } else { "FAILED" },
                f.summary(),
                log.display()
            );
            if !f.ok() {
                problems.push(format!(
                    "{} in the {} guest exited {:?}; log {}",
                    f.name,
                    g.version,
                    f.rc,
                    log.display()
                ));
            }
        }
        if let Some(e) = g.unfinished(g.files.len()) {
            problems.push(format!("{e:#}"));
        }
        println!(
            "kernel-matrix: {} guest ran {:.0} s, {:.0} s with the build; {} passed, {} failed there",
            g.version,
            g.guest_s,
            started.elapsed().as_secs_f64(),
            guest.passed,
            guest.failed
        );
        summary.absorb(guest);
        times.lap(&format!("{} guest", release.series()));
    }
}

/// Where the run's time went, phase by phase (CI's budget is spent here: `docs/kernels.md`).
struct Times {
    laps: Vec<(String, f64)>,
    last: std::time::Instant,
}

impl Times {
    fn new() -> Times {
        Times { laps: Vec::new(), last: std::time::Instant::now() }
    }

    /// Ends the phase `name` now; it began where the previous one ended.
    fn lap(&mut self, name: &str) {
        let now = std::time::Instant::now();
        self.laps.push((name.to_string(), (now - self.last).as_secs_f64()));
        self.last = now;
    }

    /// `setup 2 s, build 30 s, ..., all 1200 s`.
    fn line(&self) -> String {
        let all: f64 = self.laps.iter().map(|(_, s)| s).sum();
        let mut parts: Vec<String> = self.laps.iter().map(|(n, s)| format!("{n} {s:.0} s")).collect();
        parts.push(format!("all {all:.0} s"));
        parts.join(", ")
    }
}

mod features;
#[cfg(test)]
mod tests;
