"""Decode an OTLP ExportMetricsServiceRequest with the PyPI `opentelemetry-proto` package (an
implementation independent of gpu-tracer's Rust one) and print what tests/tests/otlp.rs compares:

    resource KEY VALUE
    metric NAME UNIT                               (every metric; UNIT "-" when it has none)
    point METRIC HW_ID LINE CONTAINER_ID VALUE     (attribution memory lines and totals)
"""
import sys

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

WANTED = ("gpu_tracer.attribution.memory.usage", "gpu_tracer.attribution.memory.limit")


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def main(path):
    req = ExportMetricsServiceRequest()
    with open(path, "rb") as f:
        req.ParseFromString(f.read())
    for rm in req.resource_metrics:
        for kv in rm.resource.attributes:
            print("resource", kv.key, value(kv.value))
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                print("metric", m.name, m.unit or "-")
                if m.name not in WANTED:
                    continue
                points = m.gauge.data_points if m.HasField("gauge") else m.sum.data_points
                for dp in points:
                    attrs = {kv.key: value(kv.value) for kv in dp.attributes}
                    v = dp.as_int if dp.WhichOneof("value") == "as_int" else dp.as_double
                    print("point", m.name, attrs.get("hw.id", "-"), attrs.get("line", "-"),
                          attrs.get("container.id", "-"), int(v))


if __name__ == "__main__":
    main(sys.argv[1])
