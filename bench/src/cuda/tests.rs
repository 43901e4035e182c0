use super::*;

#[test]
fn instruction_at_the_symbol_of_each_fake_variant() {
    let at = |v: &str| {
        let bytes = std::fs::read(gpu_tracer_tests::fake_libcuda::fake_libcuda(v)).unwrap();
        symbol_instruction(&bytes, SYMBOL).unwrap()
    };
    assert_eq!(at("push"), "`push rbp` (emulated)");
    assert_eq!(at("endbr64"), "`endbr64` (single-stepped)");
    let thunk = at("thunk");
    assert!(thunk.starts_with("`cmp ") && thunk.ends_with("(rip-relative: single-stepped)"), "{thunk}");
}

#[test]
fn counters_subtract_field_by_field() {
    let mut a = ProbeCounters { seen: 10, emitted: 4, aggregated: 5, ..Default::default() };
    a.set_dropped(tracer_common::counter::DROP_RINGBUF_FULL, 1);
    let b = ProbeCounters { seen: 3, emitted: 1, aggregated: 2, ..Default::default() };
    let d = sub_counters(&a, &b);
    assert_eq!((d.seen, d.emitted, d.aggregated, d.dropped()), (7, 3, 3, 1));
    let mut t = ProbeCounters::default();
    add_counters(&mut t, &d);
    add_counters(&mut t, &d);
    assert_eq!((t.seen, t.dropped()), (14, 2));
}
