//! `cargo xtask kernel-matrix`: the root end-to-end tests on a second kernel.
//!
//! Debian's packaged kernel (the package `linux-image-amd64` depends on: 6.1 on bookworm) boots
//! under QEMU with this machine's root file system shared read-only over 9p; the guest mounts
//! procfs, sysfs, devtmpfs, tracefs, bpffs and a cgroup2 hierarchy of its own over it, `chroot`s into
//! it and runs the test executables built here, one after the other, as root with
//! `GPU_TRACER_REQUIRE_PRIVILEGED=1`. A second, writable share (`target/kernel-matrix/`) carries the
//! script in and the logs and exit statuses out. KVM does not work on these VMs (they are PVM
//! guests), so QEMU runs with TCG (x86-64: `-cpu qemu64`, see [`Arch::default_cpu`]): slow, about
//! ten times this machine, but the same kernel code paths. The recipe, measured: `../shared/reference/platform-recipes.md`.
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
/// The kernel modules the guest needs: virtio PCI, 9p over virtio, and FUSE for the fake driver.
/// Each is loaded after the modules it depends on, as each module's own `depends=` says
/// ([`load_order`]; there is no modprobe in the initramfs): 5.10, 6.1 and 6.12 split them
/// differently (netfs appears in 5.13, the virtio PCI device helpers later).
const MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "fuse"];
/// The root test files run by default: the cuda family (perf-event fallback on 6.1), least
/// privilege, the driver family end to end, the command line.
pub const DEFAULT_TESTS: &[&str] = &["cuda", "least_privilege", "agent", "cli"];
/// On arm64: the driver family end to end and the cuda family (the fake libcuda in its arm64
/// prologue variants, and the real arm64 libcuda).
pub const DEFAULT_TESTS_ARM64: &[&str] = &["agent", "cuda"];
/// The root test files CI runs on Debian 11's 5.10 (`cargo xtask test`'s guest step): what differs
/// there — the cuda family without attach cookies (one program per entry point), the chart's
/// capabilities where map memory is charged to RLIMIT_MEMLOCK, and driver-entry mode on kprobes
/// (no module BTF, no `bpf_get_func_arg`) on the kernel-module double built for 5.10.
pub const OLD_KERNEL_TESTS: &[&str] = &["cuda", "least_privilege", "driver_entry", "driver_double"];
/// Root test files that need the kernel-module driver double built for the guest's kernel (6.1 or
/// 5.10). They cannot run on the host (its kernel cannot load modules built for another), so their tests are
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
    /// QEMU's CPU model for the guest. x86-64: `qemu64`, whose state the guest kernel saves with
    /// FXSAVE; under `max`, XSAVE of AVX-512 state on every context switch, emulated, made the 5.10
    /// guest's cuda file take 44 % longer (111 s against 77 s, measured twice; Haswell's AVX2 slower
    /// still). Nothing tested here depends on the CPU model: the verifier, helpers, attach types and
    /// the uprobe paths are the kernel's. arm64: `max`, for pointer authentication and BTI as on
    /// Grace.
    pub fn default_cpu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu64",
            Arch::Arm64 => "max",
        }
    }

    /// Debian's architecture name.
    fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
}

/// The Debian release whose packaged kernel the x86-64 guest boots.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Release {
    /// Debian 11 (bullseye): 5.10, as Amazon Linux 2 and Debian 11 nodes run; no attach cookies
    /// (5.15), map memory charged to RLIMIT_MEMLOCK (before 5.11), no `bpf_get_func_arg` (5.17).
    #[value(name = "5.10", alias = "bullseye")]
    Bullseye,
    /// Debian 12 (bookworm): 6.1, this machine's own release (the default; the kernel-module double
    /// is built for it).
    #[value(name = "6.1", alias = "bookworm")]
    Bookworm,
    /// Debian 13 (trixie): 6.12.
    #[value(name = "6.12", alias = "trixie")]
    Trixie,
}

impl Release {
    /// Debian's code name.
    pub fn suite(self) -> &'static str {
        match self {
            Release::Bullseye => "bullseye",
            Release::Bookworm => "bookworm",
            Release::Trixie => "trixie",
        }
    }

    /// The kernel's series, as `--kernel` takes it.
    pub fn series(self) -> &'static str {
        match self {
            Release::Bullseye => "5.10",
            Release::Bookworm => "6.1",
            Release::Trixie => "6.12",
        }
    }
}

