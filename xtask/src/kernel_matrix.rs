//! `cargo xtask kernel-matrix`: the root end-to-end tests on a second kernel.
//!
//! Debian's packaged kernel (the package `linux-image-amd64` depends on: 6.1 on bookworm) boots
//! under QEMU with this machine's root file system shared read-only over 9p; the guest mounts
//! procfs, sysfs, devtmpfs, tracefs, bpffs and a cgroup2 hierarchy of its own over it, `chroot`s into
//! it and runs the test executables built here, one after the other, as root with
//! `GPU_TRACER_REQUIRE_PRIVILEGED=1`. A second, writable share (`target/kernel-matrix/`) carries the
//! script in and the logs and exit statuses out. KVM does not work on these VMs (they are PVM
//! guests), so QEMU runs with TCG (`-cpu max`): slow, about ten times this machine, but the same
//! kernel code paths. The recipe, measured: `../shared/reference/platform-recipes.md`.
//!
//! What differs on 6.1 is real, not simulated: no multi-uprobe links (the cuda family falls back to
//! one perf event per uprobe, and needs CAP_SYS_ADMIN for them), older verifier and helpers. The
//! kernel package is unpacked once into [`CACHE`]; the initramfs is rebuilt on each run (a second).
//!
//! `--arch arm64` (also `cargo xtask arm64`) boots Debian's arm64 kernel (`linux-image-arm64`)
//! under `qemu-system-aarch64 -M virt -cpu max` (TCG: pointer authentication and BTI emulated)
//! and runs the test executables cross-built for `aarch64-unknown-linux-gnu`. The host's root is
//! x86-64, so the guest does not `chroot` into it: its root stays the initramfs (arm64 busybox from
//! `busybox-static:arm64`), with the host's `/work`, `/opt` and the cross libc
//! (`/usr/aarch64-linux-gnu`, from `libc6-dev-arm64-cross`) linked in at their own paths, the
//! dynamic loader and libc where arm64 programs look for them, and the unpacked real arm64
//! `libcuda.so.1` at Debian's arm64 path.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, bail};

use crate::{cmd, kmod, reliability, setup};

/// Where the kernel package is unpacked and the initramfs built.
pub const CACHE: &str = "/opt/gpu-tracer/qemu";
/// The kernel modules the guest loads, in order (no modprobe in the initramfs): virtio PCI, 9p,
/// and FUSE for the fake driver.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "9p",
    "fuse",
];
/// The root test files run by default: the cuda family (perf-event fallback on 6.1), least
/// privilege, the driver family end to end, the command line.
pub const DEFAULT_TESTS: &[&str] = &["cuda", "least_privilege", "agent", "cli"];
/// On arm64: the driver family end to end and the cuda family (the fake libcuda in its arm64
/// prologue variants, and the real arm64 libcuda).
pub const DEFAULT_TESTS_ARM64: &[&str] = &["agent", "cuda"];
/// Root test files that need the kernel-module driver double built for the guest's kernel. They
/// cannot run on the host (its kernel cannot load modules built for 6.1), so their tests are
/// `#[ignore]`d there (listed in `test::ALLOWED_IGNORED`) and run here with `--include-ignored`.
pub const KMOD_TESTS: &[&str] = &["driver_double", "driver_entry"];

/// The guest's architecture.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Arch {
    /// x86-64: this machine's architecture, its root shared with the guest.
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// arm64 (Grace): the workspace cross-built, Debian's arm64 kernel under qemu-system-aarch64.
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's architecture name.
    fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
}

pub struct Options {
    /// The guest's architecture.
    pub arch: Arch,
    /// Root test files (`tests/tests/NAME.rs`) to run; empty: [`DEFAULT_TESTS`].
    pub tests: Vec<String>,
    /// `KEY=VALUE` sysctls set in the guest before the first test.
    pub sysctls: Vec<String>,
    /// Build the kernel-module driver double ([`kmod::build`]) before booting; implied by a test
    /// file of [`KMOD_TESTS`].
    pub kmod: bool,
    /// Run `gpu-tracer-bench driver-entry` in the guest after the tests (needs the module double).
    pub bench_driver_entry: bool,
    /// Arguments for each test executable (a filter, `--exact NAME`).
    pub test_args: Vec<String>,
}

