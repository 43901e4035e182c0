use super::*;

#[test]
fn pod_cgroups_are_shortened() {
    let p = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope";
    assert_eq!(short_name(Some(p), 1), "pod 1b2c3d4e/01234567");
    assert_eq!(short_name(Some("/user.slice/session-1.scope"), 1), "user.slice/session-1.scope");
    assert_eq!(short_name(None, 7), "cgroup #7 (gone)");
    assert_eq!(short_name(Some("/"), 1), "/ (host, no container)");
}
use CgroupDriver::*;
use CgroupKind as K;
use ContainerRuntime as R;
use QosClass::*;

const ID: &str = "4c5a1b7c8d9e0f112233445566778899aabbccddeeff00112233445566778899";
const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const UID: &str = "8f2c3d4e-1a2b-4c3d-9e8f-0a1b2c3d4e5f";
const UID_: &str = "8f2c3d4e_1a2b_4c3d_9e8f_0a1b2c3d4e5f";

struct Case {
    path: String,
    runtime: ContainerRuntime,
    container: Option<&'static str>,
    pod: Option<&'static str>,
    qos: Option<QosClass>,
    driver: Option<CgroupDriver>,
    kind: CgroupKind,
}

fn case(
    path: String,
    runtime: ContainerRuntime,
    container: Option<&'static str>,
    pod: Option<&'static str>,
    qos: Option<QosClass>,
    driver: Option<CgroupDriver>,
    kind: CgroupKind,
) -> Case {
    Case { path, runtime, container, pod, qos, driver, kind }
}

