//! SIGKILL at every stage (issue 13): the real agent binary (`gpu-tracer agent`, every probe family
//! on, cuda included) is killed while it loads its BPF object, while it attaches the probes, while
//! it scans /proc and while it runs, plus at spread-out delays after spawn so the start-up is
//! covered where a stage is too short to aim at. Nothing it made may outlive it: no BPF program,
//! map or link, no uprobe/kprobe event in tracefs, no pinned file under /sys/fs/bpf.
//!
//! Each kill is aimed by watching the agent's fd table (BPF maps, programs and links appear as it
//! loads and attaches; the /proc scan holds `/proc` open) and its log; the agent is then stopped
//! (SIGSTOP), the stage it is in is read from its fds, memory maps and log, and it is killed
//! (SIGKILL) in that very state. After it is reaped, the kernel's objects are compared with a
//! baseline taken before the first start: an object that is new, held by no live process (directly
//! or through a link or program that is) and still there after the grace period is a leftover.
//! Objects other processes hold (a test run beside this one) are not.
//!
//! Keep this the only test in this file: nothing else in this binary may load BPF objects meanwhile.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpu_tracer_tests::http::get as http_get;
use gpu_tracer_tests::{AgentProcess, FakeDriver, Workload, gpu_tracer, require_root};

/// How long the kernel may take to free a dead agent's objects (programs are freed after an RCU
/// grace period, from a workqueue).
const RELEASE_GRACE: Duration = Duration::from_secs(3);
/// The agent's start-up, at most (it takes about a second here).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle fds this test holds so the agent's /proc scan (a readlink per fd of every process) lasts
/// long enough to be caught.
const SCAN_BALLAST_FDS: u64 = 10_000;
/// The object's own maps number about fifteen; aya's feature probes hold one or two at a time.
const OBJECT_MAPS_AT_LEAST: usize = 8;

/// Where the agent was when it was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Exec and configuration: no BPF object yet.
    Starting,
    /// Loading the BPF object: feature probes, BTF, the object's maps created and filled.
    Loading,
    /// Programs loaded into the kernel and attached (tracepoints, libcuda uprobes).
    Attaching,
    /// Ring buffer mapped, /proc being scanned for NVIDIA fds opened before the agent.
    Scanning,
    /// Start-up done (the scan logged): Kubernetes, the HTTP server, the main loop.
    Running,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Starting => "starting",
            Stage::Loading => "loading",
            Stage::Attaching => "attaching",
            Stage::Scanning => "scanning",
            Stage::Running => "running",
        })
    }
}

/// What a kill waits for.
#[derive(Clone, Copy, Debug)]
enum Aim {
    /// This long after spawn, wherever the agent is.
    After(Duration),
    /// The first moment `pred` holds for the agent's fds.
    When(&'static str, fn(&Fds) -> bool),
    /// The agent serves /healthz.
    Ready,
}

impl fmt::Display for Aim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Aim::After(d) => write!(f, "{} ms after spawn", d.as_millis()),
            Aim::When(what, _) => write!(f, "when {what}"),
            Aim::Ready => f.write_str("once ready"),
        }
    }
}

/// The BPF-related part of a process's fd table.
#[derive(Clone, Debug, Default)]
struct Fds {
    maps: usize,
    progs: usize,
    links: usize,
    btf: usize,
    perf_events: usize,
    /// A directory under /proc is open: `/proc` itself or a process's `fd` directory (the scan).
    proc_dir: bool,
}

