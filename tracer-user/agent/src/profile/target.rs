//! The workload a session records, as the user named it ([`TargetSpec`]: a PID, a cgroup, a pod),
//! resolved into what the probes select ([`Resolved`]: processes and cgroups) the same way by a
//! standalone `profile` and by the agent serving `profile --connect`.
use std::collections::BTreeSet;

use crate::pipeline::Agent;
use tracer_core::identity::cgroup::CgroupKind;
use tracer_core::profile::{Target, TargetSpec};

/// Why a target cannot be recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Nothing by that name on this node.
    #[error("{0}")]
    NotFound(String),
    /// It exists, but there is nothing to record (no libcuda mapped).
    #[error("{0}")]
    Precondition(String),
}

/// A target resolved on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// What the recorder keeps.
    pub target: Target,
    /// Per-event mode is switched on for these processes …
    pub tgids: Vec<u32>,
    /// … and these cgroups.
    pub cgroups: Vec<u64>,
    /// The cgroups the workload's events carry (a process's own cgroup too): what an agent's
    /// stream is filtered on. Empty: not known, send everything (the recorder filters).
    pub event_cgroups: BTreeSet<u64>,
    /// The workload as a person reads it: `ns/pod/container`, `pid 4242 (python)`.
    pub description: String,
    /// One session lock per name (`pid-N`, `cgroup-ID`): one session per workload.
    pub locks: Vec<String>,
    /// The cgroups' paths relative to the mount, where known.
    pub cgroup_paths: Vec<String>,
}

/// Resolve `spec` with `agent`'s view of the node (its /proc, cgroup2 mount and Kubernetes
/// identity).
pub fn resolve(agent: &mut Agent, spec: &TargetSpec) -> Result<Resolved, ResolveError> {
    let r = resolve_only(agent, spec)?;
    // The workload's own libcuda copies (a container image's), if not probed yet.
    let procs: Vec<u32> = match &r.target {
        Target::Pid(p) => vec![*p],
        Target::Cgroups(_) => r.cgroup_paths.iter().flat_map(|p| processes_in(agent, p)).collect(),
    };
    for p in procs {
        agent.probe_libcuda_of(p);
    }
    Ok(r)
}

