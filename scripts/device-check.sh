#!/usr/bin/env bash
# The GPU check: one prepared run of at most 8 minutes on the device machine, from the unpacked
# devpack (scripts/device-pack.sh). The CUDA path of the tests, then the figures the GPU targets
# are ratios of, written to $OUT/device-figures.json (the log to $OUT/device.log):
# - a bare device-to-host copy into pinned memory (stagehand-bench copy) against the same bytes
#   staged by an async save (its stall), as throughput and as time;
# - sync saves from GPU memory staging 2 of 8 buckets against staging all (0);
# - the first save of a process against the later ones;
# - torch + safetensors reading a checkpoint saved from GPU memory.
# Here, on the simulated device (the figures then say nothing of a GPU; the script is checked):
#   STAGEHAND_SIMULATED_GPU=1 SIZE=64M OUT=/tmp/dc scripts/device-check.sh --here
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${1:-}" = --here ]; then
  bin="$here/../build/bin"
  py="$here/../tests/integration/torch_interop_check.py"
  pydir="$here/../build/python"
  device_worker="$here/../tests/python/device_worker.py"
  configs="$here/../examples/configs"
else
  bin="$here/bin"
  py="$here/torch_interop_check.py"
  pydir="$here/python"
  device_worker="$here/device_worker.py"
  configs="$here/examples/configs"
  # cuBLAS comes from the machine's CUDA toolkit (too large to carry).
  export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
fi
size=${SIZE:-1G}
out="${OUT:-/tmp/device-out}"
mkdir -p "$out"
work=$(mktemp -d)
bench="$bin/stagehand-bench"
{
  head -2 /etc/os-release; ldd --version | head -1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
  export STAGEHAND_BIN_DIR="$bin"
  tests=(core_test copy_engine_test load_test save_engine_test async_save_test bandit_mlp_test dispatch_test train_test)
  [ "${SKIP_TESTS:-0}" = 1 ] && tests=()
  for t in "${tests[@]}"; do
    echo "== $t"; "$bin/$t" --log_level=message 2>&1 | grep -v '\[info\]' | tail -15
  done
  echo "== stagehand-train"
  "$bin/stagehand-train" --config "$configs/sync_rl.yaml" --set trainer.ckpt_path="$work/train" 2>&1 |
    grep -E "stagehand-train:|summary"
  echo "== bare copies of $size"
  "$bench" copy --bytes "$size" --repeat 5 | tee "$out/copy.jsonl"
  for m in 0 2; do
    echo "== sync saves from device memory, staging $m of 8"
    "$bench" save --out "$work/s$m" --ranks 1 --bytes-per-rank "$size" --tensors 64 --thread-count 8 \
      --staging-buckets $m --repeat 4 --source device 2>/dev/null | tee "$out/sync_$m.jsonl"
    rm -rf "$work/s$m"
    echo "== async saves from device memory, staging $m of 8"
    "$bench" save --out "$work/a$m" --ranks 1 --bytes-per-rank "$size" --tensors 64 --thread-count 8 \
      --staging-buckets $m --repeat 4 --async --source device 2>/dev/null | tee "$out/async_$m.jsonl"
    rm -rf "$work/a$m"
  done
  echo "== torch + safetensors read a checkpoint saved from device memory"
  "$bench" save --out "$work/i" --ranks 2 --bytes-per-rank 64M --tensors 12 --thread-count 3 --source device > /dev/null 2>&1
  "$bin/stagehand-ckpt" verify "$work/i"
  python3 "$py" "$work/i/global_step_1" || echo "(torch or safetensors missing here)"
  echo "== CUDA arrays from Python (tests/python/device_worker.py)"
  mkdir -p "$work/py"
  if PYTHONPATH="$pydir" python3 -c "import stagehand, ml_dtypes" 2>/dev/null; then
    PYTHONPATH="$pydir" python3 "$device_worker" "$work/py" && echo "device_worker: passed"
  else
    echo "(the stagehand package, numpy or ml_dtypes does not import with this python3)"
  fi
  echo "== figures"
  python3 - "$out" <<'EOF'
import json, os, statistics, sys
out = sys.argv[1]
def lines(name):
    with open(os.path.join(out, name)) as f:
        return [json.loads(l) for l in f if l.startswith("{") and '"summary"' not in l]
copy = lines("copy.jsonl")
bare = statistics.median(l["bare_d2h_s"] for l in copy)
nbytes = copy[0]["bytes"]
fig = {"engine": copy[0]["engine"], "device": copy[0]["device"], "bytes": nbytes, "bare_d2h_s": bare}
for m in (0, 2):
    sync = lines(f"sync_{m}.jsonl")
    asyn = lines(f"async_{m}.jsonl")
    fig[f"sync_save_s_staging_{m}"] = statistics.median(l["save_s"] for l in sync[1:])
    fig[f"first_save_s_staging_{m}"] = sync[0]["save_s"]
    fig[f"async_stall_s_staging_{m}"] = statistics.median(l["stall_s"] for l in asyn[1:])
    fig[f"state_bytes_{m}"] = sync[0]["bytes"]
stall = fig["async_stall_s_staging_0"]
ratios = {
    # What the save path moves per second from device memory, against the bare copy (target >= 0.9).
    "save_path_d2h_vs_bare": (fig["state_bytes_0"] / stall) / (nbytes / bare),
    # The async stall against the bare copy of the same bytes (target <= 1.1).
    "async_stall_vs_bare": stall / (bare * fig["state_bytes_0"] / nbytes),
    # Staging 2 of 8 against staging all, sync saves from device memory (target <= 1.05).
    "staging_2_vs_0": fig["sync_save_s_staging_2"] / fig["sync_save_s_staging_0"],
    # The first save of a process against the later ones (target <= 1.1).
    "first_vs_later": fig["first_save_s_staging_0"] / fig["sync_save_s_staging_0"],
}
fig["ratios"] = ratios
with open(os.path.join(out, "device-figures.json"), "w") as f:
    json.dump(fig, f, indent=1)
print(json.dumps(fig, indent=1))
EOF
} 2>&1 | tee "$out/device.log"
rm -rf "$work"
