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
# The workload runs in a cgroup named like a Kubernetes pod's container (when cgroup v2 allows), so
# the attribution shows it as a container line; otherwise it is a host process (unattributed).
CG_ROOT=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
POD_UID=$(cat /proc/sys/kernel/random/uuid); CTR=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
CG=""
if [ -n "$CG_ROOT" ]; then
  CG="$CG_ROOT/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${POD_UID//-/_}.slice/cri-containerd-$CTR.scope"
  mkdir -p "$CG" 2>>"$OUT/env.txt" || CG=""
fi
echo "workload cgroup: ${CG:-none (host process)}" >> "$OUT/env.txt"
( [ -n "$CG" ] && echo $BASHPID > "$CG/cgroup.procs"
  HOLD_SECONDS=20 exec python3 scripts/gpu-check/workload.py "$OUT/torch.json" 200 ) > "$OUT/workload.out" 2>&1 &
WL=$!
for _ in $(seq 1 120); do [ -e "$OUT/torch.json.ready" ] && break; sleep 0.5; done
"$T" --price-per-gpu-hour 3.6 top --once --json --per-process --interval-ms 3000 > "$OUT/top.json" 2> "$OUT/top.err"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/nvidia-smi-apps.csv" 2>&1
wait "$WL"; echo "workload exit $?" >> "$OUT/env.txt"
wait "$EV"; echo "events exit $?" >> "$OUT/env.txt"
[ -n "$CG" ] && rmdir "$CG" 2>/dev/null
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
probes = doctor.get("probes", {})
r = ["# gpu-check report", "", f"workload pid {pid}, torch {torch.get('torch')}, device {torch.get('device_name')}", "",
     f"driver family attach mode: {probes.get('attach_mode')} ({probes.get('attach_reason')})", ""]
r += ["| source | device memory |", "|---|---:|",
      f"| tracer, driver ledger (RM allocations, vidmem) | {mib(proc.get('usage', {}).get('vidmem_bytes'))} |",
      f"| tracer, CUDA ledger (cuMemAlloc*) | {mib(cuda.get('usage', {}).get('device_bytes'))} |",
      f"| nvidia-smi used_memory for the pid | {mib(smi.get(pid))} |",
      f"| torch.cuda.memory_reserved (after compute) | {mib(torch.get('after_compute', {}).get('reserved'))} |",
      f"| torch.cuda.memory_allocated (after compute) | {mib(torch.get('after_compute', {}).get('allocated'))} |", ""]
# NVML as the agent read it, and the attribution of the workload's GPU (it must add up to the total).
nv = next((p for d in (top.get("nvml", {}).get("sample") or {}).get("devices", []) for p in d.get("processes", []) if p.get("pid") == pid), {})
r.insert(-1, f"| NVML per-process used (as the agent sampled it) | {mib(nv.get('used_bytes'))} |")
attr = top.get("attribution") or {}
for g in attr.get("gpus", []):
    m = g.get("memory") or {}
    lines = sum(c.get("memory_bytes", 0) for c in g.get("containers", []))
    parts = lines + m.get("driver_reserved", 0) + m.get("unattributed", 0) + m.get("free", 0)
    r += [f"attribution of {g.get('uuid')} ({g.get('name')}): sharing {g.get('sharing')} ({g.get('sharing_reason')}), "
          f"SM split by {g.get('compute', {}).get('method')}", "",
          "| line | bytes |", "|---|---:|"]
    r += [f"| container {c.get('name')} (pids {c.get('pids')}) | {mib(c.get('memory_bytes'))}, SM {c.get('sm_millipct', 0) / 1000:.1f}% |" for c in g.get("containers", [])]
    r += [f"| driver_reserved | {mib(m.get('driver_reserved'))} |", f"| unattributed | {mib(m.get('unattributed'))} ({m.get('unattributed_detail')}) |",
          f"| free | {mib(m.get('free'))} |", f"| total | {mib(m.get('total'))} (parts sum to {mib(parts)}: {'exact' if parts == m.get('total') else 'MISMATCH'}) |", ""]
    c = g.get("cost") or {}
    r += [f"compute: {g.get('compute')}; energy: {g.get('energy')}; cost: {c}", ""]
if not attr:
    r += [f"no attribution: NVML {top.get('nvml', {}).get('status')}: {top.get('nvml', {}).get('reason')}", ""]
r += [f"launches counted by the tracer (cuda_launch_batch events): {launches} (the workload ran {torch.get('matmul_steps')} matmuls plus init kernels)", ""]
r += ["events of the workload by kind:", "", "```", json.dumps(dict(events), indent=1), "```", ""]
r += ["doctor families:", "", "```", json.dumps({k: probes.get(k) for k in ('attach_mode', 'driver', 'lifecycle', 'cuda')}, indent=1)[:3000], "```"]
r += ["", "accounting:", "", "```", json.dumps(top.get("accounting"), indent=1), "```"]
open(os.path.join(out, "report.md"), "w").write("\n".join(r) + "\n")
print("\n".join(r))
PY