impl Fds {
    fn of(pid: u32) -> Fds {
        let mut f = Fds::default();
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return f };
        for e in rd.flatten() {
            let Ok(t) = std::fs::read_link(e.path()) else { continue };
            match t.to_string_lossy().as_ref() {
                "anon_inode:bpf-map" => f.maps += 1,
                "anon_inode:bpf-prog" => f.progs += 1,
                "anon_inode:bpf_link" => f.links += 1,
                "anon_inode:btf" => f.btf += 1,
                "anon_inode:[perf_event]" => f.perf_events += 1,
                t if t == "/proc" || (t.starts_with("/proc/") && t.ends_with("/fd")) => f.proc_dir = true,
                _ => {}
            }
        }
        f
    }

    fn any_bpf(&self) -> bool {
        self.maps + self.progs + self.links + self.btf > 0
    }

    fn object_loaded(&self) -> bool {
        self.maps >= OBJECT_MAPS_AT_LEAST
    }
}

/// Does `pid` have a BPF map mapped into memory (the ring buffer, the tracked-process array)?
fn bpf_map_mapped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.lines().any(|l| l.ends_with("bpf-map")))
}

/// The stage of a stopped agent, from its fds, memory maps and log.
fn stage_of(pid: u32, fds: &Fds, log: &[String]) -> Stage {
    let logged = |s: &str| log.iter().any(|l| l.contains(s));
    if logged("seeded NVIDIA fds") || logged("probes loaded") || logged("serving http") {
        Stage::Running
    } else if fds.proc_dir || (fds.object_loaded() && bpf_map_mapped(pid)) {
        Stage::Scanning
    } else if fds.object_loaded() && fds.progs + fds.links + fds.perf_events > 0 {
        Stage::Attaching
    } else if fds.any_bpf() {
        Stage::Loading
    } else {
        Stage::Starting
    }
}

/// A `gpu-tracer agent` child, aimed at; stopped and reaped on drop ([`AgentProcess`]).
struct Agent {
    process: AgentProcess,
    spawned: Instant,
}

impl Agent {
    fn spawn(dev_dir: &Path) -> Agent {
        let process = AgentProcess::spawn(
            Command::new(gpu_tracer())
                .args(["--log", "info", "--nvml", "off", "--dev-dir"])
                .arg(dev_dir)
                .args(["--simulated-devices", "agent", "--listen", "127.0.0.1:0", "--grpc-listen", "off"])
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
        )
        .expect("spawn gpu-tracer agent")
        .patience(START_TIMEOUT);
        Agent { process, spawned: Instant::now() }
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn log(&self) -> Vec<String> {
        self.process.log()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.try_wait()
    }

    /// Wait for `aim` (panics if the agent ends first or takes too long); once ready, the HTTP
    /// address.
    fn wait_for(&mut self, aim: Aim) -> Option<String> {
        match aim {
            Aim::After(d) => std::thread::sleep(d.saturating_sub(self.spawned.elapsed())),
            Aim::When(what, pred) => loop {
                if pred(&Fds::of(self.pid())) {
                    return None;
                }
                self.check_alive(what);
                std::thread::sleep(Duration::from_micros(200));
            },
            Aim::Ready => {
                let addr = self.process.metrics_addr().unwrap_or_else(|e| panic!("serving http: {e}"));
                while http_get(&addr, "/healthz").0 != 200 {
                    self.check_alive("/healthz");
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Some(addr);
            }
        }
        None
    }

    fn check_alive(&mut self, waiting_for: &str) {
        if let Some(status) = self.exited() {
            panic!("the agent ended ({status}) while the test waited for {waiting_for}: {:#?}", self.log());
        }
        assert!(
            self.spawned.elapsed() < START_TIMEOUT,
            "no {waiting_for} within {START_TIMEOUT:?} of spawn: {:#?}",
            self.log()
        );
    }

    /// SIGSTOP, wait until every thread is stopped, and let the log reader catch up: how long
    /// after spawn the signal was sent.
    fn stop(&mut self) -> Duration {
        let at = self.spawned.elapsed();
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(self.pid() as i32, libc::SIGSTOP) };
        let t = Instant::now();
        let stopped = |pid: u32| {
            let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
            rd.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(String::from))
                    })
                    .is_some_and(|state| state == "T" || state == "t")
            })
        };
        while !stopped(self.pid()) {
            assert!(self.exited().is_none(), "the agent ended before SIGSTOP took: {:#?}", self.log());
            assert!(t.elapsed() < Duration::from_secs(10), "the agent did not stop within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Everything it logged is in the pipe; the reader thread takes it in a moment.
        std::thread::sleep(Duration::from_millis(50));
        at
    }

    /// SIGKILL and reap: how long the exit took (the kernel detaches the probes as the fds close).
    fn kill(self) -> Duration {
        let t = Instant::now();
        let status = self.process.kill().expect("reap the agent");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "the agent died of the SIGKILL: {status}"
        );
        t.elapsed()
    }
}

