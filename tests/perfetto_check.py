"""Decode a `gpu-tracer profile` trace with the PyPI `perfetto` package's own protos
(perfetto_trace_pb2 on the `protobuf` runtime, an implementation independent of gpu-tracer's Rust
one), check the rules Perfetto's trace processor relies on, and print what tests/tests/profile.rs
compares, as one JSON object:

    tracks:   uuid -> {kind: process|thread|named|counter, name, pid, tid, parent}
    events:   uuid -> {event name -> count}        (instants and slice begins)
    counters: uuid -> [values in order]
    slices, flows_begun, flows_terminated, packets

Structural failures (a track used before it is declared, a parent not declared first, an interned
name (event or annotation name, annotation string) used before it is defined, an unbalanced slice, timestamps going backwards, a packet on
another sequence) print `error: ...` on stderr and exit 1.
"""
import json
import sys
from collections import defaultdict

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent, TracePacket


def fail(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


def main(path):
    trace = Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    tracks, names, ann_names, strings = {}, {}, {}, {}
    events = defaultdict(lambda: defaultdict(int))
    counters = defaultdict(list)
    depth = defaultdict(int)
    flows_begun, flows_terminated, slices = set(), 0, 0
    last_ts = 0
    for i, p in enumerate(trace.packet):
        if p.trusted_packet_sequence_id != 1:
            fail(f"packet {i} on sequence {p.trusted_packet_sequence_id}")
        if i == 0 and not (p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED):
            fail("the first packet does not clear the incremental state")
        for n in p.interned_data.event_names:
            if n.iid in names:
                fail(f"iid {n.iid} interned twice")
            names[n.iid] = n.name
        for n in p.interned_data.debug_annotation_names:
            if n.iid in ann_names:
                fail(f"annotation name iid {n.iid} interned twice")
            ann_names[n.iid] = n.name
        for v in p.interned_data.debug_annotation_string_values:
            if v.iid in strings:
                fail(f"string iid {v.iid} interned twice")
            strings[v.iid] = v.str
        kind = p.WhichOneof("data")
        if kind == "track_descriptor":
            d = p.track_descriptor
            if d.uuid in tracks:
                fail(f"track {d.uuid} declared twice")
            if d.HasField("parent_uuid") and d.parent_uuid not in tracks:
                fail(f"track {d.uuid}: parent {d.parent_uuid} not declared before it")
            if d.HasField("process"):
                t = {"kind": "process", "name": d.process.process_name, "pid": d.process.pid}
            elif d.HasField("thread"):
                t = {"kind": "thread", "name": d.thread.thread_name, "pid": d.thread.pid, "tid": d.thread.tid}
            elif d.HasField("counter"):
                t = {"kind": "counter", "name": d.name, "unit": d.counter.unit}
            else:
                t = {"kind": "named", "name": d.name}
            t["parent"] = d.parent_uuid if d.HasField("parent_uuid") else None
            tracks[d.uuid] = t
        elif kind == "track_event":
            e = p.track_event
            if e.track_uuid not in tracks:
                fail(f"packet {i}: track {e.track_uuid} used before it is declared")
            if p.timestamp < last_ts:
                fail(f"packet {i}: timestamp {p.timestamp} before {last_ts}")
            last_ts = p.timestamp
            name = ""
            if e.HasField("name_iid"):
                if e.name_iid not in names:
                    fail(f"packet {i}: name iid {e.name_iid} not interned")
                if not (p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE):
                    fail(f"packet {i}: uses interned data without SEQ_NEEDS_INCREMENTAL_STATE")
                name = names[e.name_iid]
            elif e.HasField("name"):
                name = e.name
            for a in e.debug_annotations:
                if a.HasField("name_iid") and a.name_iid not in ann_names:
                    fail(f"packet {i}: annotation name iid {a.name_iid} not interned")
                if a.HasField("string_value_iid") and a.string_value_iid not in strings:
                    fail(f"packet {i}: annotation string iid {a.string_value_iid} not interned")
            if e.type == TrackEvent.TYPE_SLICE_BEGIN:
                depth[e.track_uuid] += 1
                slices += 1
                events[e.track_uuid][name] += 1
            elif e.type == TrackEvent.TYPE_SLICE_END:
                depth[e.track_uuid] -= 1
                if depth[e.track_uuid] < 0:
                    fail(f"packet {i}: a slice end without a begin on track {e.track_uuid}")
            elif e.type == TrackEvent.TYPE_INSTANT:
                events[e.track_uuid][name] += 1
            elif e.type == TrackEvent.TYPE_COUNTER:
                if tracks[e.track_uuid]["kind"] != "counter":
                    fail(f"packet {i}: a counter value on a non-counter track")
                if e.HasField("double_counter_value"):
                    counters[e.track_uuid].append(e.double_counter_value)
                else:
                    counters[e.track_uuid].append(e.counter_value)
            else:
                fail(f"packet {i}: event type {e.type}")
            flows_begun.update(e.flow_ids)
            for f in e.terminating_flow_ids:
                if f not in flows_begun:
                    fail(f"packet {i}: flow {f} terminated before it began")
                flows_terminated += 1
        else:
            fail(f"packet {i}: unexpected data {kind}")
    open_slices = {u: d for u, d in depth.items() if d}
    if open_slices:
        fail(f"slices left open: {open_slices}")
    print(json.dumps({
        "tracks": {str(u): t for u, t in tracks.items()},
        "events": {str(u): dict(v) for u, v in events.items()},
        "counters": {str(u): v for u, v in counters.items()},
        "slices": slices,
        "flows_begun": len(flows_begun),
        "flows_terminated": flows_terminated,
        "packets": len(trace.packet),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
