#!/usr/bin/env python3
"""A PyTorch workload with known numbers, for gpu-check: it allocates tensors of known sizes, runs a
known number of matmuls, and writes what torch.cuda says (allocated/reserved bytes, device) to a
JSON file, so the tracer's numbers can be compared with PyTorch's own."""
import json, os, sys, time

out = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
import torch  # noqa: E402

report = {"pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda}
if not torch.cuda.is_available():
    report["error"] = "torch.cuda.is_available() is False"
    json.dump(report, open(out, "w"), indent=2)
    sys.exit(1)
dev = torch.device("cuda:0")
report["device_name"] = torch.cuda.get_device_name(0)
# Known allocations: 3 x 256 MiB float32 tensors.
tensors = [torch.empty(64 * 1024 * 1024, dtype=torch.float32, device=dev) for _ in range(3)]
a = torch.randn(2048, 2048, device=dev)
b = torch.randn(2048, 2048, device=dev)
torch.cuda.synchronize()
report["after_alloc"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
t0 = time.time()
for _ in range(steps):
    c = a @ b
torch.cuda.synchronize()
report["matmul_steps"] = steps
report["matmul_seconds"] = time.time() - t0
report["after_compute"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
# Hold the memory while the tracer takes its snapshot.
open(out + ".ready", "w").write("1")
time.sleep(float(os.environ.get("HOLD_SECONDS", "5")))
report["at_exit"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
json.dump(report, open(out, "w"), indent=2)
