#!/usr/bin/env bash
# Sets up, builds and runs Stagehand's main job on its embedded default (one process, local
# disk, host memory when no GPU): a sharded save of a synthetic 2-rank state with bounded host
# staging, then an independent verification and a listing of the checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build -j"$(nproc)" --target stagehand-bench stagehand-ckpt

out="${1:-checkpoints/demo}"
./build/bin/stagehand-bench save --out "$out" --ranks 2 --bytes-per-rank 64M --tensors 16 \
  --thread-count 8 --staging-buckets 2
./build/bin/stagehand-ckpt verify "$out"
./build/bin/stagehand-ckpt inspect "$out"
