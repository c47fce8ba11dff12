#!/usr/bin/env bash
# Sets up, builds and runs Stagehand's main job: stagehand-train on examples/configs/sync_rl.yaml
# (GRPO-style RL on the reference bandit, tensor 2 x data 2 in-process Workers, async checkpoint
# saves) on the embedded default: one process, local disk, host memory when no GPU is visible.
# Extra arguments go to stagehand-train (e.g. --set trainer.resume_mode=latest).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build -j"$(nproc)" --target stagehand-train stagehand-ckpt

mkdir -p checkpoints  # the configs' ckpt_path is checkpoints/<name>; its parent must exist
# The demo starts fresh each time it is run as is: a fresh start over committed checkpoints is
# refused (trainer.overwrite_checkpoints), so its own previous output goes first. With arguments
# (e.g. --set trainer.resume_mode=latest) nothing is removed.
if [ "$#" -eq 0 ]; then rm -rf checkpoints/sync_rl; fi
./build/bin/stagehand-train --config examples/configs/sync_rl.yaml "$@"
./build/bin/stagehand-ckpt verify checkpoints/sync_rl
