#!/usr/bin/env python3
"""The local tier against the durable one (issue 30), with stagehand-train (sync RL on the
reference bandit, 4 ranks in one process, a checkpoint of --state-mib or more).

Resume: one checkpoint, saved by a tiered run into a local tier and copied into a durable tier
in a local folder and in the loopback S3 server (tests/integration/s3_server.py, moto), is
resumed (resume_mode latest, nothing trained after it) from each: from the local tier, and, with
the local tier removed (a lost host), from the durable folder (dropped from the page cache
first, as on a new host) and from S3. It prints the load
time the trainer reports and the whole run's wall time, each arm's ratio to the local tier's in
the same round, and the medians. Between rounds the arms rotate, so that none always runs first.

Training: steps per second (the step lines' elapsed_s: a save's stall and its background work
are inside), and the CPU seconds the saves cost per GiB saved, with local saves every step (and,
to show the curve, every 5 steps; and every step with the retired steps' files freed instead of
written over, trainer.local_ckpt_reuse_files false) and a background copy into a durable folder every
--durable-interval steps, against a run without checkpoints (ckpt_interval 0: its one save, of
the last step, comes after its last step line), interleaved round by round.

    python3 bench/tiers.py [--bin build/bin] [--old-bin /work/old/build/bin] [--rounds 3] [--steps 40] [--state-mib 64] [--batch-size 16]
                           [--local-dir /dev/shm/stagehand-tiers] [--dir /work/tiers]

Target (issue 30): training with local saves every step and background uploads at most 5%
slower than training without checkpoints (the median ratio at least 0.95).
"""

import argparse
import json
import os
import re
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
from interference import model_for  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "peers"))
from peer_common import drop_cache  # noqa: E402

RESUMED = re.compile(r"resumed from (\S+) at step \d+, .*\(load ([0-9.]+) s")
CHECKED = re.compile(r"checked every file of \S+ against its metadata across \d+ host folders \(([0-9.]+) s\)")


def train(args, sets, env=None, metrics=None, bin_dir=None):
    """Runs stagehand-train (from `bin_dir`, else --bin) with `sets`; returns (stdout, wall
    seconds, CPU seconds of the child)."""
    cmd = [os.path.join(bin_dir or args.bin, "stagehand-train"), "--config",
           os.path.join(ROOT, "examples", "configs", "sync_rl.yaml")]
    if metrics:
        cmd += ["--quiet", "--metrics-out", metrics]
    base = {"megatron_config.ckpt_save_thread_count": 4, "megatron_config.async_dist_ckpt_save": True,
            **model_for(args.state_mib), "model.batch_size": args.batch_size}
    for key, value in {**base, **sets}.items():
        cmd += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - started
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"tiers: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout, wall, cpu_s


