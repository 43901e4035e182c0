use super::*;

#[test]
fn the_fake_node_is_what_it_says() {
    let s = scenario(CONTAINERS_PER_GPU);
    s.validate().unwrap();
    assert_eq!(s.devices.len() as u64, GPUS);
    for d in &s.devices {
        assert_eq!(d.compute_processes.as_ref().unwrap().len() as u64, CONTAINERS_PER_GPU);
        assert_eq!(d.process_utilization.as_ref().unwrap().len() as u64, CONTAINERS_PER_GPU);
    }
    assert!(scenario(0).devices.iter().all(|d| d.process_utilization.as_ref().is_some_and(Vec::is_empty)));
}

/// The sampler reads the whole fake node: every process and utilization sample, nothing missing.
#[test]
fn the_sampler_sees_the_whole_fake_node() {
    let dir = std::env::temp_dir().join(format!("gpu-tracer-bench-nvml-test-{}", std::process::id()));
    let lib = fake_nvml::install(&dir, &scenario(CONTAINERS_PER_GPU)).unwrap();
    let mut source = open(&lib).unwrap();
    let n = (GPUS * CONTAINERS_PER_GPU) as usize;
    assert_eq!(seen(&source.sample()), (GPUS as usize, n, n, 0));
    // The utilization samples were returned once.
    assert_eq!(seen(&source.sample()), (GPUS as usize, n, 0, 0));
    drop(source);
    std::fs::remove_dir_all(&dir).ok();
}
