//! `cargo xtask setup`: everything a fresh Debian 12 machine (as root) lacks to build and test.
//!
//! Each step checks first and changes nothing when the machine already has what it needs, so a
//! second run only reads (it takes well under 2 s). Every step prints exactly one line:
//! `setup: <thing> ok (already)`, `setup: <thing> installed`, or `setup: <thing> FAILED: <cause and fix>`.
//! The recipe and its reasons are in docs/toolchain.md.

use crate::{apt_sources, cmd};
use anyhow::{Context, anyhow, bail};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// bpf-linker release the project is built and tested with.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages the tests need: FUSE (fake /dev/nvidia*), bpftrace (overhead comparisons), and
/// NVIDIA's real user-space libraries from non-free (they load without a GPU).
/// `python3-venv` holds the venv of the deployment validator ([`deploy_validator`]); `prometheus`
/// (the server and promtool) checks the chart's rules and dashboards (tests/tests/prometheus.rs).
/// `buildah` and `mmdebstrap` build the container image without a registry or a daemon
/// (`cargo xtask image`, tests/tests/image.rs; vfs storage and chroot isolation need nothing more).
/// `qemu-system-x86` and `busybox-static` boot the second kernel of `cargo xtask kernel-matrix`.
/// `chromium` (headless) and `fonts-dejavu-core` render `profile --html`'s report in
/// tests/tests/profile.rs. `gcc-12` (the compiler Debian's 6.1 kernel is built with), `make` and
/// `libelf1` (objtool, from the unpacked linux-kbuild package, links it) build the kernel-module
/// driver double with `cargo xtask kmod`; `dwarves` (pahole) encodes its BTF, as Kbuild does for
/// Debian's own modules, against the `vmlinux` that `xz` (`xz-utils`) unpacks from the guest's
/// `vmlinuz`. `tmux` runs `top` in terminals of chosen sizes and reads them back (tests/tests/top.rs).
const APT_PACKAGES: &[&str] = &[
    "fuse3",
    "bpftrace",
    "libcuda1",
    "libnvidia-ml1",
    "python3-venv",
    "prometheus",
    "buildah",
    "mmdebstrap",
    "qemu-system-x86",
    "busybox-static",
    "chromium",
    "fonts-dejavu-core",
    "gcc-12",
    "make",
    "libelf1",
    "dwarves",
    "xz-utils",
    "tmux",
];
/// The subset of [`APT_PACKAGES`] that lives in Debian's non-free component.
const NON_FREE_PACKAGES: &[&str] = &["libcuda1", "libnvidia-ml1"];
/// The components [`NON_FREE_PACKAGES`] and their dependencies need.
const COMPONENTS: &[&str] = &["contrib", "non-free"];
const TRACEFS: &str = "/sys/kernel/tracing";
/// PyPI packages of the deployment test (tests/tests/deploy.rs, deploy/validate.py), pinned:
/// helm-python-sdk embeds Helm's own Go engine (`helm template`/`helm lint` without a helm binary,
/// which no registry we reach ships); kubernetes-validate ships the Kubernetes OpenAPI schemas.
/// `opentelemetry-proto` decodes what the agent sent over OTLP in tests/tests/otlp.rs (an
/// implementation independent of the Rust one). `jsonschema` (also kubernetes-validate's own
/// dependency) checks the ServiceMonitor/PodMonitor/PrometheusRule objects against the vendored
/// CRD schemas (deploy/schemas/prometheus-operator). `perfetto` (its perfetto_trace_pb2) decodes the
/// traces `gpu-tracer profile` writes in tests/tests/profile.rs (tests/perfetto_check.py).
/// `grpcio` and `grpcio-tools` are a standard gRPC client of the agent's API as users write one
/// (stubs generated from proto/ with the protoc inside grpcio-tools, gRPC C-core's channel):
/// tests/tests/cli.rs, tests/grpc_client.py.
const DEPLOY_PIP_PACKAGES: &[(&str, &str)] = &[
    ("helm-python-sdk", "0.2.2"),
    ("kubernetes-validate", "1.37.0"),
    ("opentelemetry-proto", "1.45.2"),
    ("jsonschema", "4.26.0"),
    ("perfetto", "0.59.1"),
    ("grpcio", "1.76.0"),
    ("grpcio-tools", "1.76.0"),
];
/// Where their venv lives unless `GPU_TRACER_DEPLOY_VENV` says otherwise (tests/tests/deploy.rs
/// looks in the same place).
const DEPLOY_VENV: &str = "/opt/gpu-tracer/deploy-venv";
/// Where Debian's arm64 libcuda is unpacked (the arm64 placement tests read it; never run).
pub const ARM64_LIBCUDA: &str = "/opt/gpu-tracer/arm64/libcuda.so.1";
/// The apt sources file setup writes (and may rewrite) when contrib or non-free is missing.
const OUR_SOURCES: &str = "/etc/apt/sources.list.d/gpu-tracer-contrib-non-free.sources";

