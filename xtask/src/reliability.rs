//! `cargo xtask reliability`: the reliability suite of issue 13 ("keep them fixed"), written to
//! docs/reliability.md.
//!
//! Each row is a scenario the tracer must survive, checked by tests that already run in CI
//! (`cargo xtask test`): the suite is a view of them, not a second copy. The test executables are
//! built once (`cargo test --release --no-run`), then a row's tests run one at a time by exact name
//! (`<executable> --exact NAME --nocapture`, what `cargo test ... -- --exact NAME --nocapture` runs,
//! with `GPU_TRACER_REQUIRE_PRIVILEGED=1`); pass or fail is the exit status (and exactly one test
//! must have passed: a renamed test fails its row rather than passing with nothing run), the
//! figures are the `reliability: key=value ...` lines the test prints. Decoder fuzzing runs the fuzz/ target
//! without cargo-fuzz (the same instrumentation flags, for a bounded time). The soak runs the
//! agent binary under churn for 90 s (an hour with `--long`) and fits a slope to each series it
//! samples ([`crate::soak`]). Scenarios nothing checks yet are rows too, marked "not covered yet",
//! never a pass.
//!
//! Every test's whole output is kept in `<target>/reliability/logs/`.

use crate::{cmd, setup, soak, test::Summary};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Options of `cargo xtask reliability`.
pub struct Options {
    /// Where the report goes (default docs/reliability.md; not written for a partial run).
    pub out: Option<PathBuf>,
    /// Run only the rows whose scenario contains this (case-insensitive).
    pub only: Option<String>,
    /// The long forms (on demand): fuzzing to 10 M executions, the one-hour soak.
    pub long: bool,
    /// The soak's duration in seconds, instead of the form's (90 s; 3600 s with `long`).
    pub soak_seconds: Option<u64>,
}

