use super::*;
use k8s_openapi::api::core::v1::{ContainerStatus, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

fn pod_owned_by(kind: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            owner_references: Some(vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

#[test]
fn owners() {
    let o = |kind, name, labels: &[(&str, &str)]| owner(&pod_owned_by(kind, name, labels));
    let s = |k: &str, n: &str| Some((k.to_string(), n.to_string()));
    assert_eq!(o("ReplicaSet", "web-5d4f8b7c9", &[(POD_TEMPLATE_HASH, "5d4f8b7c9")]), s("Deployment", "web"));
    // A ReplicaSet made by hand: no hash label, or one that is not its suffix.
    assert_eq!(o("ReplicaSet", "web-5d4f8b7c9", &[]), s("ReplicaSet", "web-5d4f8b7c9"));
    assert_eq!(o("ReplicaSet", "web", &[(POD_TEMPLATE_HASH, "web")]), s("ReplicaSet", "web"));
    assert_eq!(o("Job", "nightly-train-29000000", &[]), s("CronJob", "nightly-train"));
    assert_eq!(o("Job", "train-20240101", &[]), s("Job", "train-20240101"));
    assert_eq!(o("Job", "train", &[]), s("Job", "train"));
    assert_eq!(o("StatefulSet", "db", &[]), s("StatefulSet", "db"));
    assert_eq!(owner(&Pod::default()), None);
}

#[test]
fn container_ids_and_gpu_counts() {
    assert_eq!(strip_runtime_prefix("containerd://ABC"), Some("abc".into()));
    assert_eq!(strip_runtime_prefix("cri-o://abc"), Some("abc".into()));
    assert_eq!(strip_runtime_prefix("abc"), Some("abc".into()));
    assert_eq!(strip_runtime_prefix("docker://"), None);
    let names = vec!["nvidia.com/gpu".to_string(), "nvidia.com/mig-1g.10gb".to_string()];
    let q = |v: &str| Quantity(v.into());
    let c = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            limits: Some([("nvidia.com/gpu".to_string(), q("2")), ("cpu".to_string(), q("1"))].into()),
            requests: Some([("nvidia.com/mig-1g.10gb".to_string(), q("1"))].into()),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let want: BTreeMap<String, u64> =
        [("nvidia.com/gpu".to_string(), 2), ("nvidia.com/mig-1g.10gb".to_string(), 1)].into();
    assert_eq!(gpu_counts(&c, &names), want);
    assert!(gpu_counts(&Container::default(), &names).is_empty());
}

#[test]
fn index_follows_container_restarts() {
    let status = |id: &str| PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "main".into(),
            container_id: Some(format!("containerd://{id}")),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    };
    let mut pod = Pod {
        metadata: ObjectMeta { name: Some("p".into()), uid: Some("u1".into()), ..ObjectMeta::default() },
        spec: Some(PodSpec::default()),
        status: Some(status("aaa")),
    };
    let mut idx = Index::default();
    idx.insert(&pod);
    assert!(idx.containers.contains_key("aaa"));
    pod.status = Some(status("bbb"));
    idx.insert(&pod);
    assert!(!idx.containers.contains_key("aaa"));
    assert_eq!(idx.containers.get("bbb"), Some(&("u1".to_string(), "main".to_string())));
    idx.remove("u1");
    assert!(idx.containers.is_empty() && idx.by_uid.is_empty());
}

#[test]
fn environment_decides_whether_kubernetes_is_in_use() {
    let dir = std::env::temp_dir().join(format!("kube-env-{}", std::process::id()));
    let settings = KubeSettings::default();
    let bare = KubeEnv { home: Some(dir.clone()), ..KubeEnv::default() };
    let why = bare.config_source(&settings).err().expect("plain host");
    assert!(why.contains("KUBERNETES_SERVICE_HOST"), "{why}");
    let pod = KubeEnv { in_cluster: true, ..bare.clone() };
    assert!(matches!(pod.config_source(&settings), Ok(ConfigSource::Infer)));
    std::fs::create_dir_all(dir.join(".kube")).unwrap();
    std::fs::write(dir.join(".kube/config"), "apiVersion: v1\n").unwrap();
    assert!(matches!(bare.config_source(&settings), Ok(ConfigSource::Infer)));
    // $KUBECONFIG naming only missing files wins over ~/.kube/config, as in kubectl.
    let var = KubeEnv { kubeconfig_var: Some(dir.join("missing").into()), ..bare.clone() };
    assert!(var.config_source(&settings).is_err());
    let explicit = KubeSettings { kubeconfig: Some(dir.join("x")), ..KubeSettings::default() };
    assert!(matches!(bare.config_source(&explicit), Ok(ConfigSource::File(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}