/// What a step found.
enum Outcome {
    Already,
    Installed,
    /// Nothing to do, for the stated reason.
    NotNeeded(String),
}

/// How nested builds must be run once setup is done.
pub struct BuildEnv {
    /// The toolchain aya-build uses for the eBPF crate (`AYA_EBPF_TOOLCHAIN`, default nightly).
    pub ebpf_toolchain: String,
}

impl BuildEnv {
    /// A `cargo` command in the workspace root, with bpf-linker on PATH and, for a non-nightly
    /// eBPF toolchain, `RUSTC_BOOTSTRAP=1` (build-std needs unstable flags).
    pub fn cargo(&self) -> Command {
        let mut c = Command::new(cmd::cargo_program());
        c.current_dir(cmd::workspace_root());
        let bin = cmd::cargo_home().join("bin");
        let path = std::env::var_os("PATH").unwrap_or_default();
        if !std::env::split_paths(&path).any(|p| p == bin) {
            let mut paths = vec![bin];
            paths.extend(std::env::split_paths(&path));
            c.env("PATH", std::env::join_paths(paths).expect("PATH entries contain no ':'"));
        }
        if self.ebpf_toolchain != "nightly" {
            c.env("RUSTC_BOOTSTRAP", "1");
        }
        c
    }
}

/// `cargo xtask setup`.
pub fn run() -> anyhow::Result<()> {
    run_setup().map(|_| ())
}

/// Runs every step, printing one line each; fails at the end if any step failed.
pub fn run_setup() -> anyhow::Result<BuildEnv> {
    let start = Instant::now();
    let tc = std::env::var("AYA_EBPF_TOOLCHAIN").ok().filter(|t| !t.is_empty()).unwrap_or_else(|| "nightly".into());
    let mut failed = Vec::new();
    let mut step = |thing: &str, result: anyhow::Result<Outcome>| match result {
        Ok(Outcome::Already) => println!("setup: {thing} ok (already)"),
        Ok(Outcome::Installed) => println!("setup: {thing} installed"),
        Ok(Outcome::NotNeeded(why)) => println!("setup: {thing} ok (not needed: {why})"),
        Err(e) => {
            println!("setup: {thing} FAILED: {e:#}");
            failed.push(thing.to_string());
        }
    };

    step(&format!("rust toolchain {tc}"), toolchain(&tc));
    step(&format!("rust-src for {tc}"), rust_src(&tc));
    step("clippy (the house lints, checked by `cargo xtask test`)", clippy());
    step(&format!("bpf-linker {BPF_LINKER_VERSION} (against {tc}'s libLLVM)"), bpf_linker(&tc));
    step(&format!("tracefs at {TRACEFS}"), tracefs());
    apt(&mut step);
    step("deployment validator (helm-python-sdk, kubernetes-validate)", deploy_validator());
    step("kubectl (kustomize, for the privileged overlay)", kubectl());
    step(&format!("arm64 libcuda (libcuda1:arm64 unpacked at {ARM64_LIBCUDA})"), arm64_libcuda());

    if !failed.is_empty() {
        bail!("setup failed: {} (see the FAILED lines above)", failed.join(", "));
    }
    println!("setup: done in {:.1} s", start.elapsed().as_secs_f64());
    Ok(BuildEnv { ebpf_toolchain: tc })
}

