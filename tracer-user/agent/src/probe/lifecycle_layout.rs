//! Where the lifecycle tracepoints keep their fields on the running kernel. The layouts change
//! between kernels (6.1: `sched_process_fork`'s comms are arrays and `child_pid` is at 44, and
//! `sched_process_exit` has no `group_dead`; 6.18: `__data_loc` comms, `child_pid` at 20,
//! `group_dead` at 32), so the offsets come from the tracepoints' `format` files, and without
//! `group_dead` the exit program reads `current->signal->live` at offsets from the kernel's BTF.
//! The `tp_btf` programs get kernel objects instead of records: they read `task_struct.pid`,
//! `cgroup.level`, `cgroup.kn`, `kernfs_node.id` and `signal->live` at BTF offsets.
use std::path::Path;

use btf_rs::Btf;
use tracer_common::{LifecycleLayout, exit_by};

use super::devcheck::member_offset;

/// The offset of field `name` in a tracepoint `format` text.
pub(crate) fn field_offset(format: &str, name: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';');
        let decl = parts.next()?.strip_prefix("field:")?;
        let field = decl.split_whitespace().last()?.trim_start_matches('*');
        let field = field.split('[').next()?;
        if field != name {
            return None;
        }
        parts.find_map(|p| p.trim().strip_prefix("offset:")).and_then(|o| o.trim().parse().ok())
    })
}

/// What [`detect`] found.
#[derive(Debug)]
pub(crate) struct Detected {
    pub layout: LifecycleLayout,
    /// How the tracepoint programs read their fields, for `doctor`.
    pub words: String,
    /// Whether the `tp_btf` programs can run here: their fields' BTF offsets were all found, or
    /// which was not.
    pub btf: Result<(), String>,
}

/// The layout for the kernel whose tracefs events are at `events` and BTF at `btf`, and how it
/// was found. A tracepoint field that cannot be found keeps the default (6.18) offset, and the
/// description says so.
pub fn detect(events: &Path, btf: &Path) -> Detected {
    let read = |tp: &str| std::fs::read_to_string(events.join(tp).join("format")).unwrap_or_default();
    let (fork, exit, rmdir) =
        (read("sched/sched_process_fork"), read("sched/sched_process_exit"), read("cgroup/cgroup_rmdir"));
    let mut l = LifecycleLayout::default();
    let mut missing = Vec::new();
    let mut set = |slot: &mut u32, format: &str, tp: &str, field: &str| match field_offset(format, field) {
        Some(o) => *slot = o,
        None => missing.push(format!("{tp}.{field}")),
    };
    set(&mut l.fork_child_pid, &fork, "sched_process_fork", "child_pid");
    set(&mut l.rmdir_level, &rmdir, "cgroup_rmdir", "level");
    set(&mut l.rmdir_id, &rmdir, "cgroup_rmdir", "id");
    set(&mut l.rmdir_path, &rmdir, "cgroup_rmdir", "path");

    let btf = Btf::from_file(btf).map_err(|e| format!("{}: {e}", btf.display()));
    let off =
        |name: &str, member: &str| btf.as_ref().map_err(Clone::clone).and_then(|b| member_offset(b, name, member));
    let signal = off("task_struct", "signal").and_then(|s| Ok((s, off("signal_struct", "live")?)));
    if let Ok((signal, live)) = signal {
        (l.task_signal, l.signal_live) = (signal, live);
    }
    let exit_words = if let Some(o) = field_offset(&exit, "group_dead") {
        (l.exit_group_dead, l.exit_by) = (o, exit_by::GROUP_DEAD);
        "process exit: the tracepoint's group_dead".to_string()
    } else {
        match &signal {
            Ok(_) => {
                l.exit_by = exit_by::SIGNAL_LIVE;
                "process exit: current->signal->live (no group_dead in this kernel's sched_process_exit)".to_string()
            }
            Err(e) => {
                l.exit_by = exit_by::LEADER;
                format!(
                    "process exit: when the thread-group leader exits (no group_dead in sched_process_exit, no BTF: {e})"
                )
            }
        }
    };
    let btf_ready = (|| {
        signal.as_ref().map_err(Clone::clone)?;
        l.task_pid = off("task_struct", "pid")?;
        l.cgroup_level = off("cgroup", "level")?;
        l.cgroup_kn = off("cgroup", "kn")?;
        l.kernfs_id = off("kernfs_node", "id")?;
        Ok(())
    })();
    let mut words = format!("fork child_pid@{}; {exit_words}", l.fork_child_pid);
    if !missing.is_empty() {
        words.push_str(&format!("; not in the format files, defaults used: {}", missing.join(", ")));
    }
    Detected { layout: l, words, btf: btf_ready }
}

#[cfg(test)]
mod tests;
