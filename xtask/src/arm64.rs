//! `cargo xtask arm64`: the workspace on arm64 (Grace nodes), from this x86-64 machine.
//!
//! 1. The arm64 set-up ([`setup::arm64_setup`]): the Rust target, Debian's cross C toolchain and
//!    libc, qemu-user and qemu-system-aarch64.
//! 2. The user-space unit tests (tracer-common, tracer-core, tracer-agent, tracer-client) cross-built for
//!    `aarch64-unknown-linux-gnu` and run under qemu-user (`.cargo/config.toml` names the runner).
//!    The kernel programs are built for it too: aya-build sets `bpf_target_arch = "aarch64"`, which
//!    selects arm64's syscall numbers (`tracer_common::sysno`), `struct pt_regs` offsets
//!    (tracer-ebpf `main.rs`) and argument registers (`cuda.rs`).
//! 3. The root end-to-end tests in Debian's arm64 kernel under qemu-system-aarch64
//!    ([`kernel_matrix`] with [`Arch::Arm64`]), unless `--no-guest`.
use std::time::Instant;

use crate::kernel_matrix::{self, Arch};
use crate::{cmd, setup};

/// The one unit test that cannot pass under qemu-user: it compares `/proc/self/stat` with
/// `/proc/<pid>/stat`, and qemu-user emulates the former (its `starttime` is qemu's, not the
/// kernel's). Not an arm64 difference: the test runs natively on x86-64 in `cargo xtask test`.
const QEMU_USER_PROC_SELF: &str = "proc::tests::this_process_through_the_crate";

pub struct Options {
    pub no_guest: bool,
    pub tests: Vec<String>,
    pub test_args: Vec<String>,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let env = setup::run_setup()?;
    setup::arm64_setup()?;
    let started = Instant::now();
    cmd::run(env.cargo().args([
        "test",
        "--release",
        "--target",
        setup::ARM64_TARGET,
        "-p",
        "tracer-common",
        "-p",
        "tracer-core",
        "-p",
        "tracer-agent",
        "-p",
        "tracer-client",
        "--lib",
        "--",
        "--skip",
        QEMU_USER_PROC_SELF,
    ]))?;
    println!(
        "arm64: the unit tests of tracer-common, tracer-core, tracer-agent and tracer-client passed under qemu-user ({:.0} s with the build); \
         not run there: {QEMU_USER_PROC_SELF} (qemu-user answers /proc/self/stat itself, with its own start \
         time; it runs natively in `cargo xtask test`)",
        started.elapsed().as_secs_f64()
    );
    if opts.no_guest {
        return Ok(());
    }
    kernel_matrix::run(&kernel_matrix::Options {
        release: kernel_matrix::Release::Bookworm,
        arch: Arch::Arm64,
        tests: opts.tests.clone(),
        sysctls: Vec::new(),
        kmod: false,
        bench_driver_entry: false,
        test_args: opts.test_args.clone(),
        cpu: None,
    })
}