/// The eBPF toolchain must exist; install it (minimal profile) only when `rustup toolchain list`
/// lacks it.
fn toolchain(tc: &str) -> anyhow::Result<Outcome> {
    let list = cmd::output(Command::new("rustup").args(["toolchain", "list"]))
        .context("cause: rustup is needed to manage toolchains; fix: install rustup (https://rustup.rs) and rerun")?;
    if toolchain_listed(&list, tc) {
        return Ok(Outcome::Already);
    }
    cmd::run(Command::new("rustup").args(["toolchain", "install", tc, "--profile", "minimal"]))
        .context("fix: check network access to the rustup dist server, then rerun")?;
    Ok(Outcome::Installed)
}

/// Whether `rustup toolchain list` output names `tc`. Names look like
/// `nightly-x86_64-unknown-linux-gnu (active)`; a dated `nightly-2026-05-19-…` is not `nightly`.
fn toolchain_listed(list: &str, tc: &str) -> bool {
    list.lines().filter_map(|l| l.split_whitespace().next()).any(|name| {
        name == tc
            || name
                .strip_prefix(tc)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|host| host.starts_with(|c: char| c.is_ascii_alphabetic()))
    })
}

fn sysroot(tc: &str) -> anyhow::Result<PathBuf> {
    let out = cmd::output(Command::new("rustc").arg(format!("+{tc}")).args(["--print", "sysroot"]))
        .with_context(|| format!("cause: toolchain {tc} is not usable; fix: `rustup toolchain install {tc}`"))?;
    Ok(PathBuf::from(out.trim()))
}

/// `-Z build-std=core` for bpfel-unknown-none needs the toolchain's library sources.
fn rust_src(tc: &str) -> anyhow::Result<Outcome> {
    let core = sysroot(tc)?.join("lib/rustlib/src/rust/library/core/src/lib.rs");
    if core.exists() {
        return Ok(Outcome::Already);
    }
    cmd::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", tc]))
        .context("fix: check network access to the rustup dist server, then rerun")?;
    if !core.exists() {
        bail!(
            "cause: rust-src was added but {} is missing; fix: `rustup component remove rust-src --toolchain {tc}` and rerun",
            core.display()
        );
    }
    Ok(Outcome::Installed)
}

/// clippy for the host toolchain (rustup's default profile has it; a minimal one does not).
fn clippy() -> anyhow::Result<Outcome> {
    let have = || {
        Command::new(cmd::cargo_program())
            .args(["clippy", "--version"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if have() {
        return Ok(Outcome::Already);
    }
    cmd::run(Command::new("rustup").args(["component", "add", "clippy"]))
        .context("fix: check network access to the rustup dist server, then rerun")?;
    if !have() {
        bail!("cause: clippy was added but `cargo clippy --version` still fails; fix: `rustup component add clippy`");
    }
    Ok(Outcome::Installed)
}

/// bpf-linker built with `--no-default-features --features llvm-<major>` and linked against the
/// toolchain's own libLLVM through a prefix of two symlinks (the link-time name and the soname,
/// which the binary's rpath points at at run time). See docs/toolchain.md.
fn bpf_linker(tc: &str) -> anyhow::Result<Outcome> {
    let sysroot = sysroot(tc)?;
    let lib = sysroot.join("lib");
    let mut llvm_libs: Vec<String> = std::fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("libLLVM.so."))
        .collect();
    llvm_libs.sort();
    let llvm_so = llvm_libs.into_iter().next().ok_or_else(|| {
        anyhow!(
            "cause: {} has no libLLVM.so.*; fix: reinstall the toolchain (`rustup toolchain install {tc} --force`)",
            lib.display()
        )
    })?;
    let verbose = cmd::output(Command::new("rustc").arg(format!("+{tc}")).arg("-vV"))?;
    let major = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .ok_or_else(|| anyhow!("cause: `rustc +{tc} -vV` names no LLVM version"))?
        .to_string();

    let prefix = cmd::cargo_home().join("bpf-linker-llvm").join(tc);
    let mut changed = false;
    std::fs::create_dir_all(prefix.join("lib")).with_context(|| format!("creating {}", prefix.display()))?;
    for name in ["libLLVM.so", llvm_so.as_str()] {
        changed |= symlink(&lib.join(&llvm_so), &prefix.join("lib").join(name))?;
    }

    let bl = cmd::cargo_home().join("bin/bpf-linker");
    if !changed && bpf_linker_is_current(&bl, &llvm_so) {
        return Ok(Outcome::Already);
    }
    let mut install = Command::new(cmd::cargo_program());
    install
        .args(["install", "--locked", "--force"])
        .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{major}"))
        .env("LLVM_PREFIX", &prefix)
        // Build in a throw-away directory, not in the workspace's target dir.
        .env_remove("CARGO_TARGET_DIR");
    cmd::run(&mut install).context("fix: check access to crates.io; the install log above names the failing step")?;
    if !bpf_linker_is_current(&bl, &llvm_so) {
        bail!(
            "cause: {} is not version {BPF_LINKER_VERSION} linked to {llvm_so} after installing; fix: remove it and rerun",
            bl.display()
        );
    }
    Ok(Outcome::Installed)
}

fn bpf_linker_is_current(bl: &Path, llvm_so: &str) -> bool {
    let version = cmd::output(Command::new(bl).arg("--version")).unwrap_or_default();
    if version.trim() != format!("bpf-linker {BPF_LINKER_VERSION}") {
        return false;
    }
    // The libLLVM it needs must resolve (to a file, not "not found").
    let ldd = cmd::output(Command::new("ldd").arg(bl)).unwrap_or_default();
    ldd.lines().any(|l| l.contains(llvm_so) && l.contains("=> /"))
}

/// Points `link` at `target`; returns whether anything changed.
fn symlink(target: &Path, link: &Path) -> anyhow::Result<bool> {
    if std::fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(false);
    }
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", link.display())),
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} -> {}", link.display(), target.display()))?;
    Ok(true)
}

