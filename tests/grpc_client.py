"""A standard gRPC client on the agent's Unix socket, as a user would write one.

Stubs generated here from the repository's protos with grpcio-tools (the PyPI package, Google's
protoc inside); the channel is Python grpcio's (gRPC C-core) with no options at all: its
`:authority` for a `unix:` target is the percent-encoded socket path. Calls GetStatus,
GetSnapshot and Subscribe (the newest event of a kind, not following) and prints them as one
JSON object (proto field names), for tests/tests/cli.rs to compare with the agent's own client.

Usage: grpc_client.py PROTO_DIR SOCKET_PATH EVENT_KIND
"""

import importlib
import json
import os
import sys
import tempfile

import grpc
import grpc_tools
from google.protobuf import json_format
from grpc_tools import protoc


def main() -> int:
    proto_dir, socket, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    out = tempfile.mkdtemp(prefix="gpu-tracer-stubs-")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    protos = ["gputracer/v1/api.proto", "gputracer/v1/events.proto", "gputracer/v1/snapshot.proto"]
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + protos) != 0:
        print("protoc failed", file=sys.stderr)
        return 2
    sys.path.insert(0, out)
    api = importlib.import_module("gputracer.v1.api_pb2")
    api_grpc = importlib.import_module("gputracer.v1.api_pb2_grpc")
    events = importlib.import_module("gputracer.v1.events_pb2")

    def as_dict(message):
        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = api_grpc.GpuTracerStub(channel)
        status = stub.GetStatus(api.GetStatusRequest(), timeout=20)
        snapshot = stub.GetSnapshot(api.GetSnapshotRequest(), timeout=20)
        wanted = events.EventKind.Value(kind)
        request = api.SubscribeRequest(follow=False, number=1, include=[api.EventFilter(kind=[wanted])])
        got = [as_dict(r) for r in stub.Subscribe(request, timeout=20)]
    print(json.dumps({"status": as_dict(status), "snapshot": as_dict(snapshot), "subscribe": got}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