/// The probe families up, from the agent's /metrics (`driver:1,lifecycle:1,cuda:1`).
fn families_up(addr: &str) -> String {
    let t = Instant::now();
    loop {
        let (status, body) = http_get(addr, "/metrics");
        if status == 200 {
            let up: Vec<String> = body
                .lines()
                .filter_map(|l| l.strip_prefix("gpu_tracer_probe_family_up{family=\""))
                .filter_map(|l| l.split_once("\"} "))
                .map(|(family, v)| format!("{family}:{v}"))
                .collect();
            return up.join(",");
        }
        assert!(t.elapsed() < Duration::from_secs(10), "/metrics answered {status} for 10 s: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A program: its name and the maps it uses.
#[derive(Clone, Debug)]
struct Prog {
    name: String,
    maps: Vec<u32>,
}

/// A link: its type and program.
#[derive(Clone, Debug)]
struct Link {
    kind: String,
    prog: u32,
}

/// The kernel objects a BPF user can leave behind, as seen now.
#[derive(Clone, Debug, Default)]
struct KernelObjects {
    programs: BTreeMap<u32, Prog>,
    maps: BTreeMap<u32, String>,
    links: BTreeMap<u32, Link>,
    /// `file: line` of every uprobe/kprobe/dynamic event defined in tracefs.
    tracefs_events: BTreeSet<String>,
    /// Every file under /sys/fs/bpf.
    pins: BTreeSet<PathBuf>,
}

/// Tracefs files that list probe events (tracefs and its older debugfs place).
const TRACEFS_EVENT_FILES: &[&str] = &[
    "/sys/kernel/tracing/uprobe_events",
    "/sys/kernel/tracing/kprobe_events",
    "/sys/kernel/tracing/dynamic_events",
    "/sys/kernel/debug/tracing/uprobe_events",
    "/sys/kernel/debug/tracing/kprobe_events",
    "/sys/kernel/debug/tracing/dynamic_events",
];

/// An object freed between its id and its fd being read (ENOENT somewhere in the error's chain):
/// not an error of the enumeration.
fn is_gone(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source())
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(libc::ENOENT)))
}

impl KernelObjects {
    /// Enumerate through the bpf() syscall (BPF_*_GET_NEXT_ID, then each object's info) and read
    /// tracefs and bpffs. Panics if the kernel refuses the enumeration itself.
    fn now() -> KernelObjects {
        let mut k = KernelObjects::default();
        for p in aya::programs::loaded_programs() {
            match p {
                Ok(p) => {
                    let maps = p.map_ids().ok().flatten().unwrap_or_default();
                    let name = p.name_as_str().unwrap_or("?").to_string();
                    k.programs.insert(p.id(), Prog { name, maps });
                }
                Err(e) if is_gone(&e) => {}
                Err(e) => panic!("enumerating BPF programs: {e}"),
            }
        }
        for m in aya::maps::loaded_maps() {
            match m {
                Ok(m) => {
                    k.maps.insert(m.id(), m.name_as_str().unwrap_or("?").to_string());
                }
                Err(e) if is_gone(&e) => {}
                Err(e) => panic!("enumerating BPF maps: {e}"),
            }
        }
        for l in aya::programs::loaded_links() {
            match l {
                Ok(l) => {
                    let kind = l.link_type().map_or_else(|e| e.to_string(), |t| format!("{t:?}"));
                    k.links.insert(l.id(), Link { kind, prog: l.program_id() });
                }
                Err(e) if is_gone(&e) => {}
                Err(e) => panic!("enumerating BPF links: {e}"),
            }
        }
        for file in TRACEFS_EVENT_FILES {
            if let Ok(text) = std::fs::read_to_string(file) {
                k.tracefs_events.extend(text.lines().filter(|l| !l.trim().is_empty()).map(|l| format!("{file}: {l}")));
            }
        }
        walk(Path::new("/sys/fs/bpf"), &mut k.pins);
        k
    }
}

fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, out);
        }
        out.insert(p);
    }
}

/// BPF objects some live process holds: through an fd (`prog_id`, `map_id`, `link_id` in its
/// fdinfo), or through a held link (its program) or a held program (its maps).
#[derive(Default)]
struct Held {
    programs: BTreeSet<u32>,
    maps: BTreeSet<u32>,
    links: BTreeSet<u32>,
}

fn held(objects: &KernelObjects) -> Held {
    let mut h = Held::default();
    let Ok(procs) = std::fs::read_dir("/proc") else { return h };
    for p in procs.flatten() {
        if let Some(pid) = p.file_name().to_str().and_then(|n| n.parse().ok()) {
            held_directly(pid, &mut h);
        }
    }
    h.programs.extend(h.links.iter().filter_map(|l| objects.links.get(l)).map(|l| l.prog));
    h.maps.extend(h.programs.iter().filter_map(|p| objects.programs.get(p)).flat_map(|p| p.maps.iter().copied()));
    h
}

/// The BPF objects `pid` holds an fd to (from its fdinfo).
fn held_directly(pid: u32, h: &mut Held) {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return };
    for fd in fds.flatten() {
        let is_bpf = std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("anon_inode:bpf"));
        if !is_bpf {
            continue;
        }
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        let Ok(text) = std::fs::read_to_string(info) else { continue };
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            let Ok(id) = value.trim().parse::<u32>() else { continue };
            match key {
                "prog_id" => h.programs.insert(id),
                "map_id" => h.maps.insert(id),
                "link_id" => h.links.insert(id),
                _ => false,
            };
        }
    }
}

/// What a dead agent left: objects new since the baseline that no live process holds.
#[derive(Debug, Default)]
struct Leftovers {
    programs: Vec<String>,
    maps: Vec<String>,
    links: Vec<String>,
    tracefs_events: Vec<String>,
    pins: Vec<String>,
}

impl Leftovers {
    fn find(base: &KernelObjects) -> Leftovers {
        let now = KernelObjects::now();
        let mut l = Leftovers {
            tracefs_events: now.tracefs_events.difference(&base.tracefs_events).cloned().collect(),
            pins: now.pins.difference(&base.pins).map(|p| p.display().to_string()).collect(),
            ..Default::default()
        };
        let new_progs: Vec<u32> = now.programs.keys().filter(|id| !base.programs.contains_key(id)).copied().collect();
        let new_maps: Vec<u32> = now.maps.keys().filter(|id| !base.maps.contains_key(id)).copied().collect();
        let new_links: Vec<u32> = now.links.keys().filter(|id| !base.links.contains_key(id)).copied().collect();
        if new_progs.is_empty() && new_maps.is_empty() && new_links.is_empty() {
            return l;
        }
        let held = held(&now);
        l.programs = new_progs
            .iter()
            .filter(|id| !held.programs.contains(id))
            .map(|id| format!("prog {id} {}", now.programs[id].name))
            .collect();
        l.maps = new_maps
            .iter()
            .filter(|id| !held.maps.contains(id))
            .map(|id| format!("map {id} {}", now.maps[id]))
            .collect();
        l.links = new_links
            .iter()
            .filter(|id| !held.links.contains(id))
            .map(|id| format!("link {id} {} (prog {})", now.links[id].kind, now.links[id].prog))
            .collect();
        l
    }

