//! `cargo xtask <command>`: setting up a machine, building and testing gpu-tracer.
//!
//! The alias lives in `.cargo/config.toml`. Every command that builds runs `setup` first, so a
//! fresh Debian 12 machine (as root) needs nothing but rustup and this repository.

mod apt_sources;
mod arm64;
mod bench;
mod build;
mod cmd;
#[cfg(test)]
mod crate_graph;
mod gpu_check;
mod image;
mod kernel_matrix;
mod kmod;
mod reliability;
mod setup;
mod sim;
mod soak;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "gpu-tracer project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what this machine lacks for building and testing (idempotent; fast when done).
    Setup,
    /// `setup`, then `cargo build --release` (the eBPF programs are built by tracer-agent's build.rs).
    Build,
    /// `setup`, then every test (`cargo test --release`), privileged tests included, with a summary.
    Test {
        /// Extra arguments for `cargo test` (e.g. `-p tracer-agent`, or `-- <filter>`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `setup`, release build, then a simulated GPU node (fake driver, three pods) watched by
    /// `gpu-tracer top`. Arguments go to `gpu-tracer-sim` (e.g. `--duration 60`; see `-- --help`).
    Sim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `setup`, then `cargo run --release -p gpu-tracer-bench -- --write docs/benchmarks.md [ARGS]`.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The container image, without a registry or a daemon: `setup`, the release build (unless
    /// --binary), then the Dockerfile built with buildah over minimal Debian root file systems made
    /// by mmdebstrap, written as `target/image/gpu-tracer-VERSION.oci.tar`.
    ///
    /// The root file systems are cached under target/image/base/ (the first run spends about a
    /// minute on them, later runs about 15 s in all). The image is checked before it is written:
    /// `gpu-tracer --version` and `gpu-tracer doctor` run inside it as its default user (65532) and
    /// as the chart's DaemonSet runs it (uid 0 with its four capabilities). At the end it prints the
    /// sizes, how to load the archive into containerd, CRI-O, kind or Docker, and the `helm install`
    /// that uses it. Needs root. See docs/image.md.
    Image {
        /// Pack this gpu-tracer binary instead of building one (e.g. target/release/gpu-tracer).
        #[arg(long, value_name = "PATH")]
        binary: Option<std::path::PathBuf>,
        /// Write the archive into DIR instead of target/image/.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
        /// Tag the image TAG instead of the binary's version (the chart's default tag is its appVersion).
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
        /// Make the cached root file systems again, with the newest packages of the mirror (security
        /// updates of libc6 reach the image this way).
        #[arg(long)]
        refresh_base: bool,
    },
    /// The root end-to-end tests on a second kernel: Debian's packaged kernel (6.1 on bookworm)
    /// booted under QEMU (TCG) with this machine's root shared read-only, the test executables built
    /// here run inside, one after the other. Kernel, modules and initramfs are cached in
    /// /opt/gpu-tracer/qemu; logs in target/kernel-matrix/VERSION/. Needs root. Exits non-zero if a
    /// test file failed there.
    KernelMatrix {
        /// The guest's architecture: x86_64 (this machine's; default) or arm64 (cross-built,
        /// Debian's arm64 kernel under qemu-system-aarch64; default tests: agent, cuda).
        #[arg(long, value_enum, default_value = "x86_64")]
        arch: kernel_matrix::Arch,
        /// The kernel the x86-64 guest boots, Debian's packaged one of that series: 5.10
        /// (bullseye: no attach cookies, map memory charged to RLIMIT_MEMLOCK, no module BTF),
        /// 6.1 (bookworm, this machine's release) or 6.12 (trixie). The kernel-module double is
        /// built for 5.10 and 6.1. Downloaded once into /opt/gpu-tracer/qemu.
        #[arg(long, value_enum, default_value = "6.1")]
        kernel: kernel_matrix::Release,
        /// Root test files to run (tests/tests/NAME.rs); default: cuda, least_privilege, agent, cli.
        #[arg(long = "test", value_name = "NAME")]
        tests: Vec<String>,
        /// A sysctl set in the guest before the tests, as KEY=VALUE (repeatable), e.g.
        /// `kernel.perf_event_paranoid=2` to see what a node without Debian's default of 3 gets.
        #[arg(long = "sysctl", value_name = "KEY=VALUE")]
        sysctls: Vec<String>,
        /// Build the kernel-module driver double first (`cargo xtask kmod`); implied when a test
        /// file that needs it (driver_double, driver_entry) is asked for. The tests load it themselves.
        #[arg(long)]
        kmod: bool,
        /// Also run `gpu-tracer-bench driver-entry` in the guest after the tests (the module double
        /// is built for it): driver-entry against btf-tracepoint mode, side by side; the table is
        /// written to target/kernel-matrix/VERSION/bench-driver-entry.md. With no --test, only
        /// the bench runs.
        #[arg(long)]
        bench_driver_entry: bool,
        /// QEMU's CPU model (`-cpu`): default qemu64 for x86_64 (about a third faster under TCG
        /// than `max`, whose AVX-512 state every context switch saves), max for arm64.
        #[arg(long, value_name = "MODEL")]
        cpu: Option<String>,
        /// Arguments for every test executable (a name filter, `--exact NAME`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The kernel-module double of the NVIDIA driver (tests/kmod: nvidia.ko, nvidia-uvm.ko) built
    /// against Debian's headers for a kernel `kernel-matrix` boots, with the compiler that kernel
    /// was built with (6.1: this machine's gcc-12; 5.10: bullseye's gcc-10, fetched into the cache):
    /// the headers are downloaded and unpacked once under /opt/gpu-tracer/qemu/headers-VERSION/,
    /// the modules written to target/kmod/VERSION/ (rebuilt only when tests/kmod changed). See
    /// docs/test-doubles.md.
    Kmod {
        /// The kernel to build for: 6.1 (bookworm, the default) or 5.10 (bullseye, no module BTF).
        #[arg(long, value_enum, default_value = "6.1")]
        kernel: kernel_matrix::Release,
    },
    /// arm64 (Grace nodes): install the cross toolchain and qemu, run the user-space unit tests
    /// cross-built for aarch64-unknown-linux-gnu under qemu-user, then the root end-to-end tests
    /// in Debian's arm64 kernel under qemu-system-aarch64 (`kernel-matrix --arch arm64`).
    Arm64 {
        /// Only the cross-build and the unit tests, no guest.
        #[arg(long)]
        no_guest: bool,
        /// Root test files to run in the guest (tests/tests/NAME.rs); default: agent, cuda.
        #[arg(long = "test", value_name = "NAME")]
        tests: Vec<String>,
        /// Arguments for every test executable in the guest (a name filter, `--exact NAME`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Prepare the real-GPU check: a stripped release `gpu-tracer` in target/gpu-check for the device
    /// machine, where `scripts/gpu-check/run.sh` compares the tracer with nvidia-smi and torch.cuda.
    GpuCheck,
    /// `setup`, then the reliability suite of issue 13, written to docs/reliability.md.
    ///
    /// Each row is a scenario (spoofed device files, fork storms, a flood with a stopped consumer,
    /// restart under load, bad config, endpoint abuse, decoder fuzzing, ...) checked by the tests
    /// that already run in CI: the test executables are built once (`cargo test --release
    /// --no-run`), then each test runs alone by exact name as `cargo test --release ... -- --exact
    /// NAME --nocapture` would run it (GPU_TRACER_REQUIRE_PRIVILEGED=1); its exit status is the
    /// result, its `reliability: key=value` lines are the figures. Scenarios no test checks yet are rows
    /// marked "not covered yet". Progress goes to stderr, each test's output to
    /// target/reliability/logs/. Exits non-zero if any row failed. Needs root, like `test`.
    Reliability {
        /// Write the report here instead of docs/reliability.md.
        #[arg(long, value_name = "PATH")]
        out: Option<std::path::PathBuf>,
        /// Run only the rows whose scenario contains TEXT (case-insensitive); the report is then
        /// written only with --out.
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
        /// The long forms, on demand: decoder fuzzing for 10 minutes, failing under 10 M executions
        /// (the short form fuzzes for 60 s), and the soak for an hour (the short form: 90 s).
        #[arg(long)]
        long: bool,
        /// Run the soak for N seconds instead (its warm-up and sampling scale with it).
        #[arg(long, value_name = "N")]
        soak_seconds: Option<u64>,
    },
}

fn main() {
    let result = match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Build => build::run(),
        Command::Test { args } => test::run(&args),
        Command::Sim { args } => sim::run(&args),
        Command::Bench { args } => bench::run(&args),
        Command::Image { binary, out, tag, refresh_base } => {
            image::run(&image::Options { binary, out, tag, refresh_base })
        }
        Command::KernelMatrix { arch, kernel, tests, sysctls, kmod, bench_driver_entry, cpu, args } => {
            kernel_matrix::run(&kernel_matrix::Options {
                arch,
                release: kernel,
                tests,
                sysctls,
                kmod,
                bench_driver_entry,
                test_args: args,
                cpu,
            })
        }
        Command::Kmod { kernel } => kmod::run(kernel),
        Command::Arm64 { no_guest, tests, args } => arm64::run(&arm64::Options { no_guest, tests, test_args: args }),
        Command::GpuCheck => gpu_check::run(),
        Command::Reliability { out, only, long, soak_seconds } => {
            reliability::run(&reliability::Options { out, only, long, soak_seconds })
        }
    };
    // The whole cause chain on one line; no backtrace (RUST_BACKTRACE is often set in CI).
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