/// The kernel to boot: its version, `vmlinuz`, and modules directory.
struct Kernel {
    arch: Arch,
    /// The guest's static busybox (its `/init` shell): this machine's for x86-64, the unpacked
    /// `busybox-static:arm64` for arm64.
    busybox: PathBuf,
    version: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
}

/// The first package `package` depends on (`apt-cache depends`) whose name starts with `prefix`.
pub fn apt_dependency(package: &str, prefix: &str) -> anyhow::Result<String> {
    let deps = cmd::output(Command::new("apt-cache").args(["depends", package]))?;
    deps.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with(prefix))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("`apt-cache depends {package}` names no {prefix}* package: {deps}"))
}

/// The version of the x86-64 kernel the guest boots (`6.1.0-57-amd64`): the one Debian's
/// `linux-image-amd64` depends on.
pub fn x86_64_version() -> anyhow::Result<String> {
    Ok(apt_dependency("linux-image-amd64", "linux-image-")?.trim_start_matches("linux-image-").to_string())
}

/// The x86-64 guest kernel's `vmlinuz`, unpacked into the cache if it is not there yet.
pub fn x86_64_kernel() -> anyhow::Result<PathBuf> {
    Ok(kernel(Arch::X86_64)?.vmlinuz)
}

/// Downloads `package` with `apt-get download` into [`CACHE`]`/download` and unpacks it into
/// `root` (`dpkg-deb -x`); the `.deb` is removed afterwards.
pub fn download_and_unpack(package: &str, root: &Path) -> anyhow::Result<()> {
    let dl = Path::new(CACHE).join("download");
    std::fs::create_dir_all(&dl)?;
    cmd::run(Command::new("apt-get").current_dir(&dl).args([
        "-qq",
        "-o",
        "APT::Sandbox::User=root",
        "download",
        package,
    ]))
    .map_err(|e| anyhow!("{e:#}; fix: check network access to the Debian mirror"))?;
    let deb = std::fs::read_dir(&dl)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_"))))
        .ok_or_else(|| anyhow!("apt-get download left no {package} .deb in {}", dl.display()))?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root))?;
    let _ = std::fs::remove_file(&deb);
    Ok(())
}

/// The kernel package `linux-image-<arch>` depends on, unpacked under [`CACHE`]; for arm64
/// through a private apt configuration ([`setup::Arm64Apt`]), which also brings the arm64 busybox.
fn kernel(arch: Arch) -> anyhow::Result<Kernel> {
    let meta = format!("linux-image-{}", arch.debian());
    let arm64 = if arch == Arch::Arm64 { Some(setup::Arm64Apt::new()?) } else { None };
    let package = match &arm64 {
        Some(apt) => apt.dependency(&format!("{meta}:arm64"), "linux-image-")?,
        None => apt_dependency(&meta, "linux-image-")?,
    };
    let version = package.trim_start_matches("linux-image-").trim_end_matches(":arm64").to_string();
    let root = Path::new(CACHE).join(&version);
    let vmlinuz = root.join(format!("boot/vmlinuz-{version}"));
    let modules = root.join(format!("lib/modules/{version}"));
    if let Some(apt) = &arm64 {
        if !vmlinuz.is_file() || !modules.is_dir() {
            apt.unpack(&package, &root)
                .map_err(|e| anyhow!("{e:#}; fix: check network access to the Debian mirror"))?;
        }
        let busybox = Path::new(CACHE).join("busybox-arm64");
        if !busybox.join("bin/busybox").is_file() {
            apt.unpack("busybox-static:arm64", &busybox)?;
        }
        return Ok(Kernel { arch, version, vmlinuz, modules, busybox: busybox.join("bin/busybox") });
    }
    if !vmlinuz.is_file() || !modules.is_dir() {
        download_and_unpack(&package, &root)?;
    }
    Ok(Kernel { arch, version, vmlinuz, modules, busybox: PathBuf::from("/bin/busybox") })
}

