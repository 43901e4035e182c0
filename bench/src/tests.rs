use super::*;

#[test]
fn worker_output_parsing() {
    let lines: Vec<String> = ["first_ret -1 25", "nv 1434.5 3744.25", "total 250000"].map(String::from).to_vec();
    let t = timing(&lines, "nv").unwrap();
    assert_eq!((t.cpu, t.wall), (1434.5, 3744.25));
    assert_eq!(values(&lines, "total"), vec![vec![250000.0]]);
    assert!(timing(&lines, "getppid").is_err());
}