def start_s3():
    """The loopback S3 server; returns (process, environment for stagehand-train)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "integration", "s3_server.py"),
                             "--bucket", "tiers"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    info = json.loads(proc.stdout.readline())
    env = dict(os.environ, AWS_ACCESS_KEY_ID=info["access_key"], AWS_SECRET_ACCESS_KEY=info["secret_key"],
               AWS_ENDPOINT_URL=info["endpoint"], AWS_REGION=info["region"])
    return proc, env


def resume_bench(args):
    s3, env = start_s3()
    try:
        base = os.path.join(args.dir, "resume")
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        local = os.path.join(args.local_dir, "resume")
        shutil.rmtree(local, ignore_errors=True)
        steps = 10
        tiered = {"trainer.total_steps": steps, "trainer.ckpt_interval": steps, "trainer.local_ckpt_interval": steps,
                  "trainer.local_max_ckpts_to_keep": 1, "trainer.max_ckpts_to_keep": 0}
        # The same training twice (it is deterministic): one copy into a folder, one into S3.
        train(args, {**tiered, "trainer.local_ckpt_path": local, "trainer.ckpt_path": os.path.join(base, "durable")},
              env)
        shutil.rmtree(local)
        train(args, {**tiered, "trainer.local_ckpt_path": local, "trainer.ckpt_path": "s3://tiers/durable",
                     "megatron_config.local_work_dir": os.path.join(base, "work")}, env)
        # The same checkpoint once more, in four host folders (one rank each, two copies of each
        # rank's files).
        hosts = os.path.join(args.local_dir, "resume-hosts")
        shutil.rmtree(hosts, ignore_errors=True)
        for h in range(4):
            os.makedirs(os.path.join(hosts, f"host{h}"))
        pattern = os.path.join(hosts, "host{host}", "ckpt")
        replicated = {"trainer.local_ckpt_path": pattern, "trainer.ranks_per_host": 1,
                      "trainer.local_replication_factor": 2}
        train(args, {**tiered, **replicated, "trainer.ckpt_path": os.path.join(base, "durable-hosts")}, env)
        resume = {**tiered, "trainer.resume_mode": "latest", "trainer.local_ckpt_path": local,
                  "megatron_config.local_work_dir": os.path.join(base, "work")}
        arms = {"local tier": {"trainer.ckpt_path": os.path.join(base, "durable")},
                "durable folder": {"trainer.ckpt_path": os.path.join(base, "durable")},
                "durable S3": {"trainer.ckpt_path": "s3://tiers/durable"},
                "4 host folders": {**replicated, "trainer.ckpt_path": os.path.join(base, "durable-hosts")},
                "host 1 lost": {**replicated, "trainer.ckpt_path": os.path.join(base, "durable-hosts")}}
        saved_local = local + ".saved"
        saved_hosts = hosts + ".saved"
        for saved, source in ((saved_local, local), (saved_hosts, hosts)):
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(source, saved)
        results = {name: [] for name in arms}
        for r in range(args.rounds):
            for name in rotated(list(arms), r):
                shutil.rmtree(local, ignore_errors=True)
                shutil.rmtree(hosts, ignore_errors=True)
                if name == "local tier":
                    shutil.copytree(saved_local, local)
                if "host" in name:
                    shutil.copytree(saved_hosts, hosts)
                if name == "host 1 lost":
                    shutil.rmtree(os.path.join(hosts, "host1", "ckpt"))
                if name == "durable folder":
                    # As after a host was replaced: nothing of the durable tier in the page cache.
                    drop_cache(arms[name]["trainer.ckpt_path"])
                out, wall, _ = train(args, {**resume, **arms[name]}, env)
                m = RESUMED.search(out)
                if not m:
                    sys.exit(f"tiers: no 'resumed from' line in the {name} run:\n{out[-2000:]}")
                expected = (local if name == "local tier" else pattern if "host" in name
                            else arms[name]["trainer.ckpt_path"])
                if not m.group(1).startswith(expected):
                    sys.exit(f"tiers: the {name} run resumed from {m.group(1)}, not from {expected}")
                checked = CHECKED.search(out)
                if ("host" in name) != bool(checked):
                    sys.exit(f"tiers: the {name} run {'did not check' if checked is None else 'checked'} host copies")
                results[name].append({"load_s": float(m.group(2)), "wall_s": wall,
                                      "check_s": float(checked.group(1)) if checked else 0.0})
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(saved_local) for f in fs)
        for path in (saved_local, saved_hosts, local, hosts):
            shutil.rmtree(path, ignore_errors=True)
    finally:
        s3.stdin.close()
        s3.wait(timeout=60)
    print(f"resume of one {size / 2**20:.0f} MiB checkpoint (4 ranks in one process), {args.rounds} interleaved rounds;"
          f" local tier in {args.local_dir}")
    print(f"{'from':<16}{'load s by round':<28}{'load ratio':<22}{'median':>7}   {'wall ratio':<22}{'median':>7}")
    base_rows = results["local tier"]
    for name, rows in results.items():
        load_ratio = [row["load_s"] / b["load_s"] for row, b in zip(rows, base_rows)]
        wall_ratio = [row["wall_s"] / b["wall_s"] for row, b in zip(rows, base_rows)]
        loads = " ".join(f"{row['load_s']:6.3f}" for row in rows)
        print(f"{name:<16}{loads:<28}"
              f"{' '.join(f'{x:5.2f}' for x in load_ratio):<22}{statistics.median(load_ratio):7.2f}   "
              f"{' '.join(f'{x:5.2f}' for x in wall_ratio):<22}{statistics.median(wall_ratio):7.2f}")
        if rows[0]["check_s"]:
            check_ratio = [row["check_s"] / b["load_s"] for row, b in zip(rows, base_rows)]
            checks = " ".join(f"{row['check_s']:.3f}" for row in rows)
            print(f"{'':<16}the check of every copy before the load: {checks} s, "
                  f"median {statistics.median(check_ratio):.2f}x the local tier's load")


def steps_bench(args):
    base = os.path.join(args.dir, "steps")
    tiered = {"trainer.local_max_ckpts_to_keep": 2, "trainer.ckpt_interval": args.durable_interval,
              "trainer.max_ckpts_to_keep": 2}
    arms = {"no checkpoints": {"trainer.ckpt_interval": 0},
            "local every step": {"trainer.local_ckpt_interval": 1, **tiered},
            # The snapshot's first bucket of 4 in the stall, the rest staged from the live state
            # behind the fence while the next step's rollouts and forward and backward passes run
            # (through staging in the first saves of a run, into the mapped spare files after).
            "every step, staging 1/4": {"trainer.local_ckpt_interval": 1, **tiered,
                                        "megatron_config.ckpt_save_staging_buckets": 1},
            "every step, no reuse": {"trainer.local_ckpt_interval": 1, **tiered,
                                     "trainer.local_ckpt_reuse_files": False},
            "local every 5": {"trainer.local_ckpt_interval": 5, **tiered},
            "every step, 2 copies": {"trainer.local_ckpt_interval": 1, **tiered, "trainer.ranks_per_host": 1,
                                     "trainer.local_replication_factor": 2}}
    if args.arms:
        wanted = ["no checkpoints"] + [a for a in args.arms if a != "no checkpoints"]
        unknown = [a for a in wanted if a not in arms]
        if unknown:
            sys.exit(f"tiers: no arm {unknown}; the arms: {', '.join(arms)}")
        arms = {name: arms[name] for name in wanted}
    # Each arm's ratios are to the run without checkpoints of its own build. With --old-bin, every
    # arm also runs on the other build, as "<arm> (old)"; that build's run without checkpoints is
    # compared with this build's.
    base_of = {name: "no checkpoints" for name in arms}
    bins = {}
    if args.old_bin:
        for name in list(arms):
            old = f"{name} (old)"
            arms[old], bins[old] = arms[name], args.old_bin
            base_of[old] = "no checkpoints" if name == "no checkpoints" else "no checkpoints (old)"
    baselines = set(base_of.values())
    results = {name: [] for name in arms}
    for r in range(args.rounds):
        for name in rotated(list(arms), r):
            out = os.path.join(base, name.replace(" ", "_"))
            local = os.path.join(args.local_dir, "steps")
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
            os.makedirs(out)
            sets = {"trainer.total_steps": args.steps, "trainer.ckpt_path": os.path.join(out, "ckpt"), **arms[name]}
            if name not in baselines:
                sets["trainer.local_ckpt_path"] = local
            if "copies" in name:
                # Four host folders, one rank each: every rank's files written twice.
                for h in range(4):
                    os.makedirs(os.path.join(local, f"host{h}"))
                sets["trainer.local_ckpt_path"] = os.path.join(local, "host{host}", "ckpt")
            metrics = os.path.join(out, "metrics.jsonl")
            _, _, cpu_s = train(args, sets, metrics=metrics, bin_dir=bins.get(name))
            rows = [json.loads(line) for line in open(metrics)]
            steps = [row for row in rows if row["type"] == "step"]
            saves = [row for row in rows if row["type"] == "save"]
            uploads = [row for row in rows if row["type"] == "upload"]
            every = arms[name].get("trainer.local_ckpt_interval")
            if every and (len(saves) != args.steps // every or not all(u["ok"] for u in uploads)):
                sys.exit(f"tiers: the {name} run saved {len(saves)} steps of {args.steps}, uploads {uploads}")
            # Each step's own seconds (from the second on), by step number: the stall of the
            # save at step s lands in step s + 1, a durable copy started at step s in the next few.
            step_s = {b["step"]: b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:])}
            results[name].append({"steps_per_s": len(steps) / steps[-1]["elapsed_s"], "uploads": len(uploads),
                                  "step_s": step_s,
                                  "cpu_s": cpu_s, "saved_bytes": sum(s["bytes"] for s in saves),
                                  "stall_s": [s["stall_s"] for s in saves],
                                  # The save's own threads' CPU seconds (every rank's writer
                                  # threads, and the caller's copies in the stall) per save,
                                  # from the third save on: the first two write new files (with
                                  # two steps kept, the third also finds no spare yet).
                                  "writer_cpu_per_gib": [s["save_cpu_s"] / (s["bytes"] / 2**30) for s in saves[2:]],
                                  "fence_wait_s": sum(row.get("fence_wait_s", 0) for row in steps)})
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
            time.sleep(1)
    print(f"training, {args.steps} steps of {args.batch_size} samples, a {args.state_mib} MiB state: local saves every step into {args.local_dir}, "
          f"a background copy into a durable folder every {args.durable_interval} steps; {args.rounds} interleaved rounds")
    print(f"{'arm':<32}{'steps/s by round':<28}{'ratio to none':<22}{'median':>7}")
    ratios = {}
    for name, rows in results.items():
        base_rows = results[base_of[name]]
        ratio = [row["steps_per_s"] / b["steps_per_s"] for row, b in zip(rows, base_rows)]
        rates = " ".join(f"{row['steps_per_s']:6.2f}" for row in rows)
        print(f"{name:<32}{rates:<28}"
              f"{' '.join(f'{x:5.2f}' for x in ratio):<22}{statistics.median(ratio):7.3f}")
        if name not in baselines:
            ratios[name] = ratio
            stalls = [s for row in rows for s in row["stall_s"]]
            per_gib = [(row["cpu_s"] - b["cpu_s"]) / ((row["saved_bytes"] - b["saved_bytes"]) / 2**30)
                       for row, b in zip(rows, base_rows)]
            print(f"{'':<32}CPU seconds per GiB saved (this arm's CPU less the run without checkpoints', over the "
                  f"bytes it saved more): median {statistics.median(per_gib):.2f}")
            writer = [x for row in rows for x in row["writer_cpu_per_gib"]]
            if writer:
                print(f"{'':<32}the save's own threads' CPU seconds per GiB saved (every rank's, saves 3 on): median "
                      f"{statistics.median(writer):.3f}")
            # Where the time goes: the two steps after each durable copy began (the copy runs
            # beside them) against the other steps, each against the same steps of the run
            # without checkpoints of its round.
            near, rest = [], []
            for row, b in zip(rows, base_rows):
                for step, secs in row["step_s"].items():
                    if step in b["step_s"]:
                        after = (step - 1) % args.durable_interval
                        (near if after in (0, 1) else rest).append(secs - b["step_s"][step])
            if near and rest:
                copies = (statistics.mean(near) - statistics.mean(rest)) * 2 / args.durable_interval
                print(f"{'':<32}time each step took more than without checkpoints (mean): the two steps after a "
                      f"durable copy began {statistics.mean(near) * 1000:.1f} ms, the others "
                      f"{statistics.mean(rest) * 1000:.1f} ms; so per step of the run, the local saves "
                      f"{statistics.mean(rest) * 1000:.1f} ms and the durable copies {copies * 1000:.1f} ms")
            print(f"{'':<32}save stall median {statistics.median(stalls):.3f} s, max {max(stalls):.3f} s over "
                  f"{len(stalls)} saves; {sum(row['uploads'] for row in rows)} uploads; fence waits "
                  f"{statistics.median(row['fence_wait_s'] for row in rows):.3f} s a run (median)")
    for name in ("local every step", "every step, staging 1/4"):
        if name in ratios:
            median = statistics.median(ratios[name])
            print(f"target ({name}: at most 5% slower than without checkpoints): " +
                  ("met" if median >= 0.95 else f"NOT met (median {median:.3f})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--durable-interval", type=int, default=10)
    ap.add_argument("--state-mib", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16,
                    help="samples per step: the step's compute against the same state")
    ap.add_argument("--local-dir", default="/dev/shm/stagehand-tiers")
    ap.add_argument("--dir", default="/work/tiers")
    ap.add_argument("--only", choices=["resume", "steps"])
    ap.add_argument("--arm", dest="arms", action="append",
                    help="a training arm to run (repeat for more; 'no checkpoints' always runs); default all")
    ap.add_argument("--old-bin", help="another build's bin folder: every training arm also runs with its "
                                      "stagehand-train, interleaved, as '<arm> (old)'")
    args = ap.parse_args()
    os.makedirs(args.local_dir, exist_ok=True)
    if args.only != "steps":
        resume_bench(args)
    if args.only != "resume":
        steps_bench(args)


if __name__ == "__main__":
    main()
