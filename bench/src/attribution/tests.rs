use super::*;

#[test]
fn the_bench_node_is_what_it_says() {
    let n = node(3, 0, 1);
    assert_eq!(n.gpus.len() as u64, GPUS);
    assert_eq!(n.containers.len() as u64, GPUS * CONTAINERS_PER_GPU);
    assert!(n.gpus.iter().all(|g| g.processes.len() as u64 == CONTAINERS_PER_GPU + 1));
    assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 99.0), 4.0);
    assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
}
