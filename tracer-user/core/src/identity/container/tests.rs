use super::*;

#[test]
fn plain_host_cgroups_are_not_containers_and_pod_paths_are() {
    let host = ContainerIdentity::resolve(1, Some("/system.slice/ssh.service"), None, None);
    assert!(!host.is_container());
    assert_eq!(host.kind, "host");
    let p = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b0e3d1a_2f5c_4c8e_9d4e_3f0a1b2c3d4e.slice/cri-containerd-1111111111111111111111111111111111111111111111111111111111111111.scope";
    let c = ContainerIdentity::resolve(2, Some(p), None, None);
    assert!(c.is_container());
    assert_eq!(c.runtime, Some("containerd"));
    assert_eq!(c.qos, Some("burstable"));
    assert_eq!(c.pod_uid.as_deref(), Some("0b0e3d1a-2f5c-4c8e-9d4e-3f0a1b2c3d4e"));
    assert_eq!(c.display_name(), "pod 0b0e3d1a/11111111");
    assert!(!c.allocations_known);
    assert_eq!(c.gpu_request(None), None);
}