/// aya looks up tracepoint ids under tracefs.
fn tracefs() -> anyhow::Result<Outcome> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mounted = mounts.lines().any(|l| {
        let mut halves = l.split(" - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else { return false };
        left.split(' ').nth(4) == Some(TRACEFS) && right.split(' ').next() == Some("tracefs")
    });
    if mounted {
        return Ok(Outcome::Already);
    }
    if !cmd::is_root() {
        bail!("cause: not mounted and mounting needs root; fix: `sudo mount -t tracefs tracefs {TRACEFS}`");
    }
    cmd::run(Command::new("mount").args(["-t", "tracefs", "tracefs", TRACEFS]))
        .context("cause: the kernel may lack CONFIG_TRACING; fix: use a kernel with tracefs")?;
    Ok(Outcome::Installed)
}

/// Installed state of each package, from one `dpkg-query` call.
fn installed_packages(packages: &[&str]) -> anyhow::Result<Vec<String>> {
    // dpkg-query exits 1 when some name is unknown to dpkg, but still prints the known ones.
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Status}\\n"])
        .args(packages)
        .output()
        .context("cause: dpkg-query not found (not a Debian machine?); fix: install fuse3, bpftrace, libcuda1 and libnvidia-ml1 by hand")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, status)| *status == "installed")
        .map(|(name, _)| name.to_string())
        .collect())
}

fn codename() -> anyhow::Result<String> {
    let os = std::fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| anyhow!("cause: /etc/os-release has no VERSION_CODENAME (not Debian?)"))
}

/// Debian packages: enable contrib and non-free if a package from there is missing, then install
/// only what dpkg says is missing (`apt-get update` only then).
fn apt(step: &mut impl FnMut(&str, anyhow::Result<Outcome>)) {
    let installed = match installed_packages(APT_PACKAGES) {
        Ok(i) => i,
        Err(e) => return step("Debian packages", Err(e)),
    };
    let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !installed.iter().any(|i| i == p)).collect();
    let need_non_free = missing.iter().any(|p| NON_FREE_PACKAGES.contains(p));

    let components = non_free_components(need_non_free);
    let components_ok = components.is_ok();
    step("Debian contrib and non-free components", components);

    let result = if missing.is_empty() {
        Ok(())
    } else if need_non_free && !components_ok {
        Err(anyhow!("cause: the contrib and non-free components could not be enabled (see above)"))
    } else {
        install(&missing)
    };
    let now = if missing.is_empty() { installed } else { installed_packages(APT_PACKAGES).unwrap_or_default() };
    for p in APT_PACKAGES {
        let outcome = if !missing.contains(p) {
            Ok(Outcome::Already)
        } else if now.iter().any(|i| i == p) {
            Ok(Outcome::Installed)
        } else {
            Err(match &result {
                Err(e) => anyhow!("{e:#}"),
                Ok(()) => anyhow!(
                    "cause: apt-get succeeded but dpkg does not list {p} as installed; fix: `apt-get install {p}`"
                ),
            })
        };
        step(&format!("package {p}"), outcome);
    }
}