/// The guest's `/init`: mount, load modules, share the host root, run `/mnt/run.sh` in it (x86-64:
/// `chroot`ed into the host's root; arm64: in the initramfs root, with the host's files it needs
/// linked in, as the module documentation says).
fn init_script(k: &Kernel, modules: &[&str]) -> String {
    // Beyond the procfs, sysfs and devtmpfs `/init` mounts for itself first.
    let mounts = |root: &str| {
        format!(
            "mount -t devpts devpts {root}/dev/pts 2>/dev/null
mount -t tmpfs tmp {root}/tmp; mount -t tmpfs run {root}/run
mount -t tracefs tracefs {root}/sys/kernel/tracing; mount -t debugfs debugfs {root}/sys/kernel/debug
mount -t bpf bpf {root}/sys/fs/bpf; mount -t cgroup2 cgroup2 {root}/sys/fs/cgroup
"
        )
    };
    let run = match k.arch {
        Arch::X86_64 => format!(
            "mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev\n{}\
             mount -o bind /out /host/mnt\necho \"$(cat /proc/uptime)\" > /out/booted\n\
             chroot /host /bin/sh /mnt/run.sh > /out/run.log 2>&1\n",
            mounts("/host")
        ),
        Arch::Arm64 => format!(
            "mkdir -p /tmp /run /root /mnt /lib /usr/lib/aarch64-linux-gnu /dev/pts
{}ln -s /host/work /work; ln -s /host/opt /opt; ln -s /host/usr/aarch64-linux-gnu /usr/aarch64-linux-gnu
ln -s /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 /lib/ld-linux-aarch64.so.1
ln -s /usr/aarch64-linux-gnu/lib /lib/aarch64-linux-gnu
ln -s /opt/gpu-tracer/arm64/libcuda.so.1 /usr/lib/aarch64-linux-gnu/libcuda.so.1
mount -o bind /out /mnt
echo \"$(cat /proc/uptime)\" > /out/booted
/bin/sh /mnt/run.sh > /out/run.log 2>&1
",
            mounts("")
        ),
    };
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
ip link set lo up
for m in {modules}; do insmod /mods/$m.ko || echo "insmod $m failed" > /dev/console; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 hostroot /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out
{run}echo $? > /out/rc
poweroff -f
"#,
        modules = modules.join(" ")
    )
}

/// A gzip'd newc initramfs: static busybox, the modules, `/init`. Rebuilt on every run (about a
/// second), so a changed `/init` never meets a stale image.
fn initramfs(k: &Kernel) -> anyhow::Result<PathBuf> {
    let out = Path::new(CACHE).join(format!("initrd-{}.gz", k.version));
    let dir = Path::new(CACHE).join(format!("initrd-{}", k.version));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["bin", "mods", "proc", "sys", "dev", "host", "out"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::copy(&k.busybox, dir.join("bin/busybox"))
        .with_context(|| format!("{}: busybox-static (cargo xtask setup installs it)", k.busybox.display()))?;
    // Modules built into this kernel (arm64's virtio core) are not loaded.
    let builtin = std::fs::read_to_string(k.modules.join("modules.builtin")).unwrap_or_default();
    let mut loaded = Vec::new();
    for m in MODULES {
        match find_module(&k.modules, m) {
            Some(found) => {
                std::fs::copy(&found, dir.join(format!("mods/{m}.ko")))?;
                loaded.push(*m);
            }
            None if builtin.lines().any(|l| l.ends_with(&format!("/{m}.ko"))) => {}
            None => bail!("module {m}.ko not in {}", k.modules.display()),
        }
    }
    let init = dir.join("init");
    std::fs::write(&init, init_script(k, &loaded))?;
    cmd::run(Command::new("chmod").arg("755").arg(&init))?;
    let script =
        format!("cd {} && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > {}", dir.display(), out.display());
    cmd::run(Command::new("sh").args(["-c", &script]))?;
    Ok(out)
}

fn find_module(dir: &Path, name: &str) -> Option<PathBuf> {
    let want = format!("{name}.ko");
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == want.as_str()) {
                return Some(p);
            }
        }
    }
    None
}