/// A test binary.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    /// An integration test of the `gpu-tracer-tests` package (`--test NAME`, tests/tests/NAME.rs).
    Root(&'static str),
    /// The unit tests of a package's library (`-p PACKAGE --lib`).
    Lib(&'static str),
}

/// One test, by its exact libtest name.
struct Case {
    target: Target,
    name: &'static str,
}

const fn root(bin: &'static str, name: &'static str) -> Case {
    Case { target: Target::Root(bin), name }
}

/// How a row is checked.
enum Check {
    /// Tests, each run on its own; `figures` says what they print (or why nothing).
    Tests { cases: &'static [Case], no_figures: Option<&'static str> },
    /// The decoder fuzz target in fuzz/ for [`FUZZ_SHORT`], or [`FUZZ_LONG`] and at least
    /// [`FUZZ_LONG_RUNS`] executions.
    Fuzz,
    /// Nothing checks this yet; the text says what would. (Every scenario has a check today; a
    /// new scenario is added as such a row before its test exists.)
    #[allow(dead_code)]
    NotCovered(&'static str),
    /// The soak ([`crate::soak`]): its test for the plan's duration, then the slopes of its samples.
    Soak,
}

/// A row of the suite.
struct Row {
    scenario: &'static str,
    /// What was done, in a sentence or two.
    done: &'static str,
    check: Check,
}

/// How long the short form fuzzes.
const FUZZ_SHORT: Duration = Duration::from_secs(60);
/// How long the long form fuzzes.
const FUZZ_LONG: Duration = Duration::from_secs(600);
/// The fewest executions the long form may make (issue 13: at least 10 M).
const FUZZ_LONG_RUNS: u64 = 10_000_000;
/// A test that runs longer than this is killed and its row fails.
const CASE_TIMEOUT: Duration = Duration::from_secs(600);
/// The fuzz target's corpus, kept between runs (where `cargo fuzz run decode` keeps it too).
const FUZZ_CORPUS: &str = "fuzz/corpus/decode";
/// Where a crashing input is written (cargo-fuzz's place for it).
const FUZZ_ARTIFACTS: &str = "fuzz/artifacts/decode/";

const ROWS: &[Row] = &[
    Row {
        scenario: "SIGKILL at every stage, leftover check",
        done: "The `gpu-tracer agent` binary (driver, lifecycle and cuda families, the last on the fake libcuda) is \
               killed with SIGKILL 18 times, at each stage of its start-up (starting, loading, attaching, scanning \
               /proc) and while running; after each, no BPF program, map or link of it, no pinned file and no \
               tracefs event may be left, and the next agent starts cleanly.",
        check: Check::Tests {
            cases: &[root("sigkill", "sigkill_at_every_stage_leaves_nothing_behind")],
            no_figures: None,
        },
    },
    Row {
        scenario: "workload SIGKILLed holding memory",
        done: "A pod's process allocates 3 GiB (RM_ALLOC and VID_HEAP_CONTROL) and is killed with SIGKILL, \
               freeing and closing nothing; the ledger must release it at the process's exit.",
        check: Check::Tests {
            cases: &[root("agent", "a_process_killed_without_freeing_releases_its_memory_at_exit")],
            no_figures: None,
        },
    },
    Row {
        scenario: "cgroup churn",
        done: "400 pod cgroups (every QoS class and runtime naming) created and removed in 4 batches, 6 alive at \
               once, while 480 workloads start in them, allocate through the driver and libcuda, launch, and end \
               four ways (free then exit, exit holding, SIGKILL, close-all); each cgroup removed right after. \
               Each pod must be named by its path while it lives; after, no row, process, byte, identity, \
               /metrics series or cleaned kernel-map entry of it may stay, and the RSS may not grow.",
        check: Check::Tests {
            cases: &[root("churn", "cgroup_churn_leaves_no_rows_and_names_every_pod")],
            no_figures: None,
        },
    },
    Row {
        scenario: "ioctl flood, stopped consumer",
        done: "A flooder pod makes 500 RM_ALLOCs into a 64 KiB ring buffer the agent does not drain, beside a \
               quiet pod; only the flooder's process, cgroup, GPU and totals may be marked \
               \"records lost since\", and exact again once it has exited.",
        check: Check::Tests {
            cases: &[root("agent", "lost_records_mark_the_ledgers_they_belong_to_inexact")],
            no_figures: None,
        },
    },
    Row {
        scenario: "ioctl flood, count-only records",
        done: "5,000 RM_CONTROLs (count-only) go into an undrained 64 KiB ring while another pod makes 100 \
               allocations of 1 MiB: the count-only records may be lost (counted), the ledger's never; nothing \
               may be marked inexact and the accounting identity must hold.",
        check: Check::Tests {
            cases: &[root("agent", "a_flood_of_count_only_records_does_not_crowd_out_the_ledger")],
            no_figures: None,
        },
    },
    Row {
        scenario: "lost exit record (full ring)",
        done: "3,000 short-lived children fill an undrained 64 KiB ring, so the parent's exit record is lost; \
               the reconciliation against /proc must find the ghost and release its 64 MiB.",
        check: Check::Tests {
            cases: &[root("agent", "a_process_whose_exit_record_was_lost_is_reconciled")],
            no_figures: None,
        },
    },
    Row {
        scenario: "fork storm",
        done: "A process holding nvidiactl and nvidia0 forks 3,000 children that exit at once while the agent \
               drains; no ghost may stay tracked and nothing may be left for reconciliation.",
        check: Check::Tests { cases: &[root("agent", "a_fork_storm_leaves_no_ghost_processes")], no_figures: None },
    },
    Row {
        scenario: "malformed ioctl arguments",
        done: "NULL, unmapped and guard-page argument pointers, a wrong size, an unknown command, a NULL nested \
               pointer and 300 racing rewrites; every call must be a counted, well-formed event.",
        check: Check::Tests {
            cases: &[root("agent", "bad_ioctl_arguments_become_malformed_events_not_crashes")],
            no_figures: None,
        },
    },
    Row {
        scenario: "restart under load",
        done: "Workloads allocate (1 GiB; 1.5 GiB and 2 GiB in two pods) before the agent starts: their fds must \
               be found by the /proc scan, the ledger rows marked \"from before the agent\", and the \
               attribution must take their memory from NVML from the first interval.",
        check: Check::Tests {
            cases: &[
                root("agent", "workload_started_before_the_agent_is_found_by_the_proc_scan"),
                root("attribution", "workloads_running_before_the_agent_get_their_memory_from_nvml_and_are_marked"),
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "spoofed device files",
        done: "uid 65534 mounts its own tmpfs over the device directory and makes 500 RM_ALLOC ioctls on its own \
               `nvidiactl`; a 1:3 character device named nvidia0; a spoofed fd open before the agent starts. \
               Each with a trusted control that must be traced.",
        check: Check::Tests {
            cases: &[
                root("spoofing", "an_unprivileged_users_own_nvidiactl_is_not_traced"),
                root("spoofing", "without_simulated_devices_only_nvidia_character_devices_count"),
                root("spoofing", "a_spoofed_fd_opened_before_the_agent_is_not_seeded"),
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "bad config and flags",
        done: "An unknown nested key, out-of-range values, missing host paths, a libcuda that is not ELF, \
               NaN/inf/negative durations and prices: each refused naming the key and the fix. An attach mode \
               that cannot attach: alive, not ready, the family named.",
        check: Check::Tests {
            cases: &[
                root("cli", "a_misconfiguration_is_refused_naming_the_key_and_the_fix"),
                root("cli", "a_family_that_cannot_attach_makes_the_agent_not_ready"),
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "full stdout or stderr",
        done: "`doctor` with stdout on /dev/full, `doctor` and a 3 s agent run with stderr on /dev/full: an error \
               message or a normal end, never a panic.",
        check: Check::Tests {
            cases: &[root("cli", "a_full_output_is_an_error_message_not_a_panic")],
            no_figures: None,
        },
    },
    Row {
        scenario: "endpoint abuse",
        done: "The agent binary with its default limits: 3,000 slowloris connections from one address (scrapes \
               from another must all be answered), 1,500 from eight addresses (filling the cap: the outage is \
               measured and bounded by the header timeout), twice 1,000 unfinished 400 KB headers (RSS bounded \
               and returned, fds back to the baseline). Unit tests with tight limits: a slow header, a 64 KiB \
               header, connections past the server's and a client's cap, a shutdown with a half-sent request.",
        check: Check::Tests {
            cases: &[
                root("http_abuse", "endpoint_abuse_leaves_rss_bounded"),
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::http::tests::a_slow_header_is_cut_off_at_the_header_timeout",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::http::tests::an_oversized_header_is_refused",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::http::tests::connections_past_the_limit_are_closed_and_counted",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::http::tests::one_client_cannot_take_every_slot",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::http::tests::shutdown_does_not_wait_for_an_unfinished_request",
                },
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "NVML creates no device node",
        done: "In a private mount namespace with an empty /dev and no driver: `doctor` and the agent with \
               `--nvml auto` (library found and named) and `--nvml required`, and `doctor`, the agent and `top` \
               with `--simulated-devices` naming NVIDIA's library (not the double: it used to be initialised), \
               against a control (NVIDIA's nvmlInit_v2 called directly) that does create /dev/nvidiactl. \
               `cargo xtask test` also fails when /dev/nvidia* differs after the suite.",
        check: Check::Tests {
            cases: &[root("nvml_host", "nvml_without_the_driver_creates_no_device_node")],
            no_figures: None,
        },
    },
    Row {
        scenario: "new cgroups named at once",
        done: "A cgroup made after the last walk is resolved by id (open_by_handle_at), 20,000 lookups timed; a \
               container started right after a scan is named by its path in its first snapshot.",
        check: Check::Tests {
            cases: &[
                root("cgroup_paths", "a_cgroup_made_after_a_walk_is_resolved_by_id_at_once"),
                root("cgroup_paths", "a_container_started_right_after_a_scan_is_named_by_path_at_once"),
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "dependency outages",
        done: "NVML answers GPU_IS_LOST mid-run; the Kubernetes API server goes away and comes back; the kubelet's \
               pod-resources socket stops and restarts. Survived, reported, recovered.",
        check: Check::Tests {
            cases: &[
                root("attribution", "nvml_losing_the_gpu_mid_run_is_survived_and_reported"),
                root("kube", "api_server_outage_keeps_the_cache_and_recovers"),
                root("pod_resources", "stopped_kubelet_keeps_the_last_answer_and_a_restart_refreshes"),
            ],
            no_figures: Some("none printed"),
        },
    },
    Row {
        scenario: "API token files",
        done: "An empty token file, one holding only a newline, and one with blanks, as api.token_file and as \
               metrics.token_file (agent) and as a client's --token-file: each refused at start naming the \
               setting (an empty api.token_file used to switch authentication off); the API's bearer check fails \
               closed on an empty token.",
        check: Check::Tests {
            cases: &[
                root("cli", "an_empty_token_file_is_refused_wherever_a_token_is_read"),
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::tests::an_empty_bearer_token_lets_nothing_in",
                },
            ],
            no_figures: Some("none printed"),
        },
    },
    Row {
        scenario: "idle gRPC connections",
        done: "The agent binary serving the API on TCP with a token: 6,000 connections from three addresses that \
               connect and say nothing (the old agent held every one, reached its fd limit, left /readyz \
               unanswered ~30 s). Each address's share held, the rest closed at accept, the held ones closed at \
               the 10 s handshake timeout, /readyz and an authenticated GetStatus from another address answered \
               throughout, fds and RSS back to the baseline, every close counted. Unit test with tight limits: \
               per-address and server caps, idle and non-HTTP/2 connections, a real client served after.",
        check: Check::Tests {
            cases: &[
                root("grpc_abuse", "idle_grpc_connections_are_capped_and_closed_at_the_handshake_timeout"),
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::accept::tests::connections_over_the_caps_and_idle_ones_are_closed_and_counted",
                },
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "SIGINT and SIGTERM under load",
        done: "The binary's `events --json`, `top`, `agent` and `profile` while two workloads flood the fake \
               driver with RM controls and kernel launches: SIGINT at a random moment 20 times (5 per command) and \
               SIGTERM once per command; each must exit 0 the first time, within its grace period. `events` into \
               a pipe nobody reads (its orderly stop cannot finish): ended by the 10 s grace period with status \
               130 and a message; a second SIGINT during a stop ends it at once. (A Ctrl-C that came while the \
               loop was busy outside its `select!` used to be lost: `events --json` ran on for 200 s.) Unit test: \
               a signal raised while nobody waits is seen by every later wait.",
        check: Check::Tests {
            cases: &[
                root("signals", "sigint_and_sigterm_stop_every_command_the_first_time_under_a_flood"),
                root("signals", "a_stop_that_cannot_finish_ends_at_the_grace_period_and_a_second_signal_at_once"),
                Case {
                    target: Target::Lib("tracer-core"),
                    name: "stop::tests::a_signal_is_a_flag_that_stays_set_and_wakes_waiters",
                },
            ],
            no_figures: None,
        },
    },
    Row {
        scenario: "bad OTLP settings",
        done: "A header name with a space, a value with a newline (file and OTEL_EXPORTER_OTLP_HEADERS), a CA file \
               with a garbage PEM body: an error naming the setting from start (it panicked: \"Cannot drop a \
               runtime\") and from doctor's check. A property test: every OTLP setting and OTEL_* variable with \
               hostile text, numbers and files, 256 cases: taken, or refused naming a setting; never a panic.",
        check: Check::Tests {
            cases: &[
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::otlp::tests::a_bad_setting_is_an_error_naming_it_never_a_panic",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::otlp::tests::hostile_otlp_settings_are_refused_by_name_never_a_panic",
                },
            ],
            no_figures: Some("none printed"),
        },
    },
    Row {
        scenario: "hostile text and paths",
        done: "A Prometheus error body with terminal escape sequences reaches stderr escaped; a cgroup path out of \
               the cgroup2 mount (../../../../etc, a file, a symlink off the mount) is no cgroup; a socket in a \
               directory that does not exist is an error, nothing created. A property test: every Subscribe and \
               Profile request field with hostile values, 200 cases: served or INVALID_ARGUMENT, never a panic.",
        check: Check::Tests {
            cases: &[
                root("cli", "hostile_text_from_a_server_is_escaped_on_the_terminal"),
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "enrich::tests::a_cgroup_path_cannot_leave_the_cgroup2_mount",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::tests::a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::tests::hostile_api_requests_are_served_or_refused_never_a_panic",
                },
            ],
            no_figures: Some("none printed"),
        },
    },
    Row {
        scenario: "failures counted as what they are",
        done: "Subscribers that never read: their loss counted before they read (it showed 0), once each. A \
               collector that never answers and one that never accepts, gRPC and HTTP: drops counted as timeout, \
               not export_failed. A --libcuda path that does not exist: the cuda family fails naming it (/readyz, \
               doctor exit 1), not the start (as --help and configuration.md now say). --help to a full stdout: \
               exit 1; api.max_subscribers = 0: refused.",
        check: Check::Tests {
            cases: &[
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::tests::a_subscriber_that_falls_behind_learns_exactly_how_many_it_lost",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::api::tests::a_stalled_subscriber_loses_counted_events_and_others_get_every_one",
                },
                Case {
                    target: Target::Lib("tracer-agent"),
                    name: "export::otlp::tests::a_collector_that_never_answers_costs_timeouts_not_failures",
                },
                root("cli", "a_libcuda_that_is_not_there_fails_the_cuda_family_naming_it"),
                root("cli", "help_that_cannot_be_written_is_an_error"),
                Case {
                    target: Target::Lib("tracer-core"),
                    name: "config::tests::values_are_range_checked_with_the_reason",
                },
            ],
            no_figures: Some("none printed"),
        },
    },
    Row {
        scenario: "decoder fuzzing",
        done: "The `decode` fuzz target (fuzz/) on raw ring-buffer records: never a panic, a malformed ioctl never \
               a success, re-encoding gives the same event. Built with cargo-fuzz's coverage flags, no \
               sanitizer; the corpus is kept in fuzz/corpus/decode (not seeded by the suite).",
        check: Check::Fuzz,
    },
    Row {
        scenario: "one-hour soak",
        done: "The `gpu-tracer agent` binary on a simulated node (fake driver, NVML following it, API server and \
               kubelet listing the pods) under steady churn: a new pod every 250 ms, 4 alive, each allocating, \
               launching and ending; its RSS, fds, threads, table sizes (/metrics) and kernel-map occupancy \
               sampled, a least-squares slope fitted to each after a warm-up; once the churn stops, all back to \
               the baseline.",
        check: Check::Soak,
    },
];

/// What became of a row.
enum Outcome {
    Passed,
    Failed(String),
    NotCovered(String),
}

/// A finished row.
struct Done {
    row: &'static Row,
    /// Figures per test (`test name`, its `key=value` lines joined), or the fuzz run's.
    figures: Vec<(String, String)>,
    outcome: Outcome,
    elapsed: Duration,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let rows: Vec<&'static Row> = match &opts.only {
        Some(s) => ROWS.iter().filter(|r| r.scenario.to_lowercase().contains(&s.to_lowercase())).collect(),
        None => ROWS.iter().collect(),
    };
    if rows.is_empty() {
        bail!(
            "no row's scenario contains {:?}; the rows are: {}",
            opts.only.as_deref().unwrap_or(""),
            ROWS.iter().map(|r| r.scenario).collect::<Vec<_>>().join(", ")
        );
    }
    let env = setup::run_setup()?;
    let root = cmd::workspace_root();
    let target = target_dir(&env)?;
    let logs = target.join("reliability").join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let built = build(&env, &rows, &root, &target)?;

    let started = Instant::now();
    let mut done = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        eprint!("[reliability] {}/{} {} ... ", i + 1, rows.len(), row.scenario);
        let t = Instant::now();
        let (figures, outcome) = match &row.check {
            Check::Tests { cases, .. } => run_cases(&built, cases, &logs),
            Check::Fuzz => fuzz(built.fuzz.as_ref(), &root, &target, opts.long),
            Check::NotCovered(why) => (Vec::new(), Outcome::NotCovered(why.to_string())),
            Check::Soak => run_soak(&built, &logs, &soak::Plan::new(opts.long, opts.soak_seconds)),
        };
        let elapsed = t.elapsed();
        let word = match &outcome {
            Outcome::Passed => "ok".to_string(),
            Outcome::Failed(why) => format!("FAILED: {why}"),
            Outcome::NotCovered(_) => "not covered yet".to_string(),
        };
        eprintln!("{word} ({:.1} s)", elapsed.as_secs_f64());
        done.push(Done { row, figures, outcome, elapsed });
    }

    let failed: Vec<&str> =
        done.iter().filter(|d| matches!(d.outcome, Outcome::Failed(_))).map(|d| d.row.scenario).collect();
    let partial = opts.only.is_some();
    let out = match (&opts.out, partial) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => Some(root.join("docs").join("reliability.md")),
        (None, true) => None,
    };
    let doc = report(&done, &RunInfo::gather(&root, opts, started.elapsed()));
    match out {
        Some(path) => {
            std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("[reliability] wrote {}", path.display());
        }
        None => {
            eprintln!("[reliability] a partial run (--only): docs/reliability.md left as it is; --out PATH writes it")
        }
    }
    eprintln!("[reliability] test logs: {}", logs.display());
    if !failed.is_empty() {
        bail!("{} of {} rows failed: {}", failed.len(), done.len(), failed.join(", "));
    }
    Ok(())
}

/// What [`build`] made.
struct Built {
    /// Each test binary's executable and the directory `cargo test` would run it in (its package's).
    executables: Vec<(Target, PathBuf, PathBuf)>,
    /// The fuzz target's directory, or why it did not build; `None` when its row does not run.
    fuzz: Option<Result<PathBuf, String>>,
}

/// Builds everything the rows need once, up front: the binaries the root tests run (as
/// `cargo xtask test` does), the test executables, and the fuzz target if its row runs (if it
/// fails to build, that row fails and the others still run).
///
/// The rows then run these executables themselves, not `cargo test`: each `cargo test -p ...`
/// selection unifies features its own way, so alternating `-p tracer-agent` and
/// `-p gpu-tracer-tests` rebuilds fake-nvml and the tests crate each time (over a minute here), and a
/// cargo run elsewhere in the tree would hold the build lock in the middle of a row. A row's time is
/// its tests' time.
fn build(env: &setup::BuildEnv, rows: &[&Row], root: &Path, target: &Path) -> anyhow::Result<Built> {
    let (mut root_bins, mut libs) = (Vec::new(), Vec::new());
    for row in rows {
        let targets: Vec<Target> = match &row.check {
            Check::Tests { cases, .. } => cases.iter().map(|c| c.target).collect(),
            Check::Soak => vec![Target::Root(soak::TEST_BIN)],
            _ => Vec::new(),
        };
        for t in targets {
            match t {
                Target::Root(b) if !root_bins.contains(&b) => root_bins.push(b),
                Target::Lib(p) if !libs.contains(&p) => libs.push(p),
                _ => {}
            }
        }
    }
    let t = Instant::now();
    let fuzz = rows.iter().any(|r| matches!(r.check, Check::Fuzz)).then(|| {
        eprintln!("[reliability] building the fuzz target (log: target/reliability/logs/fuzz-build.log)");
        build_fuzz(env, root, target).map_err(|e| format!("{e:#}"))
    });
    let mut executables = Vec::new();
    if root_bins.is_empty() && libs.is_empty() {
        return Ok(Built { executables, fuzz });
    }
    let mut b = env.cargo();
    b.args(["build", "--release"]);
    cmd::run(&mut b)?;
    // The libraries' unit tests first, the root tests last: the last selection's fake-nvml is the
    // one left in target/release for the root tests to load.
    for p in &libs {
        let mut b = env.cargo();
        b.args(["test", "--release", "--no-run", "-p", p, "--lib"]);
        for (kind, name, exe, dir) in test_executables(&mut b)? {
            if kind == "lib" && name == p.replace('-', "_") {
                executables.push((Target::Lib(p), exe, dir));
            }
        }
    }
    if !root_bins.is_empty() {
        let mut b = env.cargo();
        b.args(["test", "--release", "--no-run", "-p", "gpu-tracer-tests"]);
        for bin in &root_bins {
            b.args(["--test", bin]);
        }
        for (kind, name, exe, dir) in test_executables(&mut b)? {
            if let Some(bin) = root_bins.iter().find(|b| kind == "test" && **b == name) {
                executables.push((Target::Root(bin), exe, dir));
            }
        }
    }
    for t in root_bins.iter().map(|b| Target::Root(b)).chain(libs.iter().map(|p| Target::Lib(p))) {
        if !executables.iter().any(|(e, _, _)| *e == t) {
            bail!("cargo built no test executable for {t:?}");
        }
    }
    eprintln!("[reliability] build done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(Built { executables, fuzz })
}

/// Runs `cargo test --no-run` (progress on stderr) and returns its test executables:
/// (target kind, target name, executable, package directory).
pub(crate) fn test_executables(cargo: &mut Command) -> anyhow::Result<Vec<(String, String, PathBuf, PathBuf)>> {
    cargo.arg("--message-format=json-render-diagnostics").stdout(Stdio::piped()).stderr(Stdio::inherit());
    let line = cmd::display(cargo);
    println!("+ {line}");
    let out = cargo.output().with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({})", out.status);
    }
    Ok(artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// The test executables in cargo's JSON messages.
fn artifacts(json_lines: &str) -> Vec<(String, String, PathBuf, PathBuf)> {
    let mut v = Vec::new();
    for l in json_lines.lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(l) else { continue };
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(name), Some(manifest)) =
            (m["executable"].as_str(), m["target"]["name"].as_str(), m["manifest_path"].as_str())
        else {
            continue;
        };
        let kinds = m["target"]["kind"].as_array().cloned().unwrap_or_default();
        let kind = if kinds.iter().any(|k| k == "test") { "test" } else { "lib" };
        let dir = Path::new(manifest).parent().map(Path::to_path_buf).unwrap_or_default();
        v.push((kind.to_string(), name.to_string(), PathBuf::from(exe), dir));
    }
    v
}

/// The `cargo test` command line that runs one case, for people (the suite runs the executable).
fn cargo_test_line(case: &Case) -> String {
    let target = match case.target {
        Target::Root(bin) => format!("-p gpu-tracer-tests --test {bin}"),
        Target::Lib(pkg) => format!("-p {pkg} --lib"),
    };
    format!("GPU_TRACER_REQUIRE_PRIVILEGED=1 cargo test --release {target} -- --exact {} --nocapture", case.name)
}

/// Runs a row's tests one by one; the row passes if each of them does.
fn run_cases(built: &Built, cases: &[Case], logs: &Path) -> (Vec<(String, String)>, Outcome) {
    let mut figures = Vec::new();
    let mut failures = Vec::new();
    for case in cases {
        let short = case.name.rsplit("::").next().unwrap_or(case.name);
        let log = logs.join(format!("{short}.log"));
        let Some((_, exe, dir)) = built.executables.iter().find(|(t, _, _)| *t == case.target) else {
            failures.push(format!("{short} (not built)"));
            continue;
        };
        // As `cargo test` runs it: in the package's directory.
        let mut c = Command::new(exe);
        c.args(["--exact", case.name, "--nocapture", "--test-threads=1"])
            .current_dir(dir)
            .env("GPU_TRACER_REQUIRE_PRIVILEGED", "1");
        let _ = std::fs::write(&log, format!("# {}\n", cargo_test_line(case)));
        match run_logged(&mut c, &log, CASE_TIMEOUT) {
            Ok((status, text)) => {
                let lines = figure_lines(&text);
                if !lines.is_empty() {
                    figures.push((short.to_string(), lines.join("; ")));
                }
                let mut summary = Summary::default();
                text.lines().for_each(|l| summary.feed(l));
                let verdict = match status {
                    None => Some(format!("killed after {} s", CASE_TIMEOUT.as_secs())),
                    Some(st) if !st.success() => Some(with_panic(st.to_string(), &text)),
                    Some(_) if summary.passed != 1 || summary.failed != 0 => {
                        Some(format!("{} passed, {} failed: is the name still right?", summary.passed, summary.failed))
                    }
                    Some(_) => None,
                };
                if let Some(why) = verdict {
                    eprintln!();
                    eprintln!("[reliability] {short} failed ({why}); the end of {}:", log.display());
                    for l in tail(&text, 25) {
                        eprintln!("    {l}");
                    }
                    failures.push(format!("{short} ({why})"));
                }
            }
            Err(e) => failures.push(format!("{short} ({e:#})")),
        }
    }
    let outcome = if failures.is_empty() { Outcome::Passed } else { Outcome::Failed(failures.join("; ")) };
    (figures, outcome)
}

/// The soak row: its test executable for `plan`, then the slopes ([`soak::run`]).
fn run_soak(built: &Built, logs: &Path, plan: &soak::Plan) -> (Vec<(String, String)>, Outcome) {
    let target = Target::Root(soak::TEST_BIN);
    let Some((_, exe, dir)) = built.executables.iter().find(|(t, _, _)| *t == target) else {
        return (Vec::new(), Outcome::Failed(format!("{} (not built)", soak::TEST)));
    };
    let (figures, failure) = soak::run(exe, dir, logs, plan);
    (figures, failure.map_or(Outcome::Passed, Outcome::Failed))
}

/// Runs `cmd` in its own process group with stdout and stderr appended to `log`; kills the group after
/// `timeout`. Returns the exit status (`None` when killed) and the log's text.
pub(crate) fn run_logged(
    cmd: &mut Command,
    log: &Path,
    timeout: Duration,
) -> anyhow::Result<(Option<ExitStatus>, String)> {
    let line = cmd::display(cmd);
    let file =
        File::options().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
    let mut header = file.try_clone()?;
    std::io::Write::write_all(&mut header, format!("+ {line}\n").as_bytes())?;
    cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file).process_group(0);
    let mut child = cmd.spawn().with_context(|| format!("could not start `{line}`"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            // SAFETY: kill has no memory effects; the group is the child's own (process_group(0)).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = String::from_utf8_lossy(&std::fs::read(log)?).into_owned();
    Ok((status, text))
}

/// The `key=value ...` parts of the `reliability:` lines a test printed. With `--nocapture` a line
/// may follow libtest's `test NAME ... ` on the same line, so the marker is looked for anywhere.
pub(crate) fn figure_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.split_once("reliability: ").map(|(_, f)| f.trim()))
        .filter(|f| !f.is_empty())
        .collect()
}

/// `why`, followed by what the test's first panic said (the line after libtest's `panicked at`),
/// so that a failed row says what failed.
pub(crate) fn with_panic(why: String, text: &str) -> String {
    let mut lines = text.lines();
    match lines.by_ref().find(|l| l.contains("' panicked at ") || l.contains(") panicked at ")).and(lines.next()) {
        Some(msg) if !msg.trim().is_empty() => format!("{why}: {}", msg.trim()),
        _ => why,
    }
}

pub(crate) fn tail(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// The decoder fuzz row: fuzzes on the kept corpus for [`FUZZ_SHORT`] or, with `--long`, for
/// [`FUZZ_LONG`], failing under [`FUZZ_LONG_RUNS`] executions. `bin` is what [`build_fuzz`] gave.
///
/// The corpus is not seeded here: fuzz/'s `seed-corpus` writer cannot be linked with the
/// coverage flags (only libFuzzer defines the `__sanitizer_cov_*` hooks, and it brings its own
/// `main`), so it needs a second, uninstrumented build of tracer-core; an empty corpus grows from
/// libFuzzer's own inputs and is kept from run to run.
fn fuzz(
    bin: Option<&Result<PathBuf, String>>,
    root: &Path,
    target: &Path,
    long: bool,
) -> (Vec<(String, String)>, Outcome) {
    let bin = match bin {
        Some(Ok(bin)) => bin,
        Some(Err(why)) => return (Vec::new(), Outcome::Failed(why.clone())),
        None => return (Vec::new(), Outcome::Failed("the fuzz target was not built".into())),
    };
    match fuzz_inner(bin, root, target, long) {
        Ok((figures, None)) => (vec![(String::new(), figures)], Outcome::Passed),
        Ok((figures, Some(why))) => (vec![(String::new(), figures)], Outcome::Failed(why)),
        Err(e) => (Vec::new(), Outcome::Failed(format!("{e:#}"))),
    }
}

/// cargo-fuzz's instrumentation (`cargo fuzz build -s none`).
const FUZZ_RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth --cfg fuzzing \
    -Cdebug-assertions -Coverflow-checks";

/// Builds fuzz/'s `decode` target as cargo-fuzz would (coverage instrumentation, no sanitizer)
/// and returns the directory it is in.
///
/// cargo-fuzz is not needed (nor installed here): `cargo fuzz build -s none` is `cargo build` with
/// [`FUZZ_RUSTFLAGS`] and an explicit `--target` (so build scripts stay uninstrumented). The build
/// happens in a generated copy of fuzz/'s manifest under `<target>/reliability/fuzz`, with the
/// workspace's Cargo.lock, so that the fuzzed decoder is built from the versions the tests use and
/// fuzz/'s own lock file is never rewritten.
fn build_fuzz(env: &setup::BuildEnv, root: &Path, target: &Path) -> anyhow::Result<PathBuf> {
    let ws = target.join("reliability").join("fuzz");
    std::fs::create_dir_all(&ws)?;
    let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).context("reading fuzz/Cargo.toml")?;
    std::fs::write(ws.join("Cargo.toml"), absolute_paths(&manifest, &root.join("fuzz")))?;
    std::fs::copy(root.join("Cargo.lock"), ws.join("Cargo.lock")).context("copying Cargo.lock")?;
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let fuzz_target = ws.join("target");

    // `rustup run <toolchain> cargo` with the environment setup gives builds (PATH, RUSTC_BOOTSTRAP).
    let proto = env.cargo();
    let rustup = cmd::cargo_home().join("bin").join("rustup");
    let mut b = Command::new(if rustup.is_file() { rustup } else { PathBuf::from("rustup") });
    for (k, v) in proto.get_envs() {
        match v {
            Some(v) => b.env(k, v),
            None => b.env_remove(k),
        };
    }
    b.args(["run", &env.ebpf_toolchain, "cargo", "build", "--release", "--bin", "decode", "--target", &triple])
        .arg("--manifest-path")
        .arg(ws.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&fuzz_target)
        .env("RUSTFLAGS", FUZZ_RUSTFLAGS.split_whitespace().collect::<Vec<_>>().join(" "))
        .current_dir(&ws);
    let log = target.join("reliability").join("logs").join("fuzz-build.log");
    std::fs::write(&log, "")?;
    let (status, text) = run_logged(&mut b, &log, Duration::from_secs(3600))?;
    if status.is_none_or(|s| !s.success()) {
        for l in tail(&text, 25) {
            eprintln!("    {l}");
        }
        bail!("building the fuzz target failed (see {})", log.display());
    }
    Ok(fuzz_target.join(&triple).join("release"))
}

/// Runs the built `decode` target on the kept corpus: (figures, why it failed).
fn fuzz_inner(bin: &Path, root: &Path, target: &Path, long: bool) -> anyhow::Result<(String, Option<String>)> {
    let corpus = root.join(FUZZ_CORPUS);
    std::fs::create_dir_all(&corpus)?;
    let before = std::fs::read_dir(&corpus)?.count();
    std::fs::create_dir_all(root.join(FUZZ_ARTIFACTS))?;

    let mut f = Command::new(bin.join("decode"));
    f.arg(&corpus).arg(format!("-artifact_prefix={}", root.join(FUZZ_ARTIFACTS).display())).arg("-print_final_stats=1");
    let time = if long { FUZZ_LONG } else { FUZZ_SHORT };
    f.arg(format!("-max_total_time={}", time.as_secs()));
    let limit = time + Duration::from_secs(120);
    let log = target.join("reliability").join("logs").join("fuzz-decode.log");
    std::fs::write(&log, "")?;
    let (status, text) = run_logged(&mut f, &log, limit)?;
    let after = std::fs::read_dir(&corpus)?.count();
    let stats = FuzzStats::parse(&text);
    let mut figures = format!(
        "executions={} exec_per_s={} corpus_files={after} (was {before}) coverage_edges={} features={} peak_rss_mb={}",
        stats.executions.map_or("?".into(), |n| n.to_string()),
        stats.exec_per_s.map_or("?".into(), |n| n.to_string()),
        stats.cov.map_or("?".into(), |n| n.to_string()),
        stats.ft.map_or("?".into(), |n| n.to_string()),
        stats.peak_rss_mb.map_or("?".into(), |n| n.to_string()),
    );
    let failure = match status {
        None => Some(format!("killed after {} s", limit.as_secs())),
        Some(st) if !st.success() => {
            for l in tail(&text, 25) {
                eprintln!("    {l}");
            }
            Some(format!("the fuzzer stopped ({st}): a crash is in {FUZZ_ARTIFACTS}, see {}", log.display()))
        }
        Some(_) if long && stats.executions.is_none_or(|n| n < FUZZ_LONG_RUNS) => {
            Some(format!("fewer than {} M executions", FUZZ_LONG_RUNS / 1_000_000))
        }
        Some(_) => None,
    };
    if failure.is_none() {
        figures.push_str(" crashes=0");
    }
    Ok((figures, failure))
}

/// `path = "relative"` in a manifest made absolute against `base` (fuzz/'s manifest, moved).
fn absolute_paths(manifest: &str, base: &Path) -> String {
    let mut out = String::with_capacity(manifest.len());
    let mut rest = manifest;
    const KEY: &str = "path = \"";
    while let Some(i) = rest.find(KEY) {
        let (head, tail) = rest.split_at(i + KEY.len());
        out.push_str(head);
        let end = tail.find('"').unwrap_or(tail.len());
        let p = &tail[..end];
        if Path::new(p).is_absolute() {
            out.push_str(p);
        } else {
            // Lexically, `a/fuzz/../b` as `a/b`: cargo names a path package by its path.
            let mut abs = PathBuf::new();
            for c in base.join(p).components() {
                match c {
                    std::path::Component::ParentDir => {
                        abs.pop();
                    }
                    std::path::Component::CurDir => {}
                    c => abs.push(c),
                }
            }
            out.push_str(&abs.display().to_string());
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// What libFuzzer said at the end.
#[derive(Debug, Default, PartialEq, Eq)]
struct FuzzStats {
    executions: Option<u64>,
    exec_per_s: Option<u64>,
    cov: Option<u64>,
    ft: Option<u64>,
    peak_rss_mb: Option<u64>,
}

impl FuzzStats {
    /// From `-print_final_stats=1` (`stat::number_of_executed_units: N` ...) and the last status
    /// line (`#N DONE cov: C ft: F ...`, or any `#N ...` line before it).
    fn parse(text: &str) -> FuzzStats {
        let mut s = FuzzStats::default();
        let stat = |l: &str, k: &str| l.strip_prefix(k).and_then(|v| v.trim().parse::<u64>().ok());
        for l in text.lines() {
            let l = l.trim();
            if let Some(n) = stat(l, "stat::number_of_executed_units:") {
                s.executions = Some(n);
            } else if let Some(n) = stat(l, "stat::average_exec_per_sec:") {
                s.exec_per_s = Some(n);
            } else if let Some(n) = stat(l, "stat::peak_rss_mb:") {
                s.peak_rss_mb = Some(n);
            } else if l.starts_with('#') {
                let words: Vec<&str> = l.split_whitespace().collect();
                let after = |k: &str| words.windows(2).find(|w| w[0] == k).and_then(|w| w[1].parse::<u64>().ok());
                s.cov = after("cov:").or(s.cov);
                s.ft = after("ft:").or(s.ft);
            }
        }
        s
    }
}

/// The cargo target directory (honours `CARGO_TARGET_DIR` and cargo config).
fn target_dir(env: &setup::BuildEnv) -> anyhow::Result<PathBuf> {
    let mut meta = env.cargo();
    meta.args(["metadata", "--format-version", "1", "--no-deps"]);
    let v: serde_json::Value =
        serde_json::from_str(&cmd::output(&mut meta)?).context("parsing `cargo metadata` output")?;
    v["target_directory"].as_str().map(PathBuf::from).context("`cargo metadata` names no target_directory")
}

/// Where and how the suite ran, for the report's header.
struct RunInfo {
    date: String,
    kernel: String,
    cpus: usize,
    commit: String,
    form: String,
    only: Option<String>,
    total: Duration,
}

impl RunInfo {
    fn gather(root: &Path, opts: &Options, total: Duration) -> RunInfo {
        let date = cmd::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or("?".into(), |s| s.trim().to_string());
        let git = |args: &[&str]| cmd::output(Command::new("git").arg("-C").arg(root).args(args));
        let commit = match git(&["rev-parse", "--short", "HEAD"]) {
            Ok(c) => {
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_ok_and(|s| !s.trim().is_empty());
                format!("{}{}", c.trim(), if dirty { " with uncommitted changes" } else { "" })
            }
            Err(_) => "?".into(),
        };
        RunInfo {
            date,
            kernel,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            commit,
            form: match (opts.long, opts.soak_seconds) {
                (true, None) => "long forms (--long)".into(),
                (false, None) => "short forms".into(),
                (long, Some(n)) => format!("{} forms, a {n} s soak", if long { "long" } else { "short" }),
            },
            only: opts.only.clone(),
            total,
        }
    }
}

/// A table cell: no `|` or line break may end the cell early.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// docs/reliability.md.
fn report(done: &[Done], info: &RunInfo) -> String {
    let count = |f: fn(&Outcome) -> bool| done.iter().filter(|d| f(&d.outcome)).count();
    let passed = count(|o| matches!(o, Outcome::Passed));
    let failed = count(|o| matches!(o, Outcome::Failed(_)));
    let not_covered = count(|o| matches!(o, Outcome::NotCovered(_)));
    let mut s = String::new();
    s.push_str("# Reliability\n\n");
    s.push_str(
        "<!-- Generated by `cargo xtask reliability` (xtask/src/reliability.rs). Do not edit: regenerate. -->\n\n",
    );
    s.push_str(
        "The scenarios of issue 13 (\"keep them fixed\") that the tracer must survive, each checked by tests that \
         also run in CI (`cargo xtask test`). Regenerate this file with `cargo xtask reliability` (short forms; \
         `--long` for the long forms, `--only TEXT` for some rows, `--out PATH` to write elsewhere). A row's \
         tests run one at a time by exact name, as root, with `GPU_TRACER_REQUIRE_PRIVILEGED=1`; the result is \
         their exit status, the figures are the `reliability:` lines they print. A scenario nothing checks yet \
         is a row too, marked *not covered yet*. The soak's figures are the slopes this tool fits to what its \
         test samples.\n\n",
    );
    let _ = writeln!(
        s,
        "Last run: {}, kernel {}, {} CPUs, commit {}, {}{}; {passed} passed, {failed} failed, {not_covered} not \
         covered yet; {:.0} s in all (the build excluded).\n",
        info.date,
        info.kernel,
        info.cpus,
        info.commit,
        info.form,
        info.only.as_deref().map(|o| format!(", only rows matching {o:?}")).unwrap_or_default(),
        info.total.as_secs_f64()
    );
    s.push_str("| scenario | what was done | figures | result | time |\n| --- | --- | --- | --- | --- |\n");
    for d in done {
        let figures = if d.figures.is_empty() {
            match &d.row.check {
                Check::Tests { no_figures: Some(why), .. } => (*why).to_string(),
                _ => "—".into(),
            }
        } else {
            d.figures
                .iter()
                .map(|(test, f)| if test.is_empty() { f.clone() } else { format!("`{test}`: {f}") })
                .collect::<Vec<_>>()
                .join("<br>")
        };
        let tests = match &d.row.check {
            Check::Tests { cases, .. } if cases.len() > 1 => format!(" ({} tests)", cases.len()),
            _ => String::new(),
        };
        let result = match &d.outcome {
            Outcome::Passed => format!("pass{tests}"),
            Outcome::Failed(why) => format!("**FAIL**: {why}"),
            Outcome::NotCovered(why) => format!("not covered yet: {why}"),
        };
        let time = match d.outcome {
            Outcome::Passed | Outcome::Failed(_) => format!("{:.1} s", d.elapsed.as_secs_f64()),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {time} |",
            cell(d.row.scenario),
            cell(d.row.done),
            cell(&figures),
            cell(&result)
        );
    }
    s.push_str("\n## Running one row by hand\n\n");
    s.push_str("The tests behind each row, as `cargo xtask reliability` runs them (as root):\n\n```sh\n");
    for d in done {
        match &d.row.check {
            Check::Tests { cases, .. } => {
                let _ = writeln!(s, "# {}", d.row.scenario);
                for c in *cases {
                    let _ = writeln!(s, "{}", cargo_test_line(c));
                }
            }
            Check::Soak => {
                let _ = writeln!(
                    s,
                    "# {} (the samples only; `cargo xtask reliability --only soak` fits the slopes)",
                    d.row.scenario
                );
                let _ = writeln!(s, "{}", soak::cargo_test_line(soak::LONG_S));
            }
            _ => {}
        }
    }
    s.push_str("```\n\n");
    let _ = write!(
        s,
        "Decoder fuzzing without the suite: `cargo +nightly fuzz run decode` in fuzz/ (needs cargo-fuzz), or \
         `cargo xtask reliability --only fuzz` ({} s; `--long`: {} s). Each test's whole output is kept in \
         `target/reliability/logs/`.\n\n",
        FUZZ_SHORT.as_secs(),
        FUZZ_LONG.as_secs()
    );
    s.push_str("## Long forms (on demand, `--long`)\n\n");
    let _ = writeln!(
        s,
        "- decoder fuzzing: {} s on the kept corpus, failing under {} M executions (issue 13's bar; the short \
         form fuzzes for {} s and fails only on a crash);",
        FUZZ_LONG.as_secs(),
        FUZZ_LONG_RUNS / 1_000_000,
        FUZZ_SHORT.as_secs()
    );
    let _ = writeln!(
        s,
        "- the soak: {} s (the short form runs {} s, and CI's `cargo xtask test` {} s of it as a leftover check), \
         fitted after a {:.0} s warm-up, with a sample every {:.0} s; `--soak-seconds N` sets another length;",
        soak::LONG_S,
        soak::SHORT_S,
        soak::CI_S,
        soak::Plan::new(true, None).warmup_s,
        soak::Plan::new(true, None).every_s
    );
    s.push_str("- every other row has one form, the test as CI runs it.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_found_after_libtests_prefix_too() {
        let text = "running 1 test\ntest x ... reliability: a=1 b=2\nreliability: c=3\nnoise\nreliability: \n";
        assert_eq!(figure_lines(text), ["a=1 b=2", "c=3"]);
    }

    #[test]
    fn fuzz_stats_come_from_the_final_stats_and_the_last_status_line() {
        let text = "#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                    #524288\tpulse  cov: 812 ft: 2900 corp: 300/9Kb lim: 4 exec/s: 8738 rss: 60Mb\n\
                    #600000\tDONE   cov: 820 ft: 2950 corp: 301/9Kb lim: 4 exec/s: 10000 rss: 61Mb\n\
                    Done 600000 runs in 60 second(s)\n\
                    stat::number_of_executed_units: 600000\n\
                    stat::average_exec_per_sec:     10000\n\
                    stat::new_units_added:          12\n\
                    stat::slowest_unit_time_sec:    0\n\
                    stat::peak_rss_mb:              61\n";
        assert_eq!(
            FuzzStats::parse(text),
            FuzzStats {
                executions: Some(600_000),
                exec_per_s: Some(10_000),
                cov: Some(820),
                ft: Some(2950),
                peak_rss_mb: Some(61)
            }
        );
    }

    #[test]
    fn relative_manifest_paths_become_absolute() {
        let m = "tracer-core = { path = \"../tracer-user/core\", features = [\"encode\"] }\n\
                 [[bin]]\nname = \"decode\"\npath = \"fuzz_targets/decode.rs\"\nx = { path = \"/abs\" }\n";
        let out = absolute_paths(m, Path::new("/w/fuzz"));
        assert_eq!(
            out,
            "tracer-core = { path = \"/w/tracer-user/core\", features = [\"encode\"] }\n\
             [[bin]]\nname = \"decode\"\npath = \"/w/fuzz/fuzz_targets/decode.rs\"\nx = { path = \"/abs\" }\n"
        );
    }

    #[test]
    fn rows_are_well_formed() {
        for r in ROWS {
            assert!(!r.scenario.is_empty() && r.done.ends_with('.'), "{}", r.scenario);
            if let Check::Tests { cases, .. } = &r.check {
                assert!(!cases.is_empty(), "{}", r.scenario);
            }
        }
        let mut names: Vec<&str> = ROWS.iter().map(|r| r.scenario).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ROWS.len(), "scenarios are unique (--only picks by them)");
    }

    #[test]
    fn test_executables_are_read_from_cargos_messages() {
        let json = r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"agent"},"profile":{"test":true},"executable":"/w/target/release/deps/agent-1"}
{"reason":"compiler-artifact","manifest_path":"/w/tracer-user/agent/Cargo.toml","target":{"kind":["lib"],"name":"tracer_agent"},"profile":{"test":true},"executable":"/w/target/release/deps/tracer_agent-2"}
{"reason":"compiler-artifact","manifest_path":"/w/tracer-user/agent/Cargo.toml","target":{"kind":["lib"],"name":"tracer_agent"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["bin"],"name":"nv-workload"},"profile":{"test":false},"executable":"/w/target/release/nv-workload"}
{"reason":"build-finished","success":true}
not json"#;
        let got = artifacts(json);
        let want = |k: &str, n: &str, e: &str, d: &str| (k.into(), n.into(), PathBuf::from(e), PathBuf::from(d));
        assert_eq!(
            got,
            [
                want("test", "agent", "/w/target/release/deps/agent-1", "/w/tests"),
                want("lib", "tracer_agent", "/w/target/release/deps/tracer_agent-2", "/w/tracer-user/agent"),
            ]
        );
    }

    #[test]
    fn a_failure_says_what_panicked() {
        let text = "running 1 test\ntest x ... \nthread 'x' (12) panicked at tests/tests/churn.rs:3:5:\nwhat stays: 3 rows\n\
                    stack backtrace:\n";
        assert_eq!(with_panic("exit status: 101".into(), text), "exit status: 101: what stays: 3 rows");
        assert_eq!(with_panic("exit status: 101".into(), "no panic here\n"), "exit status: 101");
    }

    #[test]
    fn a_cell_cannot_break_the_table() {
        assert_eq!(cell("a | b\nc"), "a \\| b c");
    }
}
