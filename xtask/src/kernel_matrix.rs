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
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, bail};

use crate::{cmd, reliability, setup};

/// Where the kernel package is unpacked and the initramfs built.
const CACHE: &str = "/opt/gpu-tracer/qemu";
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

pub struct Options {
    /// Root test files (`tests/tests/NAME.rs`) to run; empty: [`DEFAULT_TESTS`].
    pub tests: Vec<String>,
    /// Arguments for each test executable (a filter, `--exact NAME`).
    pub test_args: Vec<String>,
}

/// The kernel to boot: its version, `vmlinuz`, and modules directory.
struct Kernel {
    version: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
}

/// The kernel package `linux-image-amd64` depends on, unpacked under [`CACHE`].
fn kernel() -> anyhow::Result<Kernel> {
    let deps = cmd::output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| anyhow!("`apt-cache depends linux-image-amd64` names no linux-image package: {deps}"))?
        .to_string();
    let version = package.trim_start_matches("linux-image-").to_string();
    let root = Path::new(CACHE).join(&version);
    let vmlinuz = root.join(format!("boot/vmlinuz-{version}"));
    let modules = root.join(format!("lib/modules/{version}"));
    if !vmlinuz.is_file() || !modules.is_dir() {
        let dl = Path::new(CACHE).join("download");
        std::fs::create_dir_all(&dl)?;
        cmd::run(Command::new("apt-get").current_dir(&dl).args([
            "-qq",
            "-o",
            "APT::Sandbox::User=root",
            "download",
            &package,
        ]))
        .map_err(|e| anyhow!("{e:#}; fix: check network access to the Debian mirror"))?;
        let deb = std::fs::read_dir(&dl)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_"))))
            .ok_or_else(|| anyhow!("apt-get download left no {package} .deb in {}", dl.display()))?;
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let _ = std::fs::remove_file(&deb);
    }
    Ok(Kernel { version, vmlinuz, modules })
}

/// The guest's `/init`: mount, load modules, share the host root, run `/mnt/run.sh` in it.
fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
ip link set lo up
for m in {modules}; do insmod /mods/$m.ko || echo "insmod $m failed" > /dev/console; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 hostroot /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
mount -t devpts devpts /host/dev/pts 2>/dev/null
mount -t tmpfs tmp /host/tmp; mount -t tmpfs run /host/run
mount -t tracefs tracefs /host/sys/kernel/tracing; mount -t debugfs debugfs /host/sys/kernel/debug
mount -t bpf bpf /host/sys/fs/bpf; mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mount -o bind /out /host/mnt
echo "$(cat /proc/uptime)" > /out/booted
chroot /host /bin/sh /mnt/run.sh > /out/run.log 2>&1
echo $? > /out/rc
poweroff -f
"#,
        modules = MODULES.join(" ")
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
    std::fs::copy("/bin/busybox", dir.join("bin/busybox")).context("busybox-static (cargo xtask setup installs it)")?;
    for m in MODULES {
        let found =
            find_module(&k.modules, m).ok_or_else(|| anyhow!("module {m}.ko not in {}", k.modules.display()))?;
        std::fs::copy(&found, dir.join(format!("mods/{m}.ko")))?;
    }
    let init = dir.join("init");
    std::fs::write(&init, init_script())?;
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

/// `cargo xtask kernel-matrix`.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let env = setup::run_setup()?;
    let k = kernel()?;
    let initrd = initramfs(&k)?;
    let tests: Vec<String> =
        if opts.tests.is_empty() { DEFAULT_TESTS.iter().map(|s| s.to_string()).collect() } else { opts.tests.clone() };

    // The binaries the tests run, and the test executables.
    cmd::run(env.cargo().args(["build", "--release"]))?;
    let mut b = env.cargo();
    b.args(["test", "--release", "--no-run", "-p", "gpu-tracer-tests"]);
    for t in &tests {
        b.args(["--test", t]);
    }
    let exes: Vec<(String, PathBuf)> = reliability::test_executables(&mut b)?
        .into_iter()
        .filter(|(kind, name, _, _)| kind == "test" && tests.contains(name))
        .map(|(_, name, exe, _)| (name, exe))
        .collect();
    if exes.len() != tests.len() {
        bail!("found {} of the {} test executables asked for ({})", exes.len(), tests.len(), tests.join(", "));
    }

    let out = cmd::workspace_root().join("target/kernel-matrix").join(&k.version);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let mut script = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
         GPU_TRACER_REQUIRE_PRIVILEGED=1 GPU_TRACER_TEST_TIME_SCALE=4\n",
    );
    script.push_str(&format!("cd {}\necho \"kernel $(uname -r)\"\n", cmd::workspace_root().display()));
    let args: Vec<String> = opts.test_args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    for (name, exe) in &exes {
        script.push_str(&format!(
            "echo \"== {name} $(cut -d' ' -f1 /proc/uptime)\"\n{} --test-threads 1 {} > /mnt/{name}.log 2>&1\n\
             echo \"{name} $?\" >> /mnt/results\n",
            exe.display(),
            args.join(" ")
        ));
    }
    std::fs::write(out.join("run.sh"), script)?;

    // About ten times this machine's time under TCG; the slowest file here takes minutes.
    let limit = Duration::from_secs(300 * exes.len() as u64 + 120);
    let mut qemu = Command::new("timeout");
    qemu.arg(limit.as_secs().to_string())
        .args(["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "4G", "-smp", "2"])
        .args(["-nographic", "-no-reboot", "-net", "none", "-kernel"])
        .arg(&k.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap"])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=out,security_model=passthrough", out.display()));
    let console = std::fs::File::create(out.join("console.log"))?;
    qemu.stdout(console.try_clone()?).stderr(console);
    println!("+ {}  (console: {})", cmd::display(&qemu), out.join("console.log").display());
    let boot = Instant::now();
    let st = qemu.status().context("starting qemu-system-x86_64 (cargo xtask setup installs qemu-system-x86)")?;
    let guest_s = boot.elapsed().as_secs_f64();

    let results = std::fs::read_to_string(out.join("results")).unwrap_or_default();
    let mut failed = Vec::new();
    let mut report = String::new();
    for (name, _) in &exes {
        let log = std::fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default();
        let summary = log.lines().rev().find(|l| l.starts_with("test result:")).unwrap_or("no test result line");
        let rc = results.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).map(str::trim);
        let ok = rc == Some("0");
        if !ok {
            failed.push(name.clone());
        }
        let _ = writeln!(
            &mut report,
            "kernel-matrix: {} {name}: {} ({summary}); log {}",
            k.version,
            if ok { "ok" } else { "FAILED" },
            out.join(format!("{name}.log")).display()
        );
        if !ok {
            for l in log.lines().filter(|l| l.contains("panicked") || l.ends_with("FAILED")).take(10) {
                let _ = writeln!(&mut report, "    {l}");
            }
        }
    }
    print!("{report}");
    println!("kernel-matrix: guest ran {:.0} s (qemu {st}), {:.0} s in all", guest_s, started.elapsed().as_secs_f64());
    if !st.success() && results.lines().count() < exes.len() {
        bail!(
            "the guest did not finish (qemu {st}, limit {} s); see {}",
            limit.as_secs(),
            out.join("console.log").display()
        );
    }
    if !failed.is_empty() {
        bail!("on kernel {}: {} failed", k.version, failed.join(", "));
    }
    Ok(())
}