#[test]
#[rustfmt::skip] // one case per row reads as a table
fn real_node_layouts() {
    let sd = Some(Systemd);
    let fs = Some(Cgroupfs);
    let (id, uid) = (Some(ID), Some(UID));
    let cases = vec![
        // containerd, systemd driver, each QoS class.
        case(
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, uid, Some(Burstable), sd, K::Container,
        ),
        case(
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, uid, Some(BestEffort), sd, K::Container,
        ),
        case(
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, uid, Some(Guaranteed), sd, K::Container,
        ),
        // containerd, cgroupfs driver, each QoS class (the bare id does not name the runtime).
        case(format!("/kubepods/burstable/pod{UID}/{ID}"), R::Unknown, id, uid, Some(Burstable), fs, K::Container),
        case(format!("/kubepods/besteffort/pod{UID}/{ID}"), R::Unknown, id, uid, Some(BestEffort), fs, K::Container),
        case(format!("/kubepods/pod{UID}/{ID}"), R::Unknown, id, uid, Some(Guaranteed), fs, K::Container),
        // CRI-O, systemd and cgroupfs, container and its conmon; crun's `container` sub-cgroup.
        case(
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope"),
            R::CriO, id, uid, Some(Burstable), sd, K::Container,
        ),
        case(
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope/container"),
            R::CriO, id, uid, Some(Burstable), sd, K::Container,
        ),
        case(
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope"),
            R::CriO, id, uid, Some(Guaranteed), sd, K::ContainerMonitor,
        ),
        case(format!("/kubepods/besteffort/pod{UID}/crio-{ID}"), R::CriO, id, uid, Some(BestEffort), fs, K::Container),
        case(format!("/kubepods/besteffort/pod{UID}/crio-conmon-{ID}"), R::CriO, id, uid, Some(BestEffort), fs, K::ContainerMonitor),
        // Docker through cri-dockerd.
        case(
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{ID}.scope"),
            R::Docker, id, uid, Some(BestEffort), sd, K::Container,
        ),
        case(format!("/kubepods/burstable/pod{UID}/{ID}"), R::Unknown, id, uid, Some(Burstable), fs, K::Container),
        // kind: the node is itself a Docker container; the kubelet's cgroup root is /kubelet.
        case(
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, uid, Some(Burstable), sd, K::Container,
        ),
        case(
            format!("/system.slice/docker-{ID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, uid, Some(Guaranteed), sd, K::Container,
        ),
        case(format!("/docker/{ID2}/kubepods/besteffort/pod{UID}/{ID}"), R::Unknown, id, uid, Some(BestEffort), fs, K::Container),
        // Pod-level and QoS-level cgroups.
        case(format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"), R::Unknown, None, uid, Some(Burstable), sd, K::Pod),
        case("/kubepods.slice/kubepods-besteffort.slice".into(), R::Unknown, None, None, Some(BestEffort), sd, K::Pod),
        case("/kubepods".into(), R::Unknown, None, None, None, fs, K::Pod),
        // Static pod: the UID is the 32-hex config hash.
        case(
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d4e5f60718293a4b5c6d7e8f9.slice/cri-containerd-{ID}.scope"),
            R::Containerd, id, Some("0a1b2c3d4e5f60718293a4b5c6d7e8f9"), Some(Burstable), sd, K::Container,
        ),
        // Plain Docker, no Kubernetes.
        case(format!("/system.slice/docker-{ID}.scope"), R::Docker, id, None, None, sd, K::Container),
        case(format!("/docker/{ID}"), R::Docker, id, None, None, fs, K::Container),
        // Host.
        case("/".into(), R::Unknown, None, None, None, None, K::Host),
        case("/system.slice/nvidia-persistenced.service".into(), R::Unknown, None, None, None, sd, K::Host),
        case("/system.slice/containerd.service".into(), R::Unknown, None, None, None, sd, K::Host),
        case("/user.slice/user-1000.slice/user@1000.service/app.slice/app-foot.scope".into(), R::Unknown, None, None, None, sd, K::Host),
        case("/init.scope".into(), R::Unknown, None, None, None, sd, K::Host),
        // Malformed or unknown.
        case("".into(), R::Unknown, None, None, None, None, K::Other),
        case("kubepods/burstable".into(), R::Unknown, None, None, None, None, K::Other),
        case("/machine.slice/machine-qemu.scope".into(), R::Unknown, None, None, None, sd, K::Other),
        case("/kubepods/burstable/podnot-a-uid/abc".into(), R::Unknown, None, None, Some(Burstable), fs, K::Other),
        case(format!("/kubepods/burstable/pod{UID}/{}", &ID[..63]), R::Unknown, None, uid, Some(Burstable), fs, K::Other),
        case(format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}"), R::Unknown, None, uid, Some(Guaranteed), sd, K::Other),
        case("/\u{0}\u{ff}//..".into(), R::Unknown, None, None, None, None, K::Other),
    ];
    assert!(cases.len() >= 12);
    for c in cases {
        let got = parse_cgroup_path(&c.path);
        let want = CgroupIdentity {
            runtime: c.runtime,
            container_id: c.container.map(str::to_string),
            pod_uid: c.pod.map(str::to_string),
            qos: c.qos,
            cgroup_driver: c.driver,
            kind: c.kind,
        };
        assert_eq!(got, want, "path {:?}", c.path);
    }
}

#[test]
fn upper_case_ids_are_normalised() {
    let p = format!("/kubepods/pod{}/{}", UID.to_uppercase(), ID.to_uppercase());
    let got = parse_cgroup_path(&p);
    assert_eq!(got.container_id.as_deref(), Some(ID));
    assert_eq!(got.pod_uid.as_deref(), Some(UID));
}

#[test]
fn proc_cgroup_prefers_v2_line() {
    let text = format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n");
    let got = parse_proc_pid_cgroup(&text).unwrap();
    assert_eq!(got.line, CgroupLine::V2);
    assert_eq!(got.identity.container_id.as_deref(), Some(ID));
}

#[test]
fn proc_cgroup_v1_controllers() {
    let text = format!(
        "12:pids:/kubepods/burstable/pod{UID}/{ID}\n\
         11:memory:/kubepods/burstable/pod{UID}/{ID}\n\
         4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n\
         1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
    );
    let got = parse_proc_pid_cgroup(&text).unwrap();
    assert!(matches!(got.line, CgroupLine::V1 { .. }));
    assert_eq!(got.identity.pod_uid.as_deref(), Some(UID));
    assert_eq!(got.identity.container_id.as_deref(), Some(ID));
    assert_eq!(got.identity.qos, Some(Burstable));
}

#[test]
fn proc_cgroup_hybrid_takes_the_v1_line_naming_the_container() {
    // Hybrid host with the cgroupfs driver: the unified line is only systemd's session view.
    let text = format!(
        "11:memory:/kubepods/besteffort/pod{UID}/crio-{ID}\n\
         1:name=systemd:/system.slice/crio.service\n\
         0::/system.slice/crio.service\n"
    );
    let got = parse_proc_pid_cgroup(&text).unwrap();
    assert_eq!(got.line, CgroupLine::V1 { controllers: "memory".into() });
    assert_eq!(got.identity.runtime, R::CriO);
}

#[test]
fn proc_cgroup_host_process() {
    let got = parse_proc_pid_cgroup("0::/system.slice/sshd.service\n").unwrap();
    assert_eq!((got.line, got.identity.kind), (CgroupLine::V2, K::Host));
    let v1 = parse_proc_pid_cgroup("5:cpuset:/\n11:memory:/user.slice\n").unwrap();
    assert_eq!(v1.path, "/user.slice");
}

#[test]
fn proc_cgroup_garbage() {
    assert_eq!(parse_proc_pid_cgroup(""), None);
    assert_eq!(parse_proc_pid_cgroup("hello\nx:y:/z\n0::relative\n"), None);
}