fn install(missing: &[&str]) -> anyhow::Result<()> {
    let list = missing.join(" ");
    if !cmd::is_root() {
        bail!("cause: installing packages needs root; fix: `sudo apt-get install {list}`, or rerun as root");
    }
    cmd::run(apt_get().arg("update")).map_err(|e| {
        anyhow!(
            "{e:#}; cause: the package lists could not be fetched (apt's messages above say why); \
             fix: check network access and /etc/apt/sources.list*, then rerun"
        )
    })?;
    cmd::run(apt_get().args(["install", "-y", "--no-install-recommends"]).args(missing)).map_err(|e| {
        anyhow!("{e:#}; cause: see apt's messages above; fix: resolve them, or run `apt-get install {list}` by hand")
    })
}

fn apt_get() -> Command {
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive").args(["-q", "-o", "DPkg::Lock::Timeout=120"]);
    c
}

/// libcuda1 and libnvidia-ml1 are in Debian's non-free component and depend on packages in
/// contrib (nvidia-support, glx-alternative-nvidia); Debian images usually enable only main.
fn non_free_components(needed: bool) -> anyhow::Result<Outcome> {
    let codename = codename()?;
    let entries = apt_sources::read_all(Path::new("/etc/apt"))?;
    if COMPONENTS.iter().all(|c| apt_sources::component_enabled(&entries, &codename, c)) {
        return Ok(Outcome::Already);
    }
    if !needed {
        return Ok(Outcome::NotNeeded(format!("{} are installed", NON_FREE_PACKAGES.join(" and "))));
    }
    if !cmd::is_root() {
        bail!(
            "cause: enabling them needs root; fix: add `contrib non-free` to the Components of the {codename} \
             entries in /etc/apt/sources.list.d/debian.sources (or sources.list), or rerun as root"
        );
    }
    // Our own file is rewritten whole, so it must not count as a source of archives to mirror.
    let others: Vec<_> = entries.into_iter().filter(|e| e.file != Path::new(OUR_SOURCES)).collect();
    let text = apt_sources::stanzas_enabling(&others, &codename, COMPONENTS);
    std::fs::write(OUR_SOURCES, text).with_context(|| format!("cause: could not write {OUR_SOURCES}"))?;
    Ok(Outcome::Installed)
}

fn deploy_venv() -> PathBuf {
    std::env::var_os("GPU_TRACER_DEPLOY_VENV").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEPLOY_VENV))
}

/// The pinned versions `pip` reports, one `name==version` per line, when they are all there.
fn deploy_packages_current(python: &Path) -> bool {
    let out = cmd::output(Command::new(python).args(["-m", "pip", "freeze", "--disable-pip-version-check"]))
        .unwrap_or_default();
    let have: Vec<String> = out.lines().map(|l| l.trim().to_ascii_lowercase().replace('_', "-")).collect();
    DEPLOY_PIP_PACKAGES.iter().all(|(name, version)| have.iter().any(|l| *l == format!("{name}=={version}")))
}

/// A venv (Debian's python3 + python3-venv) with [`DEPLOY_PIP_PACKAGES`]; pip runs only when a
/// pinned version is missing.
fn deploy_validator() -> anyhow::Result<Outcome> {
    let venv = deploy_venv();
    let python = venv.join("bin/python");
    if python.exists() && deploy_packages_current(&python) {
        return Ok(Outcome::Already);
    }
    if !python.exists() {
        std::fs::create_dir_all(venv.parent().unwrap_or(Path::new("/"))).with_context(|| {
            format!("cause: cannot create {}; fix: rerun as root or set GPU_TRACER_DEPLOY_VENV", venv.display())
        })?;
        cmd::run(Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(&venv)).context(
            "cause: Debian's python3 could not make a venv; fix: `apt-get install python3-venv` (the package step above)",
        )?;
    }
    let pins: Vec<String> = DEPLOY_PIP_PACKAGES.iter().map(|(n, v)| format!("{n}=={v}")).collect();
    cmd::run(Command::new(&python).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(&pins))
        .context("fix: check access to PyPI, then rerun")?;
    if !deploy_packages_current(&python) {
        bail!(
            "cause: pip finished but {} does not hold {}; fix: remove {} and rerun",
            venv.display(),
            pins.join(" "),
            venv.display()
        );
    }
    Ok(Outcome::Installed)
}

