use super::*;

/// A full `stat` line (Linux 6.x, 52 fields) for a process that named itself `my (weird) proc`.
pub const ODD_STAT: &str = "1234 (my (weird) proc) S 1 1234 1234 0 -1 4194560 2000 0 0 0 250 50 0 0 20 0 7 0 98765 \
                            104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0";

#[test]
fn stat_with_spaces_and_parentheses_in_the_name() {
    let s = parse::stat(ODD_STAT).unwrap();
    assert_eq!(s.comm, "my (weird) proc");
    assert_eq!((s.pid, s.state, s.starttime, s.num_threads), (1234, 'S', 98765, 7));
    assert_eq!((s.utime, s.stime, s.vsize, s.rss), (250, 50, 104_857_600, 2560));
    // Garbage is an error, not a panic.
    for bad in ["", "x", "1234 (x) S 1", "(", ")(", "1 ()", "1 (a) "] {
        assert!(parse::stat(bad).is_none(), "{bad:?}");
    }
}

#[test]
fn status_fields() {
    let s = parse::status(
        "Name:\tgpu-tracer\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4243\nPPid:\t1\n\
         TracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t64\nGroups:\t\nNStgid:\t4242\nNSpid:\t4243\n\
         NSpgid:\t4242\nNSsid:\t4242\nThreads:\t2\nSigQ:\t0/1\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n\
         SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n\
         CapInh:\t0000000000000000\nCapPrm:\t000000c000080004\nCapEff:\t000000c000080004\n\
         CapBnd:\t000000c000080004\nCapAmb:\t0000000000000000\n",
    )
    .unwrap();
    assert_eq!((s.tgid, s.pid), (4242, 4243));
    assert_eq!(s.capeff, (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2));
}

#[test]
fn cgroup2_path_and_mount() {
    assert_eq!(
        parse::cgroup2_path("12:cpu,cpuacct:/kubepods\n0::/kubepods.slice/pod-a.slice/cri-x.scope\n").as_deref(),
        Some("/kubepods.slice/pod-a.slice/cri-x.scope")
    );
    assert_eq!(parse::cgroup2_path("0::/a:b\n").as_deref(), Some("/a:b"), "a colon in the path stays");
    assert_eq!(parse::cgroup2_path("12:cpu:/x\n"), None, "cgroup v1 only");
    let t = "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
             35 25 0:31 / /sys/fs/cgroup/uni\\040fied rw,relatime - cgroup2 cgroup2 rw\n\
             36 25 0:32 / /mnt/fake\\134dev rw shared:1 - fuse.fake-nvidia-driver fake\\040nvidia rw\n";
    let m = parse::mounts(t).unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!((m[1].point.to_str(), m[1].fs_type.as_str()), (Some("/sys/fs/cgroup/uni fied"), "cgroup2"));
    assert_eq!(m[2].point, PathBuf::from("/mnt/fake\\dev"));
    assert_eq!(m[2].source.as_deref(), Some("fake nvidia"));
    assert_eq!(unescape_octal(b"a\\040b\\0"), OsString::from("a b\\0"), "a cut escape stays as is");
}

#[test]
fn mapped_files_and_a_hostile_path() {
    let t = "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01\n\
             7f0000002000-7f0000003000 rw-p 00000000 00:00 0 [heap]\n\
             7f0000004000-7f0000005000 r--p 00000000 08:01 99                         /opt/my lib/libcuda.so.1\n\
             7f0000004000-7f0000005000 r--p 00000000 08:01 98 /opt/old/libcuda.so.1 (deleted)\n\
             7f0000006000-7f0000007000 r--p 00000000 00:00 0 \n";
    let files = parse::mapped_files(t).unwrap();
    // The kernel pads before the path; a path may hold spaces; a deleted file is left out.
    let want = ["/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01", "/opt/my lib/libcuda.so.1"];
    assert_eq!(files, want.map(PathBuf::from));
    // A container can map a file it names /SYSV: procfs-core indexes past its end. An error, not a
    // crash of the agent.
    assert!(parse::mapped_files("7f0000000000-7f0000001000 r--p 00000000 08:01 9 /SYSV\n").is_none());
}

#[test]
fn char_devices_only() {
    let text =
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\nBlock devices:\n 8 sd\n240 nvidiablk\n";
    let d = parse::char_devices(text).unwrap();
    assert_eq!(d, vec![(1, "mem".into()), (195, "nvidia-frontend".into()), (508, "nvidia-uvm".into())]);
}

#[test]
fn this_process_through_the_crate() {
    let root = Path::new("/proc");
    let me = std::process::id();
    let st = stat(root, me).unwrap();
    assert_eq!(st.pid as u32, me);
    assert!(st.starttime > 0);
    assert_eq!(status(root, "self").unwrap().tgid as u32, me);
    assert_eq!(read_stat(&myself(root).unwrap()).unwrap().starttime, st.starttime);
    assert!(mapped_files(root, me).unwrap().iter().any(|f| f.is_absolute()));
    assert!(pid_max().unwrap() >= 32_768);
    assert!(boot_time_secs().unwrap() > 1_600_000_000);
    assert!(char_devices(root).unwrap().iter().any(|(m, n)| *m == 1 && n == "mem"));
    if let Some(m) = cgroup2_mount(root) {
        assert!(m.is_dir(), "{}", m.display());
        assert!(cgroup2_path(root, me).unwrap().starts_with('/'));
    }
}

#[test]
fn a_gone_process_is_an_error_not_a_panic() {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    assert!(matches!(stat(Path::new("/proc"), pid), Err(ProcError::NotFound(_))));
    assert!(cgroup2_path(Path::new("/proc"), pid).is_none());
    assert!(stat(Path::new("/nonexistent-proc"), 1).is_err());
}

#[test]
fn kernel_releases_compare_by_major_and_minor() {
    assert_eq!(kernel_series("6.1.0-18-amd64"), Some((6, 1)));
    assert_eq!(kernel_series("6.12.118+deb13-amd64"), Some((6, 12)));
    assert!(kernel_before("5.10.0-46-amd64", 5, 11) && !kernel_at_least("5.10.0-46-amd64", 5, 11));
    assert!(kernel_at_least("5.11.0", 5, 11) && !kernel_before("5.11.0", 5, 11));
    assert!(kernel_at_least("6.18.44", 6, 6) && kernel_before("6.1.0", 6, 6));
    // Unknown is neither older nor newer.
    for r in ["", "garbage", "6"] {
        assert!(!kernel_before(r, 5, 11) && !kernel_at_least(r, 5, 11), "{r:?}");
    }
}