/// The processes of the cgroup at `rel` (relative to the cgroup2 mount).
fn processes_in(agent: &Agent, rel: &str) -> Vec<u32> {
    let Some(root) = agent.cgroup_root() else { return Vec::new() };
    let text = std::fs::read_to_string(root.join(rel.trim_start_matches('/')).join("cgroup.procs")).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn resolve_only(agent: &mut Agent, spec: &TargetSpec) -> Result<Resolved, ResolveError> {
    match spec {
        TargetSpec::Pid(pid) => resolve_pid(agent, *pid),
        TargetSpec::Cgroup(c) => {
            let id = agent.cgroup_id(c).ok_or_else(|| {
                ResolveError::NotFound(format!(
                    "--cgroup {c}: no such cgroup (a path inside the cgroup2 mount, without `..`, as in /proc/PID/cgroup, or an id)"
                ))
            })?;
            let ident = agent.identity_of(id);
            let description = if ident.pod.is_some() { ident.display_name() } else { format!("cgroup {c}") };
            Ok(Resolved {
                target: Target::cgroup(id),
                tgids: vec![],
                cgroups: vec![id],
                event_cgroups: [id].into(),
                description,
                locks: vec![format!("cgroup-{id}")],
                cgroup_paths: ident.cgroup_path.iter().cloned().collect(),
            })
        }
        TargetSpec::Pod { namespace, name, container } => resolve_pod(agent, namespace, name, container.as_deref()),
    }
}

fn resolve_pid(agent: &mut Agent, pid: u32) -> Result<Resolved, ResolveError> {
    let proc_root = agent.proc_root().to_path_buf();
    let dir = proc_root.join(pid.to_string());
    if !dir.exists() {
        return Err(ResolveError::NotFound(format!(
            "no process {pid} under {}: it exited, or the PID is from another PID namespace (give the host's PID, \
             as `ps` on the node shows it)",
            proc_root.display()
        )));
    }
    let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
    if crate::proc::mapped_libcuda(&proc_root, pid).is_empty() {
        return Err(ResolveError::Precondition(format!(
            "process {pid} ({comm}) has no libcuda.so mapped: nothing to profile (is it a CUDA program, and past its \
             CUDA initialisation?)"
        )));
    }
    let cgroup = agent.cgroup_id_of_process(pid);
    let pod = cgroup.map(|c| agent.identity_of(c)).filter(|i| i.pod.is_some()).map(|i| i.display_name());
    Ok(Resolved {
        target: Target::Pid(pid),
        tgids: vec![pid],
        cgroups: vec![],
        event_cgroups: cgroup.into_iter().collect(),
        description: match pod {
            Some(p) => format!("pid {pid} ({comm}) in {p}"),
            None => format!("pid {pid} ({comm})"),
        },
        locks: vec![format!("pid-{pid}")],
        cgroup_paths: vec![],
    })
}

/// Deepest cgroup directory looked at below the mount (kubepods nest 3–5 deep).
const MAX_DEPTH: usize = 8;
/// Most cgroup directories looked at (a node has hundreds to a few thousand).
const MAX_DIRS: usize = 100_000;

fn resolve_pod(
    agent: &mut Agent,
    namespace: &str,
    name: &str,
    container: Option<&str>,
) -> Result<Resolved, ResolveError> {
    let root = agent.cgroup_root().ok_or_else(|| {
        ResolveError::NotFound("--pod needs the cgroup2 mount, and none was found (cgroup_root)".to_string())
    })?;
    let mut found: Vec<(u64, String, String)> = Vec::new();
    let mut containers_of_pod: BTreeSet<String> = BTreeSet::new();
    let mut pod_seen = false;
    for (id, rel) in container_cgroups(&root) {
        if tracer_core::identity::cgroup::parse_cgroup_path(&rel).kind != CgroupKind::Container {
            continue;
        }
        let ident = agent.identity_of(id);
        if ident.namespace.as_deref() != Some(namespace) || ident.pod.as_deref() != Some(name) {
            continue;
        }
        pod_seen = true;
        let Some(c) = ident.container.clone() else { continue };
        containers_of_pod.insert(c.clone());
        if container.is_none_or(|want| want == c) {
            found.push((id, ident.display_name(), rel));
        }
    }
    if found.is_empty() {
        let what = match (pod_seen, container) {
            (true, Some(c)) => format!(
                "pod {namespace}/{name} has no running container {c} on this node (its containers here: {})",
                containers_of_pod.into_iter().collect::<Vec<_>>().join(", ")
            ),
            _ => format!(
                "no running container of pod {namespace}/{name} on this node (is the pod on this node, and does the \
                 tracer know it? Kubernetes identity: {})",
                agent.kubernetes_status()
            ),
        };
        return Err(ResolveError::NotFound(what));
    }
    found.sort();
    let ids: Vec<u64> = found.iter().map(|(id, _, _)| *id).collect();
    let description = match found.as_slice() {
        [(_, one, _)] => one.clone(),
        _ => format!("{namespace}/{name} ({} containers)", found.len()),
    };
    Ok(Resolved {
        target: Target::Cgroups(ids.iter().copied().collect()),
        tgids: vec![],
        cgroups: ids.clone(),
        event_cgroups: ids.iter().copied().collect(),
        description,
        locks: ids.iter().map(|id| format!("cgroup-{id}")).collect(),
        cgroup_paths: found.into_iter().map(|(_, _, rel)| rel).collect(),
    })
}

/// Every cgroup directory below `root` (depth and count bounded), as (id, path relative to the
/// mount with a leading `/`).
fn container_cgroups(root: &std::path::Path) -> Vec<(u64, String)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_dir() {
                continue;
            }
            seen += 1;
            if seen > MAX_DIRS {
                tracing::warn!(max = MAX_DIRS, "profile --pod: stopped looking after this many cgroups");
                return out;
            }
            let path = e.path();
            if let Ok(rel) = path.strip_prefix(root) {
                out.push((meta.ino(), format!("/{}", rel.display())));
            }
            if depth + 1 < MAX_DEPTH {
                stack.push((path, depth + 1));
            }
        }
    }
    out
}
