use super::*;

/// `sched_process_fork` of Debian's 6.1 (arrays) and of 6.18 (`__data_loc` strings).
const FORK_6_1: &str = "name: sched_process_fork\nID: 300\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";
const FORK_6_18: &str = "format:\n\
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";
const EXIT_6_1: &str = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;\n";

#[test]
fn offsets_are_read_from_either_layout() {
    assert_eq!(field_offset(FORK_6_1, "child_pid"), Some(44));
    assert_eq!(field_offset(FORK_6_18, "child_pid"), Some(20));
    assert_eq!(field_offset(FORK_6_1, "child_comm"), Some(28));
    assert_eq!(field_offset(FORK_6_18, "child_comm"), Some(16));
    assert_eq!(field_offset(EXIT_6_1, "group_dead"), None);
    assert_eq!(field_offset(EXIT_6_1, "pid"), Some(24));
    assert_eq!(field_offset("garbage\nfield:\n", "pid"), None);
}

/// A tracefs tree of 6.1's formats: child_pid from the file, and without group_dead the exit goes
/// by the BTF's signal->live where the BTF is readable, else by the leader.
#[test]
fn a_6_1_layout_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    for (tp, text) in [("sched/sched_process_fork", FORK_6_1), ("sched/sched_process_exit", EXIT_6_1)] {
        std::fs::create_dir_all(dir.path().join(tp)).unwrap();
        std::fs::write(dir.path().join(tp).join("format"), text).unwrap();
    }
    let d = detect(dir.path(), Path::new("/nonexistent/btf"));
    assert_eq!(d.layout.fork_child_pid, 44);
    assert_eq!(d.layout.exit_by, exit_by::LEADER, "{}", d.words);
    assert!(d.words.contains("cgroup_rmdir.level"), "missing fields are named: {}", d.words);
    let why = d.btf.unwrap_err();
    assert!(why.contains("/nonexistent/btf"), "{why}");
    // This machine's kernel has BTF (CI's too: the btf-tracepoint mode needs it).
    let d = detect(dir.path(), Path::new(super::super::devcheck::VMLINUX_BTF));
    let l = d.layout;
    assert_eq!(l.exit_by, exit_by::SIGNAL_LIVE, "{}", d.words);
    assert!(l.task_signal > 0 && l.signal_live < 4096, "{l:?}");
}

/// The running kernel's own files (tracefs is root's: the tests run as root).
#[test]
fn this_kernels_layout_is_detected() {
    let events = Path::new("/sys/kernel/tracing/events");
    assert!(
        events.join("sched").exists(),
        "tracefs with sched events at {} (cargo xtask setup mounts it)",
        events.display()
    );
    let d = detect(events, Path::new(super::super::devcheck::VMLINUX_BTF));
    assert!(!d.words.contains("defaults used"), "{}", d.words);
    let l = d.layout;
    assert!(l.fork_child_pid >= 20, "{l:?}");
    // Every field the tp_btf programs read has a BTF offset, inside its struct.
    assert_eq!(d.btf, Ok(()));
    for off in [l.task_signal, l.task_pid, l.cgroup_level, l.cgroup_kn, l.kernfs_id] {
        assert!(off > 0 && off < 16384, "{l:?}");
    }
}