pub struct Options {
    /// The Debian release whose kernel boots (x86-64 only; arm64 boots this machine's release's).
    pub release: Release,

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
    /// QEMU's CPU model (`-cpu`); `None`: [`Arch::default_cpu`].
    pub cpu: Option<String>,
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

/// The x86-64 kernel of `release` the guest boots: its version (`6.1.0-57-amd64`, the one
/// Debian's `linux-image-amd64` depends on) and its `vmlinuz`, unpacked into the cache if it is not
/// there yet.
pub fn x86_64_kernel(release: Release) -> anyhow::Result<(String, PathBuf)> {
    let k = kernel(Arch::X86_64, release)?;
    Ok((k.version, k.vmlinuz))
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

/// The kernel package `linux-image-<arch>` of `release` depends on, unpacked under [`CACHE`]; for
/// arm64 through a private apt configuration ([`setup::PrivateApt`]), which also brings the arm64
/// busybox; for a Debian release other than this machine's, through one with that release's sources.
fn kernel(arch: Arch, release: Release) -> anyhow::Result<Kernel> {
    let meta = format!("linux-image-{}", arch.debian());
    let apt = match (arch, release) {
        (Arch::Arm64, _) => Some(setup::PrivateApt::arm64()?),
        (Arch::X86_64, Release::Bookworm) => None,
        (Arch::X86_64, other) => Some(setup::PrivateApt::suite(other.suite())?),
    };
    let package = match &apt {
        Some(apt) if arch == Arch::Arm64 => apt.dependency(&format!("{meta}:arm64"), "linux-image-")?,
        Some(apt) => apt.dependency(&meta, "linux-image-")?,
        None => apt_dependency(&meta, "linux-image-")?,
    };
    let version = package.trim_start_matches("linux-image-").trim_end_matches(":arm64").to_string();
    let root = Path::new(CACHE).join(&version);
    let vmlinuz = root.join(format!("boot/vmlinuz-{version}"));
    // Trixie's packages install under /usr (merged /usr): its modules are in usr/lib/modules.
    let modules_at = |root: &Path| {
        let usr = root.join(format!("usr/lib/modules/{version}"));
        if usr.is_dir() { usr } else { root.join(format!("lib/modules/{version}")) }
    };
    let mut modules = modules_at(&root);
    if !vmlinuz.is_file() || !modules.is_dir() {
        match &apt {
            Some(apt) => apt
                .unpack(&package, &root)
                .map_err(|e| anyhow!("{e:#}; fix: check network access to the Debian mirror"))?,
            None => download_and_unpack(&package, &root)?,
        }
        modules = modules_at(&root);
    }
    if let (Arch::Arm64, Some(apt)) = (arch, &apt) {
        let busybox = Path::new(CACHE).join("busybox-arm64");
        if !busybox.join("bin/busybox").is_file() {
            apt.unpack("busybox-static:arm64", &busybox)?;
        }
        return Ok(Kernel { arch, version, vmlinuz, modules, busybox: busybox.join("bin/busybox") });
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
    let files = module_files(&k.modules);
    let mut elves = std::collections::HashMap::new();
    let order = load_order(&builtin, MODULES, |name| {
        let path = files.get(name).ok_or_else(|| anyhow!("no {name}.ko under {}", k.modules.display()))?;
        let elf = module_elf(path)?;
        let deps = modinfo_depends(&elf);
        elves.insert(name.to_string(), elf);
        Ok(deps)
    })?;
    for name in &order {
        std::fs::write(dir.join(format!("mods/{name}.ko")), &elves[name])?;
    }
    let loaded: Vec<&str> = order.iter().map(String::as_str).collect();
    let init = dir.join("init");
    std::fs::write(&init, init_script(k, &loaded))?;
    cmd::run(Command::new("chmod").arg("755").arg(&init))?;
    let script =
        format!("cd {} && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > {}", dir.display(), out.display());
    cmd::run(Command::new("sh").args(["-c", &script]))?;
    Ok(out)
}

/// A module's name from its file name (`9p.ko.xz` → `9p`; dashes read as underscores, as the
/// kernel does).
fn module_name(file: &str) -> String {
    let file = file.rsplit('/').next().unwrap_or(file);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// Every module file under `dir` by module name (one walk).
fn module_files(dir: &Path) -> std::collections::HashMap<String, PathBuf> {
    let mut out = std::collections::HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push(p);
            } else if name.contains(".ko") {
                out.insert(module_name(&name), p);
            }
        }
    }
    out
}

/// A module file as plain ELF, as busybox's insmod takes it: Debian compresses modules from
/// trixie on (`.ko.xz`; `.zst` and `.gz` handled too).
fn module_elf(path: &Path) -> anyhow::Result<Vec<u8>> {
    let tool = match path.extension().and_then(|x| x.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        Some("gz") => "gzip",
        _ => return std::fs::read(path).with_context(|| format!("reading {}", path.display())),
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} -dc {} (cargo xtask setup installs it)", path.display()))?;
    if !out.status.success() {
        bail!("{tool} -dc {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// The modules a module needs loaded first: its `.modinfo` string `depends=a,b` (what depmod
/// reads; the unpacked package has no `modules.dep`, and this machine no depmod).
fn modinfo_depends(elf: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = elf.windows(key.len()).position(|w| w == key) else { return Vec::new() };
    let rest = &elf[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).split(',').filter(|d| !d.is_empty()).map(module_name).collect()
}

/// The modules to `insmod`, in order, for `wanted`: each after the modules it depends on
/// (`depends_of`), each once. A wanted module built into the kernel (`modules.builtin`) is left out.
fn load_order(
    builtin: &str,
    wanted: &[&str],
    mut depends_of: impl FnMut(&str) -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<Vec<String>> {
    fn visit(
        m: &str,
        depends_of: &mut dyn FnMut(&str) -> anyhow::Result<Vec<String>>,
        out: &mut Vec<String>,
        depth: usize,
    ) -> anyhow::Result<()> {
        if out.iter().any(|n| n == m) {
            return Ok(());
        }
        if depth > 32 {
            bail!("module dependencies: a cycle through {m}");
        }
        for d in depends_of(m)? {
            visit(&d, depends_of, out, depth + 1)?;
        }
        out.push(m.to_string());
        Ok(())
    }
    let mut out = Vec::new();
    for m in wanted {
        if !builtin.lines().any(|l| module_name(l.trim()) == *m) {
            visit(m, &mut depends_of, &mut out, 0)?;
        }
    }
    Ok(out)
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
    let k = kernel(opts.arch, opts.release)?;
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
        let dir = kmod::build(opts.release, &k.version, &k.vmlinuz)?;
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
        .args(["-accel", "tcg", "-cpu", opts.cpu.as_deref().unwrap_or(opts.arch.default_cpu())])
        .args(["-m", "4G", "-smp", "2"])
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
    fn modules_load_after_their_dependencies_each_once() {
        // 6.12's shape (netfs under 9p, the legacy virtio PCI helpers), trimmed.
        let deps = |m: &str| -> anyhow::Result<Vec<String>> {
            let d: &[&str] = match m {
                "9p" => &["netfs", "9pnet"],
                "9pnet_virtio" => &["9pnet", "virtio_ring"],
                "virtio_pci" => &["virtio_pci_legacy_dev", "virtio", "virtio_ring"],
                "virtio" => &["virtio_ring"],
                "netfs" | "9pnet" | "virtio_ring" | "virtio_pci_legacy_dev" | "fuse" => &[],
                other => bail!("no {other}.ko"),
            };
            Ok(d.iter().map(|s| s.to_string()).collect())
        };
        let order = load_order("", MODULES, deps).unwrap();
        assert_eq!(
            order,
            [
                "virtio_pci_legacy_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "9p",
                "fuse"
            ]
        );
        // Built in: left out (arm64's virtio core); missing altogether: named.
        let order = load_order("kernel/fs/fuse/fuse.ko\nkernel/drivers/virtio/virtio_pci.ko\n", MODULES, deps).unwrap();
        assert_eq!(order, ["9pnet", "virtio_ring", "9pnet_virtio", "netfs", "9p"]);
        let e = load_order("", &["overlay"], deps).unwrap_err().to_string();
        assert!(e.contains("no overlay.ko"), "{e}");
        assert_eq!(module_name("kernel/drivers/virtio/virtio-mmio.ko.zst"), "virtio_mmio");
        let elf = b"\x7fELF...\0license=GPL\0depends=9pnet,netfs\0retpoline=Y\0";
        assert_eq!(modinfo_depends(elf), ["9pnet", "netfs"]);
        assert!(modinfo_depends(b"\0depends=\0name=fuse\0").is_empty());
    }

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