/// The guest script's lines that set `sysctls` (`KEY=VALUE` each) and print what they read back;
/// a sysctl that cannot be set ends the script (every test file then counts as failed).
fn sysctl_lines(sysctls: &[String]) -> anyhow::Result<String> {
    let mut out = String::new();
    for s in sysctls {
        let (key, value) = s
            .split_once('=')
            .filter(|(k, v)| {
                !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                    && !v.is_empty()
                    && !v.contains('\'')
            })
            .ok_or_else(|| anyhow!("--sysctl {s:?}: expected KEY=VALUE, e.g. kernel.perf_event_paranoid=2"))?;
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let _ = writeln!(
            out,
            "echo '{value}' > {path} || {{ echo 'sysctl {key} could not be set'; exit 1; }}\n\
             echo \"sysctl {key}=$(cat {path})\""
        );
    }
    Ok(out)
}

/// What one guest boot left behind.
pub struct GuestRun {
    /// The guest's kernel version (`6.1.0-57-amd64`).
    pub version: String,
    /// `target/kernel-matrix/<version>/`: logs, `results`, `console.log`, `doctor.json`.
    pub out: PathBuf,
    /// Each test file asked for, in order.
    pub files: Vec<GuestFile>,
    /// The `results` file the guest wrote (`NAME RC` a line).
    results: String,
    /// How long QEMU ran, and how it ended.
    pub guest_s: f64,
    qemu: std::process::ExitStatus,
    limit: Duration,
}

/// One test file's run in the guest.
pub struct GuestFile {
    pub name: String,
    /// The exit status the guest recorded; `None`: the guest never got to record one.
    pub rc: Option<String>,
    /// The test executable's output.
    pub log: String,
}

impl GuestFile {
    pub fn ok(&self) -> bool {
        self.rc.as_deref() == Some("0")
    }

    /// libtest's `test result:` line, or a note that there is none.
    pub fn summary(&self) -> &str {
        self.log.lines().rev().find(|l| l.starts_with("test result:")).unwrap_or("no test result line")
    }
}

impl GuestRun {
    /// An error when the guest ended before it recorded every step (`steps`: the test files and
    /// the bench, if any), naming the limit and the console log.
    pub fn unfinished(&self, steps: usize) -> Option<anyhow::Error> {
        (!self.qemu.success() && self.results.lines().count() < steps).then(|| {
            anyhow!(
                "the guest did not finish (qemu {}, limit {} s); see {}",
                self.qemu,
                self.limit.as_secs(),
                self.out.join("console.log").display()
            )
        })
    }
}

/// `cargo xtask kernel-matrix`.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let g = boot(opts)?;
    let mut failed = Vec::new();
    let mut report = String::new();
    for f in &g.files {
        if !f.ok() {
            failed.push(f.name.clone());
        }
        let _ = writeln!(
            &mut report,
            "kernel-matrix: {} {}: {} ({}); log {}",
            g.version,
            f.name,
            if f.ok() { "ok" } else { "FAILED" },
            f.summary(),
            g.out.join(format!("{}.log", f.name)).display()
        );
        if !f.ok() {
            for l in f.log.lines().filter(|l| l.contains("panicked") || l.ends_with("FAILED")).take(10) {
                let _ = writeln!(&mut report, "    {l}");
            }
        }
    }
    if opts.bench_driver_entry {
        let rc = g.results.lines().find_map(|l| l.strip_prefix("bench ")).map(str::trim);
        let table = std::fs::read_to_string(g.out.join("bench-driver-entry.md")).unwrap_or_default();
        if rc == Some("0") {
            let _ = writeln!(&mut report, "{table}");
        } else {
            failed.push("gpu-tracer-bench driver-entry".into());
            let err = std::fs::read_to_string(g.out.join("bench-driver-entry.err")).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(10).collect();
            let _ = writeln!(&mut report, "kernel-matrix: bench FAILED (rc {rc:?}):");
            for l in tail.into_iter().rev() {
                let _ = writeln!(&mut report, "    {l}");
            }
        }
    }
    print!("{report}");
    println!(
        "kernel-matrix: guest ran {:.0} s (qemu {}), {:.0} s in all",
        g.guest_s,
        g.qemu,
        started.elapsed().as_secs_f64()
    );
    if let Some(e) = g.unfinished(g.files.len() + usize::from(opts.bench_driver_entry)) {
        return Err(e);
    }
    if !failed.is_empty() {
        bail!("on kernel {}: {} failed", g.version, failed.join(", "));
    }
    Ok(())
}

