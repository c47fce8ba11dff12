#!/usr/bin/env python3
"""The local tier's copies on other hosts by path against over the network (issue 30, item 2),
with stagehand-train in 4 processes (scripts/launch-local.sh) as 2 hosts of 2 ranks, each rank's
local files on both hosts (local_replication_factor 2), a checkpoint of --state-mib or more.

Arms, interleaved round by round (rotated, so that none always runs first):
  no replicas    one copy of each rank's files (local_replication_factor 1)
  file_system    the other host's folder written by path (trainer.local_replication_transport)
  network        the other host's folder written through its host's file server over TCP

For each: steps per second with local saves every --every steps (rank 0's step lines), the save
stall and the save time (rank 0's save lines), each a ratio to "no replicas" in the same round;
then host 1's folder is removed and the job resumed (nothing trained after it): the load time
the trainer reports, host 1's parts read from host 0 by path or through host 0's server.

    python3 bench/host_transport.py [--bin build/bin] [--rounds 3] [--steps 30] [--every 5]
                                    [--state-mib 64] [--dir /work/host-transport]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import rotated  # noqa: E402
from interference import model_for  # noqa: E402

RESUMED = re.compile(r"resumed from (\S+) at step \d+, .*\(load ([0-9.]+) s")


def train(args, sets, metrics=None):
    cmd = [os.path.join(ROOT, "scripts", "launch-local.sh"), "4", os.path.join(args.bin, "stagehand-train"),
           "--config", os.path.join(ROOT, "examples", "configs", "sync_rl.yaml")]
    if metrics:
        cmd += ["--quiet", "--metrics-out", metrics]
    base = {"megatron_config.ckpt_save_thread_count": 2, "megatron_config.async_dist_ckpt_save": True,
            **model_for(args.state_mib), "trainer.call_timeout_s": 120}
    for key, value in {**base, **sets}.items():
        cmd += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    # launch-local.sh picks a free MASTER_PORT itself.
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    env["GRACE_S"] = "10"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        sys.exit(f"host_transport: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--state-mib", type=int, default=64)
    ap.add_argument("--dir", default="/work/host-transport")
    args = ap.parse_args()
    arms = {"no replicas": {"trainer.local_replication_factor": 1},
            "file_system": {"trainer.local_replication_factor": 2,
                            "trainer.local_replication_transport": "file_system"},
            "network": {"trainer.local_replication_factor": 2, "trainer.local_replication_transport": "network"}}
    results = {name: [] for name in arms}
    for r in range(args.rounds):
        for name in rotated(list(arms), r):
            shutil.rmtree(args.dir, ignore_errors=True)
            for h in range(2):
                os.makedirs(os.path.join(args.dir, f"disk{h}"))
            sets = {"trainer.total_steps": args.steps, "trainer.ckpt_path": os.path.join(args.dir, "durable"),
                    "trainer.ckpt_interval": 0, "trainer.local_ckpt_interval": args.every,
                    "trainer.local_max_ckpts_to_keep": 2, "trainer.ranks_per_host": 2,
                    "trainer.local_ckpt_path": os.path.join(args.dir, "disk{host}", "local"), **arms[name]}
            metrics = os.path.join(args.dir, "metrics.jsonl")
            train(args, sets, metrics=metrics)
            rows = [json.loads(line) for line in open(metrics)]
            steps = [row for row in rows if row["type"] == "step"]
            saves = [row for row in rows if row["type"] == "save"]
            row = {"steps_per_s": len(steps) / steps[-1]["elapsed_s"],
                   "stall_s": statistics.median(s["stall_s"] for s in saves),
                   "save_s": statistics.median(s["save_s"] for s in saves), "load_s": None}
            if name != "no replicas":
                # Host 1 lost: its parts come from host 0.
                shutil.rmtree(os.path.join(args.dir, "disk1"))
                os.makedirs(os.path.join(args.dir, "disk1"))
                subprocess.run(["sync"], check=False)
                out = train(args, {**sets, "trainer.resume_mode": "latest"})
                found = RESUMED.search(out)
                if not found:
                    sys.exit(f"host_transport: the {name} resume printed no load line:\n{out[-3000:]}")
                row["load_s"] = float(found.group(2))
            results[name].append(row)
            time.sleep(1)
    print(f"4 processes as 2 hosts of 2 ranks, a {args.state_mib} MiB state, local saves every {args.every} of "
          f"{args.steps} steps, {args.rounds} interleaved rounds; ratios to 'no replicas' in the same round")
    print(f"{'arm':<14}{'steps/s':>9}{'ratio':>7}{'stall s':>9}{'ratio':>7}{'save s':>9}{'ratio':>7}{'resume load s':>15}")
    base = results["no replicas"]
    for name, rows in results.items():
        med = lambda key: statistics.median(row[key] for row in rows)  # noqa: E731
        ratio = lambda key: statistics.median(row[key] / b[key] for row, b in zip(rows, base))  # noqa: E731
        loads = [row["load_s"] for row in rows if row["load_s"] is not None]
        load = f"{statistics.median(loads):15.3f}" if loads else f"{'':>15}"
        print(f"{name:<14}{med('steps_per_s'):9.2f}{ratio('steps_per_s'):7.3f}{med('stall_s'):9.3f}"
              f"{ratio('stall_s'):7.2f}{med('save_s'):9.3f}{ratio('save_s'):7.2f}{load}")
    net = [n["load_s"] / f["load_s"] for n, f in zip(results["network"], results["file_system"])]
    print(f"resume load, network / file_system by round: {' '.join(f'{x:.2f}' for x in net)}")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