/// `kubectl kustomize` renders the privileged overlay. Any kubectl on PATH will do (the image's,
/// or Debian's kubernetes-client, whose older kustomize reads the same `patchesStrategicMerge`).
fn kubectl() -> anyhow::Result<Outcome> {
    if cmd::output(Command::new("kubectl").args(["kustomize", "--help"])).is_ok() {
        return Ok(Outcome::Already);
    }
    if !cmd::is_root() {
        bail!("cause: kubectl is missing and installing it needs root; fix: `sudo apt-get install kubernetes-client`");
    }
    install(&["kubernetes-client"])?;
    Ok(Outcome::Installed)
}

/// The real arm64 libcuda for the arm64 placement tests (tracer-agent `cuda::placement::aarch64`):
/// `libcuda1:arm64` downloaded with a private apt configuration ([`PrivateApt`]) and unpacked, never
/// installed (on this machine, it runs only inside the arm64 guest of `cargo xtask arm64`).
fn arm64_libcuda() -> anyhow::Result<Outcome> {
    let dest = Path::new(ARM64_LIBCUDA);
    if dest.is_file() {
        return Ok(Outcome::Already);
    }
    if !cmd::is_root() {
        bail!("cause: writing {} needs root; fix: rerun as root", dest.display());
    }
    let apt = PrivateApt::arm64()?;
    let root = apt.work.join("x");
    apt.unpack("libcuda1:arm64", &root)
        .map_err(|e| anyhow!("{e:#}; cause: libcuda1:arm64 is not in the configured non-free component"))?;
    let lib = root.join("usr/lib/aarch64-linux-gnu/nvidia/current/libcuda.so.1");
    let real = std::fs::canonicalize(&lib).with_context(|| format!("{} not in the package", lib.display()))?;
    std::fs::create_dir_all(dest.parent().expect("absolute path"))?;
    std::fs::copy(&real, dest).with_context(|| format!("copying {} to {}", real.display(), dest.display()))?;
    Ok(Outcome::Installed)
}

/// Debian's packages without touching this machine's package state: a private apt configuration
/// (lists, cache and an empty dpkg status of its own in a temporary directory, removed on drop;
/// for arm64, arm64 added to `APT::Architectures`; for another Debian release, a sources list of
/// its own), so `dpkg --print-foreign-architectures`, the sources and the installed packages stay
/// as they were. Packages are downloaded and unpacked, never installed.
pub struct PrivateApt {
    work: PathBuf,
    conf: PathBuf,
}

impl PrivateApt {
    /// arm64 packages from this machine's own sources (about 6 s for the lists).
    pub fn arm64() -> anyhow::Result<PrivateApt> {
        PrivateApt::with("arm64", &["amd64", "arm64"], None)
    }

    /// amd64 packages of the Debian release `suite` (`bullseye`, `trixie`): its main component
    /// and its security suite, from deb.debian.org, signed by the keys of `debian-archive-keyring`.
    pub fn suite(suite: &str) -> anyhow::Result<PrivateApt> {
        let sources = format!(
            "deb http://deb.debian.org/debian {suite} main\ndeb http://deb.debian.org/debian-security {suite}-security main\n"
        );
        PrivateApt::with(suite, &["amd64"], Some(&sources))
    }

