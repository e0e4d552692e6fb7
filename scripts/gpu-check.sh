#!/usr/bin/env bash
# Runs Allot's services against this machine's real GPUs and records what they saw: the
# collector reads NVML, the executor runs a small pipeline on the GPU (a CPU step, then two
# half-GPU tasks side by side, then a whole-GPU task), and `allot status` is captured idle and
# under load beside nvidia-smi's own readings.
#
#   scripts/gpu-check.sh [OUT_DIR]
#
# ALLOT (default: target/release/allot, else `allot` on the PATH) and NATS_SERVER (default:
# .tools/bin/nats-server, as scripts/install-nats.sh installs it) name the binaries; LOAD_SECS
# (default 25) is how long each GPU task runs; GPU_SOURCE=sim tries the script on a machine
# without a GPU. The GPU tasks multiply bf16 matrices with python3's PyTorch (CUDA); without it
# they only wait, and put no load on the GPU.
#
# Everything lands in OUT_DIR (default ./gpu-check): summary.txt (what to read), the JSON
# snapshots and every service's log. Nothing outside OUT_DIR and a temporary folder is written;
# the nats-server listens on a free loopback port.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
allot=${ALLOT:-$root/target/release/allot}
[[ -x $allot ]] || allot=$(command -v allot || true)
nats_server=${NATS_SERVER:-$root/.tools/bin/nats-server}
load_secs=${LOAD_SECS:-25}
for bin in "$allot" "$nats_server"; do
  if [[ ! -x $bin ]]; then
    echo "gpu-check: no executable ${bin:-allot} (set ALLOT / NATS_SERVER)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap stop EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=nats://127.0.0.1:$port
summary=$out/summary.txt
: >"$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }
section() { say ""; say "== $*"; }

section "machine"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "host: $(uname -srm), $(nproc) CPUs"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1 || true
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,power.limit,pci.bus_id \
    --format=csv 2>&1 | tee -a "$summary"
else
  say "nvidia-smi: not found"
fi
smi_sample() {
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,temperature.gpu,power.draw \
    --format=csv,noheader 2>&1 | sed "s/^/nvidia-smi $1: /" | tee -a "$summary"
}

section "services (nats-server on $url)"
"$nats_server" -js -a 127.0.0.1 -p "$port" -sd "$work/js" >"$out/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
export ALLOT_NATS_URL=$url ALLOT_LOG=${ALLOT_LOG:-info,async_nats=warn} NO_COLOR=1
# Several services on one host: each takes a free port for its ops endpoints (9090 is a pod's).
export ALLOT_OPS_ADDR=${ALLOT_OPS_ADDR:-127.0.0.1:0}
run() { # service, then its flags
  local name=$1
  shift
  (cd "$work" && exec "$allot" run "$name" "$@") >"$out/$name.log" 2>&1 &
  pids+=($!)
}
run inventory
run planner
run allocator
run billing --prices "$root/examples/prices.yaml"
run collector --gpu-source "${GPU_SOURCE:-nvml}" --executor process --telemetry-interval 1s \
  --heartbeat-interval 1s --data-dir "$work/collector"
say "started: inventory planner allocator billing collector (--gpu-source nvml --executor process)"

ready=""
for _ in $(seq 60); do
  if "$allot" status --json >"$work/status.json" 2>/dev/null &&
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if any(n.get("gpus") and any(g.get("utilization_pct") is not None for g in n["gpus"]) for n in s.get("nodes", [])) else 1)' "$work/status.json"; then
    ready=1
    break
  fi
  sleep 1
done
if [[ -z $ready ]]; then
  say "the collector's GPUs never reached the inventory; collector log:"
  tail -n 40 "$out/collector.log" | tee -a "$summary"
  exit 1
fi
section "idle: allot status"
cp "$work/status.json" "$out/status-idle.json"
"$allot" status 2>&1 | tee -a "$summary"
smi_sample idle

section "a pipeline on the GPU (LOAD_SECS=$load_secs)"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  burn="import os, time, torch
print('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES'), 'milli', os.environ.get('ALLOT_GPU_MILLI'), torch.cuda.get_device_name(0), flush=True)
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
end, n = time.time() + $load_secs, 0
while time.time() < end:
    for _ in range(8): a @ a
    torch.cuda.synchronize(); n += 8
print('products', n, flush=True)"
  gpu_cmd=(python3 -c "$burn")
else
  say "no PyTorch with CUDA: the GPU tasks only wait (no load)"
  gpu_cmd=(sh -c "echo CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES milli=\$ALLOT_GPU_MILLI; sleep $load_secs")
fi
python3 - "$work/spec.json" "$load_secs" "${gpu_cmd[@]}" <<'PY'
import json, sys
path, secs, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
task = lambda name, res, after: {"name": name, "resources": res, "command": cmd,
                                 "durationEstimate": f"{secs}s", "after": after}
spec = {"apiVersion": "allot/v1", "kind": "Workload",
        "metadata": {"name": "gpu-check", "team": "platform"},
        "spec": {"tasks": [
            {"name": "probe", "resources": {"cpu": "1"},
             "command": ["sh", "-c", "nvidia-smi -L || echo no nvidia-smi"]},
            task("half-a", {"gpuMilli": 500, "gpuMemory": "20Gi"}, ["probe"]),
            task("half-b", {"gpuMilli": 500, "gpuMemory": "20Gi"}, ["probe"]),
            task("whole", {"gpus": 1}, ["half-a", "half-b"]),
        ]}}
json.dump(spec, open(path, "w"), indent=1)
PY
"$allot" submit "$work/spec.json" --run-id "check-$$" --follow --timeout 600s \
  >"$out/follow.txt" 2>"$out/follow.err" &
submit=$!
# Snapshots while the two halves run, then while the whole-GPU task runs: once `allot status`
# shows those tasks holding the GPU and the load has had a few seconds to show.
held_by() { # the tasks expected to hold GPUs, e.g. "half-a half-b"
  local deadline=$((SECONDS + load_secs + 60))
  while ((SECONDS < deadline)); do
    if "$allot" status --json >"$work/held.json" 2>/dev/null &&
      python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); held=sorted(h["task"] for n in s["nodes"] for g in n["gpus"] for h in g["held_by"]); sys.exit(0 if held==sorted(sys.argv[2:]) else 1)' "$work/held.json" "$@"; then
      return 0
    fi
    sleep 0.2
  done
  say "allot status never showed $* holding the GPU"
  return 1
}
snapshot() { # name, then the tasks expected to hold GPUs
  local name=$1
  shift
  held_by "$@" || return 0
  sleep $((load_secs < 10 ? 0 : 5))
  section "under load ($*): allot status"
  "$allot" status --json >"$out/status-$name.json" 2>/dev/null || true
  "$allot" status 2>&1 | tee -a "$summary"
  smi_sample "$name"
}
snapshot halves half-a half-b
snapshot whole whole
code=0
wait "$submit" || code=$?
section "submit --follow (exit $code)"
cat "$out/follow.err" "$out/follow.txt" | tee -a "$summary"
id=$(head -n 1 "$out/follow.txt")
section "allot workload $id"
"$allot" workload "$id" 2>&1 | tee -a "$summary" || true
for task in probe half-a half-b whole; do
  log=$(find "$work/collector" -name "$task.*.log" 2>/dev/null | head -n 1)
  [[ -n $log ]] && say "$task's output: $(tr '\n' ' ' <"$log")"
done
sleep 3
section "allot costs"
"$allot" costs 2>&1 | tee -a "$summary" || true
exit "$code"
