use super::*;

#[test]
fn dirty_rounds_are_left_out_only_when_clean_ones_remain() {
    let mut r = SysRow::new(SysKind::None, None);
    r.ioctl = Ok(vec![1.0, 2.0, 3.0]);
    r.getppid = Ok(vec![4.0, 5.0, 6.0]);
    r.ioctl_wall = vec![7.0, 8.0, 9.0];
    r.getppid_wall = vec![7.0, 8.0, 9.0];
    r.dirty = vec![false, true, false];
    r.drop_dirty_rounds();
    assert_eq!(r.ioctl, Ok(vec![1.0, 3.0]));
    assert_eq!(r.getppid_wall, vec![7.0, 9.0]);
    assert_eq!((r.dropped_rounds, r.dirty_kept()), (1, 0));
    assert_eq!(rounds_cell(3, 1, 0), "2 (1 left out: other tracers)");

    let mut all = NvMeasured::default();
    all.push(Timing { cpu: 1.0, wall: 2.0 }, true);
    all.push(Timing { cpu: 3.0, wall: 4.0 }, true);
    all.drop_dirty_rounds();
    assert_eq!(all.runs, vec![1.0, 3.0]);
    assert_eq!(all.dirty_kept(), 2);
}

#[test]
fn formatting() {
    assert_eq!(signed(12.34), "+12.3");
    assert_eq!(signed(-250.0), "−250");
    assert_eq!(check(5, 5), "5 ✓");
    assert_eq!(check(4, 5), "**4 (expected 5)**");
    assert_eq!(ring_label(64 << 10), "64 KiB");
    assert_eq!(ring_label(8 << 20), "8 MiB");
    assert_eq!(RECORD_IN_RING, 528);
    assert_eq!(cell(&Err("x|y".into())), "not measured: x\\|y");
}
