#!/usr/bin/env python3
"""Save time, extra memory and metadata size against the number of tensors (1 to 100k: MoE-shaped
state), Stagehand beside PyTorch DCP, in one run.

Each measurement is one fresh process (so that memory a previous save left in the allocator does
not hide a save's own): it builds the state (torch CPU tensors of `--bytes` in all, every page
touched), reads its RSS, then runs one sync save to a new folder while a thread samples RSS every
2 ms. Reported per system and tensor count, medians over `--rounds` rounds run interleaved (the
systems' order rotates each round):
  save_s       the save call's wall time (stagehand.Checkpointer.save; dcp.save with a
               FileSystemWriter of --threads threads);
  extra_mib    the highest RSS during the save minus the RSS before it;
  metadata_mb  Stagehand's policy/metadata.json; DCP's .metadata.
Then the ratios Stagehand / DCP.

  python3 bench/compare_peers.py --setup          # once: torch into /work/peers-venv
  PYTHONPATH=build/python /work/peers-venv/bin/python bench/many_tensors.py \
      [--counts 1,100,10000,100000] [--bytes 1GiB] [--rounds 3] [--threads 8] [--dir /work/many-tensors]
      [--json bench/results/many_tensors_DATE.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from peer_common import PeakSampler  # noqa: E402

SYSTEMS = ("stagehand", "dcp")


def parse_bytes(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for unit, scale in sorted(units.items(), key=lambda u: -len(u[0])):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_state(count, total):
    """`count` flat bf16/f32 tensors of about total / count bytes each, named as an MoE model's
    experts are, every byte written."""
    import torch
    per = max(4, total // count // 4 * 4)
    gen = torch.Generator().manual_seed(1)
    state = {}
    for i in range(count):
        layer, expert = divmod(i, 64)
        t = torch.empty(per // 4, dtype=torch.float32)
        t.view(torch.uint8).random_(1, 256, generator=gen)
        state[f"model.layers.{layer}.mlp.experts.{expert}.weight"] = t
    return state


def worker(system, count, total, threads, folder):
    state = make_state(count, total)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if system == "stagehand":
        import stagehand
        ckpt = stagehand.Checkpointer(folder, thread_count=threads)
        before = rss_bytes()
        with PeakSampler(rss_bytes) as peak:
            start = time.perf_counter()
            ckpt.save(1, {"model": state})
            save_s = time.perf_counter() - start
        ckpt.close()
        metadata = os.path.join(folder, "global_step_1", "policy", "metadata.json")
    else:
        import torch.distributed.checkpoint as dcp
        target = os.path.join(folder, "step1")
        before = rss_bytes()
        with PeakSampler(rss_bytes) as peak:
            start = time.perf_counter()
            dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(target, thread_count=threads))
            save_s = time.perf_counter() - start
        metadata = os.path.join(target, ".metadata")
    print(json.dumps({"system": system, "count": count, "save_s": save_s,
                      "extra_mib": (peak.peak - before) / 2**20,
                      "metadata_mb": os.path.getsize(metadata) / 1e6}), flush=True)
    shutil.rmtree(folder, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1,10,100,1000,10000,100000")
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--dir", default="/work/many-tensors")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--json", help="also write the medians and the run's settings to this file")
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "COUNT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    total = parse_bytes(args.bytes)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), total, args.threads, os.path.join(args.dir, args.worker[0]))
        return
    counts = [int(c) for c in args.counts.split(",")]
    systems = args.systems.split(",")
    runs = {}
    for r in range(args.rounds):
        for count in counts:
            k = (r + counts.index(count)) % len(systems)
            for system in systems[k:] + systems[:k]:
                cmd = [sys.executable, __file__, "--worker", system, str(count), "--bytes", args.bytes,
                       "--threads", str(args.threads), "--dir", args.dir]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                if proc.returncode != 0:
                    sys.exit(f"many_tensors: {system} at {count} tensors failed:\n{proc.stderr[-3000:]}")
                line = json.loads(proc.stdout.strip().splitlines()[-1])
                print(json.dumps({"round": r, **line}), flush=True)
                runs.setdefault((system, count), []).append(line)
    medians = {}
    print(f"\n{args.bytes} in each state, {args.threads} threads, medians of {args.rounds} rounds")
    print(f"{'tensors':>8} " + " ".join(f"{s + ' ' + m:>22}" for s in systems
                                          for m in ("save_s", "extra_MiB", "metadata_MB")))
    for count in counts:
        row = {}
        for s in systems:
            lines = runs[(s, count)]
            row[s] = {m: statistics.median(l[m] for l in lines) for m in ("save_s", "extra_mib", "metadata_mb")}
        medians[count] = row
        print(f"{count:>8} " + " ".join(f"{row[s][m]:>22.3f}" for s in systems
                                        for m in ("save_s", "extra_mib", "metadata_mb")))
    if set(SYSTEMS) <= set(systems):
        print("\nstagehand / dcp: save time, extra memory, metadata size")
        for count in counts:
            a, b = medians[count]["stagehand"], medians[count]["dcp"]
            ratio = lambda m: a[m] / b[m] if b[m] > 0 else float("nan")
            print(f"{count:>8} {ratio('save_s'):8.2f} {ratio('extra_mib'):8.2f} {ratio('metadata_mb'):8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "bytes": args.bytes,
                       "threads": args.threads, "rounds": args.rounds,
                       "medians": {str(c): v for c, v in medians.items()},
                       "runs": [{"system": s, "count": c, **l} for (s, c), ls in runs.items() for l in ls]}, f,
                      indent=1)


if __name__ == "__main__":
    main()
