#!/usr/bin/env python3
"""Save stall and save time with 4 Worker processes against 4 in-process Workers, same state.

Runs `stagehand-train` on the same config twice per round, alternating: once on the embedded
default (4 in-process Workers) and once as 4 processes started by scripts/launch-local.sh, and
reads the per-save figures rank 0 writes to --metrics-out (`stall_s`: how long the trainer was
blocked; `save_s`: from the save call until the trainer saw the commit). Reports the median
async stall and the median sync save time, and their ratios.

  bench/compare_processes.py --bin build/bin --out /tmp/stagehand-procs --hidden 65536 --rounds 3
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def run(args, mode, async_save, out):
    ckpt = os.path.join(out, f"ckpt-{mode}-{async_save}")
    metrics = os.path.join(out, f"metrics-{mode}-{async_save}.jsonl")
    cmd = [os.path.join(args.bin, "stagehand-train"), "--quiet", "--config",
           os.path.join(ROOT, "examples", "configs", "sync_rl.yaml"), "--metrics-out", metrics]
    for s in (f"trainer.ckpt_path={ckpt}", f"trainer.total_steps={args.steps}",
              f"trainer.ckpt_interval={args.interval}", "trainer.max_ckpts_to_keep=2",
              f"megatron_config.async_dist_ckpt_save={async_save}", f"model.hidden={args.hidden}",
              f"model.batch_size={args.batch}", "model.group_size=2"):
        cmd += ["--set", s]
    if mode == "processes":
        cmd = [os.path.join(ROOT, "scripts", "launch-local.sh"), "4"] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed: {proc.stdout}\n{proc.stderr}")
    lines = [json.loads(l) for l in open(metrics) if '"save"' in l]
    shutil.rmtree(ckpt, ignore_errors=True)
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=65536)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    saves = {}
    for r in range(args.rounds):
        for async_save in ("true", "false"):
            for mode in ("in_process", "processes"):
                for line in run(args, mode, async_save, args.out):
                    saves.setdefault((mode, async_save), []).append(line)
                    print(json.dumps({"round": r, "workers": mode, **line}), flush=True)
    # An async save's save_s runs until the trainer observes the commit (at the next save), so
    # only its stall is compared; a sync save's stall is its whole save time.
    for async_save, figure in (("true", "stall_s"), ("false", "save_s")):
        med = {m: statistics.median(x[figure] for x in saves[(m, async_save)]) for m in ("in_process", "processes")}
        print(json.dumps({"summary": "async stall" if async_save == "true" else "sync save time",
                          "bytes": saves[("in_process", async_save)][0]["bytes"],
                          "median_in_process_s": med["in_process"], "median_processes_s": med["processes"],
                          "processes_vs_in_process": med["processes"] / med["in_process"]}), flush=True)
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
