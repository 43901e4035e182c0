use super::*;

const GIB: u64 = 1 << 30;

#[test]
fn h200_profiles_by_memory() {
    let total = 143_771 * (1 << 20); // what NVML reports for an H200 141GB
    assert_eq!(mig_table_for(total).unwrap()[0].name, "1g.18gb");
    assert_eq!(fit(total, 3 * GIB, 5_000, 20), Fit::MigProfile { profile: "1g.18gb".into() });
    // 20 GiB + 20 % = 25.8 GB: 1g.35gb holds it with one slice of compute.
    assert_eq!(fit(total, 20 * GIB, 10_000, 20), Fit::MigProfile { profile: "1g.35gb".into() });
    // 40 % SM + 20 % = 48 %: needs 4 slices (57 %); 3g (42.9 %) is too small.
    assert_eq!(fit(total, 20 * GIB, 40_000, 20), Fit::MigProfile { profile: "4g.71gb".into() });
    assert_eq!(fit(total, 130 * GIB, 10_000, 20), Fit::WholeGpu);
}

#[test]
fn a100_80_and_unknown_sizes() {
    let a100 = 81_920 * (1 << 20);
    assert_eq!(fit(a100, 8 * GIB, 1_000, 10), Fit::MigProfile { profile: "1g.10gb".into() });
    // A 24 GiB card has no MIG table: a fraction.
    assert_eq!(fit(24 * GIB, 6 * GIB, 10_000, 0), Fit::Fraction { pct: 25 });
    assert!(is_over_requested(&GpuRequest::WholeGpus { count: 1 }, &Fit::Fraction { pct: 25 }));
    assert!(!is_over_requested(&GpuRequest::Fraction { fraction: 0.25 }, &Fit::Fraction { pct: 25 }));
    assert!(is_over_requested(
        &GpuRequest::MigProfile { profile: "3g.71gb".into(), count: 1 },
        &Fit::MigProfile { profile: "1g.18gb".into() }
    ));
}

#[test]
fn p95_nearest_rank() {
    let mut v: Vec<u64> = (1..=100).collect();
    assert_eq!(p95(&mut v), 95);
    assert_eq!(p95(&mut [7]), 7);
    assert_eq!(p95(&mut []), 0);
}
