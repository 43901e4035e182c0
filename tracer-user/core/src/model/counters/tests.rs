use super::*;

fn sample() -> ProbeCounters {
    let mut c = ProbeCounters { seen: 20, emitted: 10, aggregated: 4, ..Default::default() };
    c.set_dropped(counter::DROP_RINGBUF_FULL, 3);
    c.set_dropped(counter::DROP_COUNT_MAP, 2);
    c.set_dropped(counter::DROP_NO_ENTRY, 1);
    c
}

#[test]
fn drops_are_named_and_summed_by_reason() {
    let c = sample();
    assert_eq!(c.dropped(), 6);
    assert_eq!(c.dropped_at(counter::DROP_COUNT_MAP), 2);
    let drops: Vec<_> = c.drops().collect();
    assert_eq!(
        drops,
        [
            ("ringbuf_full", 3),
            ("inflight_full", 0),
            ("fd_map_full", 0),
            ("no_entry", 1),
            ("count_map_full", 2),
            ("not_a_device", 0),
            ("bulk_ringbuf_full", 0),
            ("no_return", 0),
            ("kernel_read", 0)
        ]
    );
    let mut t = ProbeCounters::default();
    t += &c;
    t += &c;
    assert_eq!(
        (t.seen, t.emitted, t.aggregated, t.dropped(), t.dropped_at(counter::DROP_NO_ENTRY)),
        (40, 20, 8, 12, 2)
    );
    let k = KernelCounters { probes: vec![("ioctl".into(), c), ("open".into(), c)] };
    assert_eq!(k.total(), t);
}

#[test]
fn json_names_every_reason_as_a_field() {
    let j = serde_json::to_string(&sample()).unwrap();
    assert_eq!(
        j,
        r#"{"seen":20,"emitted":10,"dropped_ringbuf_full":3,"dropped_inflight_full":0,"dropped_fd_map_full":0,"dropped_no_entry":1,"dropped_count_map_full":2,"dropped_not_a_device":0,"dropped_bulk_ringbuf_full":0,"dropped_no_return":0,"dropped_kernel_read":0,"aggregated":4}"#
    );
}

#[test]
#[should_panic(expected = "not a drop reason")]
fn a_slot_that_is_no_drop_reason_panics() {
    ProbeCounters::default().set_dropped(counter::AGGREGATED, 1);
}
