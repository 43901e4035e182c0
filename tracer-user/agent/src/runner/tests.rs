use super::*;

#[test]
fn ticks_keep_their_rate_and_skip_when_far_behind() {
    let t0 = Instant::now();
    let i = Duration::from_millis(100);
    // A little late: the next tick is still on the grid.
    assert_eq!(next_tick(t0, t0 + Duration::from_millis(7), i), t0 + i);
    // More than an interval late: one interval from now, not a burst of catch-up ticks.
    assert_eq!(next_tick(t0, t0 + Duration::from_millis(250), i), t0 + Duration::from_millis(350));
}

#[test]
fn durations_from_seconds() {
    assert_eq!(Schedule::duration_from_secs(1.5), Some(Duration::from_millis(1500)));
    assert_eq!(Schedule::duration_from_secs(-1.0), Some(Duration::ZERO));
    assert_eq!(Schedule::duration_from_secs(f64::INFINITY), None);
    assert_eq!(Schedule::duration_from_secs(f64::NAN), None);
    assert_eq!(Schedule::duration_from_secs(1e30), None);
}