    fn with(name: &str, archs: &[&str], sources: Option<&str>) -> anyhow::Result<PrivateApt> {
        let work = std::env::temp_dir().join(format!("gpu-tracer-{name}-apt-{}", std::process::id()));
        let apt = PrivateApt { conf: work.join("apt.conf"), work };
        for d in ["lists/partial", "cache/archives/partial", "deb", "sources.list.d"] {
            std::fs::create_dir_all(apt.work.join(d))?;
        }
        std::fs::write(apt.work.join("status"), "")?;
        let archs: String = archs.iter().map(|a| format!("\"{a}\"; ")).collect();
        let mut conf = format!(
            "APT::Architectures {{ {archs}}};\nDir::State::Lists \"{w}/lists\";\n\
             Dir::Cache \"{w}/cache\";\nDir::State::status \"{w}/status\";\nAPT::Sandbox::User \"root\";\n",
            w = apt.work.display()
        );
        if let Some(sources) = sources {
            std::fs::write(apt.work.join("sources.list"), sources)?;
            let _ = write!(
                conf,
                "Dir::Etc::SourceList \"{w}/sources.list\";\nDir::Etc::SourceParts \"{w}/sources.list.d\";\n",
                w = apt.work.display()
            );
        }
        std::fs::write(&apt.conf, conf)?;
        cmd::run(&mut apt.command("apt-get", &["-qq", "update"])).map_err(|e| {
            anyhow!(
                "{e:#}; cause: the package lists ({name}) could not be fetched; fix: check network access to the mirror"
            )
        })?;
        Ok(apt)
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = if program == "apt-get" { apt_get() } else { Command::new(program) };
        c.env("APT_CONFIG", &self.conf).current_dir(self.work.join("deb")).args(args);
        c
    }

    /// The package `package` depends on whose name starts with `prefix` (a metapackage's current
    /// version, e.g. `linux-image-arm64:arm64` → `linux-image-6.1.0-57-arm64:arm64`).
    pub fn dependency(&self, package: &str, prefix: &str) -> anyhow::Result<String> {
        let deps = cmd::output(&mut self.command("apt-cache", &["depends", package]))?;
        deps.lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|p| p.starts_with(prefix))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("`apt-cache depends {package}` names no {prefix}* package: {deps}"))
    }

    /// Downloads `package` (`name:arm64` for an arm64 one) and unpacks it under `dest` (`dpkg-deb -x`).
    pub fn unpack(&self, package: &str, dest: &Path) -> anyhow::Result<()> {
        let dl = self.work.join("deb");
        for e in std::fs::read_dir(&dl)?.filter_map(Result::ok) {
            let _ = std::fs::remove_file(e.path());
        }
        cmd::run(&mut self.command("apt-get", &["-qq", "download", package]))
            .map_err(|e| anyhow!("{e:#}; cause: {package} could not be downloaded from the mirror"))?;
        let deb = std::fs::read_dir(&dl)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| anyhow!("apt-get download {package} left no .deb in {}", dl.display()))?;
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dest))
    }
}

impl Drop for PrivateApt {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The Rust target of the arm64 build.
pub const ARM64_TARGET: &str = "aarch64-unknown-linux-gnu";
/// What the arm64 build and its guest need from Debian, and the program each provides: the cross
/// C toolchain and libc (linker, the fake libcuda's compiler, the guest's libc), qemu-user (the
/// unit tests) and qemu-system-aarch64 (the guest).
const ARM64_PACKAGES: &[(&str, &str)] = &[
    ("gcc-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-gcc"),
    ("binutils-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-objdump"),
    ("libc6-dev-arm64-cross", "/usr/aarch64-linux-gnu/lib/libc.so"),
    ("qemu-user-static", "/usr/bin/qemu-aarch64-static"),
    ("qemu-system-arm", "/usr/bin/qemu-system-aarch64"),
];

/// The arm64 build's own set-up (`cargo xtask arm64` runs it after [`run_setup`]; CI does not
/// need it): the Rust target's standard library and [`ARM64_PACKAGES`].
pub fn arm64_setup() -> anyhow::Result<()> {
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == ARM64_TARGET) {
        println!("setup: rust target {ARM64_TARGET} ok (already)");
    } else {
        cmd::run(Command::new("rustup").args(["target", "add", ARM64_TARGET]))
            .context("fix: check network access to the rustup dist server, then rerun")?;
        println!("setup: rust target {ARM64_TARGET} installed");
    }
    let missing: Vec<&str> =
        ARM64_PACKAGES.iter().filter(|(_, file)| !Path::new(file).exists()).map(|(p, _)| *p).collect();
    if missing.is_empty() {
        println!("setup: arm64 cross toolchain and qemu ok (already)");
    } else {
        install(&missing)?;
        println!("setup: {} installed", missing.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
