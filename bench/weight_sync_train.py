#!/usr/bin/env python3
"""The fully-async trainer's weight sync in a training run: `stagehand-train` on
examples/configs/fully_async_rl.yaml with weight_sync.transport shm (every rank pushes its part of
each version over the shared-memory channel in the background; the generators receive it) against
collective (the reference model's own path through the tensor-parallel group), the runs
interleaved round by round. Prints the median steps/s of each (elapsed_s of the last step line)
and shm / collective.

    python3 bench/weight_sync_train.py [--bin build/bin] [--steps 300] [--rounds 5] [--hidden 4096]

--hidden scales the model (its weights: 2 x hidden x (context_dim + num_arms) bf16 values), so
that the push is a measurable part of a step.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(args, transport, work):
    ckpt = os.path.join(work, f"ckpt-{transport}")
    metrics = os.path.join(work, f"metrics-{transport}.jsonl")
    shutil.rmtree(ckpt, ignore_errors=True)
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [os.path.join(args.bin, "stagehand-train"), "--quiet", "--config",
           os.path.join(ROOT, "examples", "configs", "fully_async_rl.yaml"), "--metrics-out", metrics]
    for key, value in {"trainer.ckpt_path": ckpt, "trainer.total_steps": args.steps, "trainer.ckpt_interval": 0,
                       "model.hidden": args.hidden, "weight_sync.transport": transport}.items():
        cmd += ["--set", f"{key}={value}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"{transport}: stagehand-train failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    steps = [json.loads(line) for line in open(metrics) if '"type":"step"' in line]
    return len(steps) / steps[-1]["elapsed_s"], sum(s["fence_wait_s"] for s in steps)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="weight-sync-train-")
    figures = {"shm": [], "collective": []}
    waits = {"shm": [], "collective": []}
    try:
        for r in range(args.rounds):
            order = ["shm", "collective"] if r % 2 == 0 else ["collective", "shm"]
            for transport in order:
                rate, wait = run(args, transport, work)
                figures[transport].append(rate)
                waits[transport].append(wait)
                print(json.dumps({"round": r, "transport": transport, "steps_per_s": round(rate, 2),
                                  "fence_wait_s": round(wait, 4)}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {t: statistics.median(v) for t, v in figures.items()}
    ratios = [a / b for a, b in zip(figures["shm"], figures["collective"])]
    print(f"steps/s, median of {args.rounds} interleaved runs of {args.steps} steps (hidden {args.hidden}): "
          f"shm {med['shm']:.1f}, collective {med['collective']:.1f}; shm / collective "
          f"{med['shm'] / med['collective']:.3f} (per round {min(ratios):.3f}-{max(ratios):.3f}); "
          f"fence wait per run, median: shm {statistics.median(waits['shm']):.3f} s, "
          f"collective {statistics.median(waits['collective']):.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "steps_per_s": figures, "fence_wait_s": waits}, f, indent=1)


if __name__ == "__main__":
    main()