/// Builds what `opts` needs, boots the guest, runs the test files (and the bench) there and
/// collects what they left; whether they passed is the caller's to judge.
pub fn boot(opts: &Options) -> anyhow::Result<GuestRun> {
    let env = setup::run_setup()?;
    if opts.arch == Arch::Arm64 {
        setup::arm64_setup()?;
    }
    let k = kernel(opts.arch)?;
    let initrd = initramfs(&k)?;
    let default = if opts.arch == Arch::Arm64 { DEFAULT_TESTS_ARM64 } else { DEFAULT_TESTS };
    let tests: Vec<String> = if opts.tests.is_empty() && !opts.bench_driver_entry {
        default.iter().map(|s| s.to_string()).collect()
    } else {
        opts.tests.clone()
    };
    if opts.kmod || opts.bench_driver_entry || tests.iter().any(|t| KMOD_TESTS.contains(&t.as_str())) {
        if opts.arch != Arch::X86_64 {
            bail!(
                "the kernel-module driver double is built for the x86-64 guest only (drop --kmod and {KMOD_TESTS:?})"
            );
        }
        let dir = kmod::build()?;
        let version = dir.file_name().map(|v| v.to_string_lossy().into_owned());
        if version.as_deref() != Some(k.version.as_str()) {
            bail!("cause: the modules were built for {version:?}, the guest boots {}", k.version);
        }
    }

    // The binaries the tests run, and the test executables (cross-built for arm64).
    let target: &[&str] = if opts.arch == Arch::Arm64 { &["--target", setup::ARM64_TARGET] } else { &[] };
    let bin_dir = match opts.arch {
        Arch::X86_64 => cmd::workspace_root().join("target/release"),
        Arch::Arm64 => cmd::workspace_root().join("target").join(setup::ARM64_TARGET).join("release"),
    };
    let mut build = env.cargo();
    build.args(["build", "--release"]).args(target);
    if opts.arch == Arch::Arm64 {
        build.args(["-p", "gpu-tracer", "-p", "gpu-tracer-tests", "-p", "fake-nvml"]);
    }
    cmd::run(&mut build)?;
    let exes: Vec<(String, PathBuf)> = if tests.is_empty() {
        Vec::new()
    } else {
        let mut b = env.cargo();
        b.args(["test", "--release", "--no-run"]).args(target);
        // On x86-64 the whole workspace's features, as `cargo xtask test` builds them (`-p` alone
        // unifies them differently and rebuilds the agent and the tests, two minutes here).
        if opts.arch == Arch::Arm64 {
            b.args(["-p", "gpu-tracer-tests"]);
        }
        for t in &tests {
            b.args(["--test", t]);
        }
        reliability::test_executables(&mut b)?
            .into_iter()
            .filter(|(kind, name, _, _)| kind == "test" && tests.contains(name))
            .map(|(_, name, exe, _)| (name, exe))
            .collect()
    };
    if exes.len() != tests.len() {
        bail!("found {} of the {} test executables asked for ({})", exes.len(), tests.len(), tests.join(", "));
    }

    let out = cmd::workspace_root().join("target/kernel-matrix").join(&k.version);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // TCG runs x86-64 about ten times slower than this machine, arm64 about twice that again.
    let time_scale = if opts.arch == Arch::Arm64 { 8 } else { 4 };
    let mut script = format!(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
         GPU_TRACER_REQUIRE_PRIVILEGED=1 GPU_TRACER_TEST_TIME_SCALE={time_scale}\n",
    );
    script.push_str(&format!(
        "cd {}\necho \"kernel $(uname -r) $(uname -m)\"\n{} doctor --json > /mnt/doctor.json 2> /mnt/doctor.err\n",
        cmd::workspace_root().display(),
        bin_dir.join("gpu-tracer").display()
    ));
    script.push_str(&sysctl_lines(&opts.sysctls)?);
    let args: Vec<String> = opts.test_args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    for (name, exe) in &exes {
        let guest_only = if KMOD_TESTS.contains(&name.as_str()) { " --include-ignored" } else { "" };
        script.push_str(&format!(
            "echo \"== {name} $(cut -d' ' -f1 /proc/uptime)\"\n{} --test-threads 1{guest_only} {} > /mnt/{name}.log 2>&1\n\
             echo \"{name} $?\" >> /mnt/results\n",
            exe.display(),
            args.join(" ")
        ));
    }
    if opts.bench_driver_entry {
        script.push_str(&format!(
            "echo \"== bench $(cut -d' ' -f1 /proc/uptime)\"\n{} driver-entry > /mnt/bench-driver-entry.md \
             2> /mnt/bench-driver-entry.err\necho \"bench $?\" >> /mnt/results\n",
            bin_dir.join("gpu-tracer-bench").display()
        ));
    }
    std::fs::write(out.join("run.sh"), script)?;

    // About ten times this machine's time under TCG (arm64 on x86-64 about twice that again); the
    // slowest file here takes minutes.
    let per_file = if opts.arch == Arch::Arm64 { 1500 } else { 300 };
    let bench_s = if opts.bench_driver_entry { 1800 } else { 0 };
    let limit = Duration::from_secs(per_file * exes.len() as u64 + bench_s + 120);
    let (system, machine, console): (&str, &[&str], &str) = match opts.arch {
        Arch::X86_64 => ("qemu-system-x86_64", &[], "ttyS0"),
        // `virt` with `-cpu max`: pointer authentication and BTI are emulated, as on Grace.
        Arch::Arm64 => ("qemu-system-aarch64", &["-M", "virt"], "ttyAMA0"),
    };
    let mut qemu = Command::new("timeout");
    qemu.arg(limit.as_secs().to_string())
        .arg(system)
        .args(machine)
        .args(["-accel", "tcg", "-cpu", "max", "-m", "4G", "-smp", "2"])
        .args(["-nographic", "-no-reboot", "-net", "none", "-kernel"])
        .arg(&k.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &format!("console={console} panic=-1 quiet")])
        .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap"])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=out,security_model=passthrough", out.display()));
    let console = std::fs::File::create(out.join("console.log"))?;
    qemu.stdout(console.try_clone()?).stderr(console);
    println!("+ {}  (console: {})", cmd::display(&qemu), out.join("console.log").display());
    let boot = Instant::now();
    let st = qemu.status().with_context(|| format!("starting {system} (cargo xtask setup installs it)"))?;
    let guest_s = boot.elapsed().as_secs_f64();

    let results = std::fs::read_to_string(out.join("results")).unwrap_or_default();
    let files = exes
        .iter()
        .map(|(name, _)| GuestFile {
            name: name.clone(),
            rc: results.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).map(|r| r.trim().to_string()),
            log: std::fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default(),
        })
        .collect();
    Ok(GuestRun { version: k.version, out, files, results, guest_s, qemu: st, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctls_become_checked_writes() {
        let lines = sysctl_lines(&["kernel.perf_event_paranoid=2".into()]).unwrap();
        assert!(lines.contains("echo '2' > /proc/sys/kernel/perf_event_paranoid || {"), "{lines}");
        assert!(lines.contains("exit 1"), "{lines}");
        for bad in ["=2", "kernel.x", "kernel.x=", "kernel/../x=1", "kernel.x=a'b", "a b=1"] {
            let e = sysctl_lines(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("expected KEY=VALUE"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_arm64_guest_runs_in_its_initramfs_with_the_hosts_files_linked_in() {
        let k = |arch| Kernel {
            arch,
            busybox: PathBuf::from("/bin/busybox"),
            version: "v".into(),
            vmlinuz: PathBuf::new(),
            modules: PathBuf::new(),
        };
        let arm = init_script(&k(Arch::Arm64), &["9p"]);
        assert!(!arm.contains("chroot"), "{arm}");
        assert!(arm.contains("ln -s /opt/gpu-tracer/arm64/libcuda.so.1 /usr/lib/aarch64-linux-gnu/libcuda.so.1"));
        assert!(arm.contains("ln -s /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 /lib/ld-linux-aarch64.so.1"));
        assert!(arm.contains("mount -t cgroup2 cgroup2 /sys/fs/cgroup"), "{arm}");
        let x86 = init_script(&k(Arch::X86_64), &["9p"]);
        assert!(x86.contains("chroot /host /bin/sh /mnt/run.sh"), "{x86}");
        assert!(x86.contains("mount -t cgroup2 cgroup2 /host/sys/fs/cgroup"), "{x86}");
    }
}