    fn is_empty(&self) -> bool {
        self.programs.is_empty()
            && self.maps.is_empty()
            && self.links.is_empty()
            && self.tracefs_events.is_empty()
            && self.pins.is_empty()
    }

    /// Poll until nothing is left or `grace` has passed: what is left then, after how long, and
    /// how many looks it took.
    fn after_grace(base: &KernelObjects, grace: Duration) -> (Leftovers, Duration, u32) {
        let t = Instant::now();
        let mut polls = 0;
        loop {
            let l = Leftovers::find(base);
            polls += 1;
            if l.is_empty() || t.elapsed() >= grace {
                return (l, t.elapsed(), polls);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Raise this process's soft fd limit to at least `want` (as far as the hard limit allows) and
/// return the limit now in force.
fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur < want {
        lim.rlim_cur = want.min(lim.rlim_max);
        // SAFETY: setrlimit reads the struct passed.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "raise RLIMIT_NOFILE");
    }
    lim.rlim_cur
}

#[test]
fn sigkill_at_every_stage_leaves_nothing_behind() {
    require_root();
    let started = Instant::now();
    let driver = FakeDriver::start(1).unwrap();
    // A process holding NVIDIA fds, for the scan to find (it opens nvidiactl and nvidia0).
    let mut w = Workload::spawn(driver.dev_dir(), None).unwrap();
    let init = w.cmd("init 0").unwrap();
    assert!(init.starts_with("ok"), "init 0: {init}");
    let limit = raise_nofile(SCAN_BALLAST_FDS + 1024);
    let ballast: Vec<File> =
        (0..SCAN_BALLAST_FDS.min(limit.saturating_sub(1024))).map(|_| File::open("/dev/null").unwrap()).collect();

    let base = KernelObjects::now();
    assert!(
        Path::new(TRACEFS_EVENT_FILES[0]).exists() || Path::new(TRACEFS_EVENT_FILES[3]).exists(),
        "no uprobe_events in tracefs (mount it: `mount -t tracefs nodev /sys/kernel/tracing`)"
    );

    let ms = Duration::from_millis;
    let mut plan: Vec<Aim> = vec![
        Aim::When("the first BPF object exists", |f| f.any_bpf()),
        Aim::When("the object's maps exist", |f| f.object_loaded() && f.progs == 0 && f.links == 0),
        Aim::When("the first program is loaded", |f| f.object_loaded() && f.progs > 0),
        Aim::When("10 links are attached", |f| f.object_loaded() && f.links >= 10),
        // Without a libcuda to probe there are fewer links: then this lands in the scan.
        Aim::When("30 links are attached (or the scan began)", |f| f.object_loaded() && (f.links >= 30 || f.proc_dir)),
        Aim::When("/proc is being scanned", |f| f.proc_dir),
        Aim::When("/proc is being scanned", |f| f.proc_dir),
        Aim::Ready,
    ];
    plan.extend([0, 5, 10, 20, 40, 80, 160, 320, 640].map(|d| Aim::After(ms(d))));
    plan.push(Aim::Ready);

    let mut stages: BTreeMap<Stage, u32> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut totals = Leftovers::default();
    let (mut slowest_exit, mut slowest_release) = (Duration::ZERO, Duration::ZERO);
    let mut seen_running = None;
    let mut families = String::new();
    // The scan is the shortest stage: an aim at it that lands elsewhere is tried again (3 times).
    let mut scan_retries = 3;
    let mut freed_after_reap = 0;
    let mut i = 0;
    while i < plan.len() {
        let aim = plan[i];
        i += 1;
        let mut agent = Agent::spawn(driver.dev_dir());
        let addr = agent.wait_for(aim);
        if let Some(addr) = &addr {
            families = families_up(addr);
        }
        let at = agent.stop();
        let pid = agent.pid();
        let fds = Fds::of(pid);
        let stage = stage_of(pid, &fds, &agent.log());
        if matches!(aim, Aim::Ready) {
            // The check sees what it checks: every object the live agent holds is enumerated, new
            // since the baseline, and counted as held.
            let now = KernelObjects::now();
            let all_held = held(&now);
            let mut own = Held::default();
            held_directly(pid, &mut own);
            let unseen: Vec<String> = (own.programs.iter().filter(|id| !now.programs.contains_key(id)))
                .chain(own.maps.iter().filter(|id| !now.maps.contains_key(id)))
                .chain(own.links.iter().filter(|id| !now.links.contains_key(id)))
                .map(|id| id.to_string())
                .collect();
            assert!(unseen.is_empty(), "objects of the live agent missing from the enumeration: {unseen:?}");
            assert!(
                own.programs.iter().all(|id| !base.programs.contains_key(id) && all_held.programs.contains(id))
                    && own.maps.iter().all(|id| !base.maps.contains_key(id) && all_held.maps.contains(id))
                    && own.links.iter().all(|id| !base.links.contains_key(id) && all_held.links.contains(id)),
                "the live agent's objects are new and held"
            );
            assert!(!own.programs.is_empty() && !own.maps.is_empty() && !own.links.is_empty(), "{fds:?}");
            seen_running = Some((own.programs.len(), own.maps.len(), own.links.len(), fds.clone()));
        }
        let exit = agent.kill();
        let (left, waited, polls) = Leftovers::after_grace(&base, RELEASE_GRACE);
        // Objects still there when the agent was reaped, freed within the grace period: the check
        // does see a dead agent's objects while they exist.
        freed_after_reap += u32::from(polls > 1 && left.is_empty());
        println!(
            "kill {:2}: aimed {aim}, landed in {stage} at {} ms (fds: {} maps, {} progs, {} links, {} btf, \
             proc dir open {}); reaped in {} ms, released in {} ms",
            i,
            at.as_millis(),
            fds.maps,
            fds.progs,
            fds.links,
            fds.btf,
            fds.proc_dir,
            exit.as_millis(),
            waited.as_millis()
        );
        *stages.entry(stage).or_default() += 1;
        slowest_exit = slowest_exit.max(exit);
        if left.is_empty() {
            slowest_release = slowest_release.max(waited);
        } else {
            failures.push(format!("kill {i} ({aim}, in {stage} at {} ms) left {left:#?}", at.as_millis()));
            totals.programs.extend(left.programs);
            totals.maps.extend(left.maps);
            totals.links.extend(left.links);
            totals.tracefs_events.extend(left.tracefs_events);
            totals.pins.extend(left.pins);
        }
        if matches!(aim, Aim::When(w, _) if w.starts_with("/proc")) && stage != Stage::Scanning && scan_retries > 0 {
            scan_retries -= 1;
            plan.push(aim);
        }
    }
    drop(ballast);
    let (progs, maps, links, fds) = seen_running.expect("an agent was killed once ready");
    println!(
        "reliability: kills={} stages={} leftover_programs={} leftover_maps={} leftover_links={} \
         leftover_tracefs_events={} leftover_pins={}",
        plan.len(),
        stages.iter().map(|(s, n)| format!("{s}:{n}")).collect::<Vec<_>>().join(","),
        totals.programs.len(),
        totals.maps.len(),
        totals.links.len(),
        totals.tracefs_events.len(),
        totals.pins.len()
    );
    println!(
        "reliability: families_up={families} running_agent_programs={progs} maps={maps} links={links} btf_fds={} \
         freed_after_reap={freed_after_reap} slowest_reap_ms={} slowest_release_ms={} total_s={:.1}",
        fds.btf,
        slowest_exit.as_millis(),
        slowest_release.as_millis(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "a SIGKILLed agent left kernel objects behind:\n{}", failures.join("\n"));
    for s in [Stage::Loading, Stage::Attaching, Stage::Scanning, Stage::Running] {
        assert!(stages.contains_key(&s), "no kill landed in {s}: {stages:?}");
    }
    drop(w);
}
