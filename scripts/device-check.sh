#!/usr/bin/env bash
# The GPU check, run on the device machine from the unpacked devpack (see device-pack.sh):
# the CUDA path of the tests, pinned device-to-host staging, the save benchmarks, and torch +
# safetensors reading a checkpoint saved from GPU memory. Logs go to $OUT.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# cuBLAS comes from the machine's CUDA toolkit (too large to carry).
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
out="${OUT:-/tmp/device-out}"
mkdir -p "$out"
work=$(mktemp -d)
{
  head -2 /etc/os-release; ldd --version | head -1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  export STAGEHAND_BIN_DIR="$here/bin" STAGEHAND_SOURCE_DIR="$here"
  tests=(core_test load_test save_engine_test async_save_test bandit_mlp_test dispatch_test train_test)
  [ "${SKIP_TESTS:-0}" = 1 ] && tests=()
  for t in "${tests[@]}"; do
    echo "== $t"; "$here/bin/$t" --log_level=message 2>&1 | grep -v '\[info\]' | tail -15
  done
  echo "== stagehand-train on the GPU"
  "$here/bin/stagehand-train" --config "$here/examples/configs/sync_rl.yaml" --set trainer.ckpt_path="$work/train" 2>&1 |
    grep -E "stagehand-train:|summary"
  if [ "${SKIP_BENCH:-0}" = 1 ]; then exit 0; fi
  bench="$here/bin/stagehand-bench"
  echo "== async stall (pinned D2H) vs sync, 2 ranks x 1 GiB on GPU"
  "$bench" save --out "$work/a" --ranks 2 --bytes-per-rank 1G --tensors 64 --thread-count 8 --repeat 3 --async --source device 2>&1 | grep -v info
  "$bench" save --out "$work/s" --ranks 2 --bytes-per-rank 1G --tensors 64 --thread-count 8 --repeat 3 --source device 2>&1 | grep -v info
  echo "== cold loads of that checkpoint into GPU memory (bounded pinned buffers), against a raw read"
  "$bench" load --out "$work/s" --ranks 2 --bytes-per-rank 1G --tensors 64 --thread-count 8 --repeat 3 --cold 2>&1 | grep -v info
  echo "== staging 0 / 2 of 8 with raw-write baseline"
  for m in 0 2 0 2; do
    "$bench" save --out "$work/w$m" --ranks 2 --bytes-per-rank 1G --tensors 64 --thread-count 8 --staging-buckets $m --repeat 3 --baseline --source device 2>&1 | grep summary
    rm -rf "$work/w$m"
  done
  echo "== torch + safetensors read the GPU-saved checkpoint"
  "$bench" save --out "$work/i" --ranks 2 --bytes-per-rank 64M --tensors 12 --thread-count 3 --source device > /dev/null 2>&1
  "$here/bin/stagehand-ckpt" verify "$work/i"
  python3 "$here/torch_interop_check.py" "$work/i/global_step_1"
} 2>&1 | tee "$out/device.log"
rm -rf "$work"
