#!/usr/bin/env python3
"""How much training slows down while checkpoints save: stagehand-train (the reference bandit,
4 ranks in one process, a state of --state-mib or more) run without saves and with async saves
every --interval steps (ckpt_save_staging_buckets 0 and 2 of 8 writer threads), the arms
interleaved round by round so that they see the same machine. For each arm it prints steps per
second over the whole run (from the step lines' elapsed_s, so a save's stall and its background
writes are inside), the ratio to the run without saves in the same round, and the CPU seconds
(user + system, from the child's rusage) the saves cost per GiB saved: (CPU of the arm - CPU of
the run without saves) / (GiB saved by the arm - GiB saved by the run without saves; that run saves
only its last step).

    python3 bench/interference.py [--bin build/bin] [--rounds 3] [--steps 40] [--interval 10]
                                  [--state-mib 512] [--dir /work/interference] [--steady-after 30]
With more steps than --steady-after, it also prints the same figures over the steps after it: the
first saves of a run write new files (and, on a virtual machine, fill page-cache pages the host has
to provide anew), the later ones write over the files retention removed.

Target (issue 29): training with async saves every 10 steps at least 0.95x the steps per second
of training without saves (median over rounds), for both staging settings.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import rotated  # noqa: E402


def model_for(state_mib):
    """A bandit whose checkpoint holds at least state_mib MiB: the weights (context_dim x hidden,
    hidden x arms) with Adam's two moments, fp32, 12 bytes a parameter."""
    context, arms = 2048, 64
    hidden = -(-state_mib * 2**20 // (12 * (context + arms)))
    hidden = -(-hidden // 512) * 512  # a multiple of 512: splits evenly across tensor-parallel ranks
    return {"model.context_dim": context, "model.num_arms": arms, "model.hidden": hidden,
            "model.batch_size": 16, "model.group_size": 4}


def run_arm(args, name, settings):
    out = os.path.join(args.dir, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    metrics = os.path.join(out, "metrics.jsonl")
    sets = {"trainer.total_steps": args.steps, "trainer.ckpt_path": os.path.join(out, "ckpt"),
            "trainer.max_ckpts_to_keep": 2, "trainer.resume_mode": "none",
            "megatron_config.ckpt_save_thread_count": 8, **model_for(args.state_mib), **settings}
    cmd = [os.path.join(args.bin, "stagehand-train"), "--config",
           os.path.join(ROOT, "examples", "configs", "sync_rl.yaml"), "--quiet", "--metrics-out", metrics]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"interference: {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    steps, saves = [], []
    with open(metrics) as f:
        for line in f:
            row = json.loads(line)
            (steps if row.get("type") == "step" else saves).append(row)
    shutil.rmtree(os.path.join(out, "ckpt"), ignore_errors=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # From the step after `steady_after` on: the saves there write over the data files of the steps
    # retention removed (trainer.ckpt_reuse_files), as every save of a long run does.
    at = {row["step"]: row["elapsed_s"] for row in steps}
    last = steps[-1]["step"]
    steady = None
    if args.steady_after in at and last > args.steady_after:
        steady = (last - args.steady_after) / (at[last] - at[args.steady_after])
    return {"steps_per_s": len(steps) / steps[-1]["elapsed_s"],
            "steady_steps_per_s": steady,
            "cpu_s": cpu,
            "saved_bytes": sum(s.get("bytes", 0) for s in saves),
            "stall_s": [s.get("stall_s", 0.0) for s in saves]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--state-mib", type=int, default=512)
    ap.add_argument("--dir", default="/work/interference")
    ap.add_argument("--steady-after", type=int, default=None,
                    help="also report steps/s over the steps after this one (default: 3 x --interval, once "
                         "retention keeps 2 steps and the saves write over the files of the ones it removed)")
    ap.add_argument("--uncached", choices=["default", "on", "off", "both"], default="default",
                    help="megatron_config.ckpt_save_uncached of the save arms: as the config has it, on, off, "
                         "or an arm of each")
    args = ap.parse_args()
    if args.steady_after is None:
        args.steady_after = 3 * args.interval
    if args.steps < 2 * args.interval:
        sys.exit("interference: --steps must allow at least two saves (2 x --interval)")
    arms = {"no saves": {"trainer.ckpt_interval": 0, "megatron_config.async_dist_ckpt_save": True}}
    uncached = {"default": [None], "on": [True], "off": [False], "both": [False, True]}[args.uncached]
    for staging, label in ((0, "staging 0"), (2, "staging 2 of 8")):
        for u in uncached:
            arm = {"trainer.ckpt_interval": args.interval, "megatron_config.async_dist_ckpt_save": True,
                   "megatron_config.ckpt_save_staging_buckets": staging}
            if u is not None:
                arm["megatron_config.ckpt_save_uncached"] = u
            suffix = "" if len(uncached) == 1 else (", uncached" if u else ", cached")
            arms[f"async, {label}{suffix}"] = arm
    results = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.rounds):
        for name in rotated(names, r):
            results[name].append(run_arm(args, name.replace(" ", "_").replace(",", ""), arms[name]))
            time.sleep(1)
    base = results["no saves"]
    w = max(24, max(len(n) for n in names) + 2)
    model = model_for(args.state_mib)
    print(f"stagehand-train sync_rl, 4 ranks in one process, hidden {model['model.hidden']} "
          f"(a {base[0]['saved_bytes'] / 2**20:.0f} MiB checkpoint), {args.steps} steps, async saves "
          f"every {args.interval} steps, 8 writer threads, {args.rounds} interleaved rounds")
    print(f"{'arm':<{w}}{'steps/s by round':<28}{'ratio to no saves':<26}{'median':>7}"
          f"{'CPU s/GiB saved':>17}")
    ratios = {name: [row["steps_per_s"] / b["steps_per_s"] for row, b in zip(results[name], base)] for name in names}
    for name in names:
        rows = results[name]
        sps = [row["steps_per_s"] for row in rows]
        if name == "no saves":
            cpu = "-"
        else:
            per_gib = [(row["cpu_s"] - b["cpu_s"]) / ((row["saved_bytes"] - b["saved_bytes"]) / 2**30)
                       for row, b in zip(rows, base)]
            cpu = f"{statistics.median(per_gib):.2f}"
        print(f"{name:<{w}}{' '.join(f'{x:6.3f}' for x in sps):<28}{' '.join(f'{x:5.2f}' for x in ratios[name]):<26}"
              f"{statistics.median(ratios[name]):7.3f}{cpu:>17}")
        if name != "no saves":
            stalls = [s for row in rows for s in row["stall_s"]]
            print(f"{'':<{w}}save stall median {statistics.median(stalls):.3f} s, max {max(stalls):.3f} s "
                  f"over {len(stalls)} saves")
    if args.steps > args.steady_after:
        print(f"\nfrom step {args.steady_after + 1} on (the saves there write over the files of the steps retention "
              f"removed; the saves before wrote new files):")
        steady = {name: [row["steady_steps_per_s"] / b["steady_steps_per_s"] for row, b in zip(results[name], base)]
                  for name in names}
        for name in names:
            sps = [row["steady_steps_per_s"] for row in results[name]]
            print(f"{name:<{w}}{' '.join(f'{x:6.3f}' for x in sps):<28}{' '.join(f'{x:5.2f}' for x in steady[name]):<26}"
                  f"{statistics.median(steady[name]):7.3f}")
        print()
    worst = min(statistics.median(ratios[n]) for n in names[1:])
    print("target (>= 0.95x the steps per second without saves): " + ("met" if worst >= 0.95 else
          f"NOT met (worst median {worst:.3f})"))


if __name__ == "__main__":
    main()
