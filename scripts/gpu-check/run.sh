#!/usr/bin/env bash
# gpu-check: run on a machine with a real NVIDIA GPU (the `device` tool's machine), from the repo
# root, with the release `gpu-tracer` carried over (target/release/gpu-tracer). It runs the agent
# against the real driver, libcuda and a PyTorch workload and writes $OUT/report.md comparing the
# tracer's numbers with nvidia-smi's and torch.cuda's. Prepared without a GPU: first real run pending.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
T=${GPU_TRACER:-./target/gpu-check/gpu-tracer}
[ -x "$T" ] || { echo "missing $T: run \`cargo xtask gpu-check\` here and carry target/gpu-check" >&2; exit 2; }
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
{
  echo "## environment"; uname -a; cat /proc/driver/nvidia/version 2>&1 | head -2
  nvidia-smi --query-gpu=name,uuid,memory.total,memory.used --format=csv 2>&1
  ls -l /dev/nvidia* 2>&1
} > "$OUT/env.txt"
"$T" doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
echo "doctor exit $?" >> "$OUT/env.txt"
# The tracer first, so it sees the workload from its first open.
"$T" --log info events --json --duration 40 --summary --output "$OUT/events.jsonl" 2> "$OUT/events.err" &
EV=$!
sleep 3
HOLD_SECONDS=20 python3 scripts/gpu-check/workload.py "$OUT/torch.json" 200 > "$OUT/workload.out" 2>&1 &
WL=$!
for _ in $(seq 1 120); do [ -e "$OUT/torch.json.ready" ] && break; sleep 0.5; done
"$T" top --once --json --per-process --interval-ms 3000 > "$OUT/top.json" 2> "$OUT/top.err"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/nvidia-smi-apps.csv" 2>&1
wait "$WL"; echo "workload exit $?" >> "$OUT/env.txt"
wait "$EV"; echo "events exit $?" >> "$OUT/env.txt"
python3 - "$OUT" <<'PY'
import json, sys, os, collections
out = sys.argv[1]
def load(p, default=None):
    try:
        return json.load(open(os.path.join(out, p)))
    except Exception as e:
        return default if default is not None else {"error": str(e)}
torch = load("torch.json"); top = load("top.json"); doctor = load("doctor.json")
pid = torch.get("pid")
smi = {}
for line in open(os.path.join(out, "nvidia-smi-apps.csv")).read().splitlines():
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[0].isdigit():
        smi[int(parts[0])] = int(parts[1]) * 1024 * 1024
events = collections.Counter()
launches = 0
try:
    for l in open(os.path.join(out, "events.jsonl")):
        e = json.loads(l)
        if e.get("tgid") == pid:
            events[e["kind"]] += 1
            if e["kind"] == "cuda_launch_batch":
                launches += e.get("launches", 0)
except Exception as e:
    events["error: " + str(e)] += 1
proc = next((p for p in top.get("state", {}).get("processes", []) if p.get("tgid") == pid), {})
cuda = next((p for p in top.get("cuda", {}).get("processes", []) if p.get("tgid") == pid), {})
mib = lambda b: f"{(b or 0) / 2**20:.1f} MiB"
r = ["# gpu-check report", "", f"workload pid {pid}, torch {torch.get('torch')}, device {torch.get('device_name')}", ""]
r += ["| source | device memory |", "|---|---:|",
      f"| tracer, driver ledger (RM allocations, vidmem) | {mib(proc.get('usage', {}).get('vidmem_bytes'))} |",
      f"| tracer, CUDA ledger (cuMemAlloc*) | {mib(cuda.get('usage', {}).get('device_bytes'))} |",
      f"| nvidia-smi used_memory for the pid | {mib(smi.get(pid))} |",
      f"| torch.cuda.memory_reserved (after compute) | {mib(torch.get('after_compute', {}).get('reserved'))} |",
      f"| torch.cuda.memory_allocated (after compute) | {mib(torch.get('after_compute', {}).get('allocated'))} |", ""]
r += [f"launches counted by the tracer (cuda_launch_batch events): {launches} (the workload ran {torch.get('matmul_steps')} matmuls plus init kernels)", ""]
r += ["events of the workload by kind:", "", "```", json.dumps(dict(events), indent=1), "```", ""]
r += ["doctor families:", "", "```", json.dumps({k: doctor.get('probes', {}).get(k) for k in ('driver', 'lifecycle', 'cuda')}, indent=1)[:3000], "```"]
r += ["", "accounting:", "", "```", json.dumps(top.get("accounting"), indent=1), "```"]
open(os.path.join(out, "report.md"), "w").write("\n".join(r) + "\n")
print("\n".join(r))
PY
