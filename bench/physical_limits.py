#!/usr/bin/env python3
"""The machine's physical limits for one checkpoint's bytes, and Stagehand's figures as ratios to
them, measured interleaved round by round in one run (medians over rounds):

  memcpy           a copy of the state in memory (numpy, both buffers written first; best of 2)
  dd O_DIRECT      one stream, `dd oflag=direct conv=fsync` of the same byte count
  buffered write   the same files' sizes written in parallel from memory, then fsync (stagehand-bench
                   save --baseline-only: one stream per data file)
  cold / warm read the checkpoint's files read by --threads threads into buffers written before,
                   the page cache dropped first (cold) or not (warm; the median of 3 in one
                   process) (stagehand-bench load's raw read of the same files)
  ... + XXH3       the same reads, each hashed as it lands (what a load that checks every byte
                   cannot do without)
  ... placed       the same reads, each range landing at its own place in a buffer per file
                   (written before), as a load's bytes land in the tensors: the reads above reuse
                   each thread's 16 MiB buffer, which stays partly in the cores' caches, so no
                   read of a whole state into memory of its own can match them warm

and Stagehand's sync save (staging 0), async stall (the caller's wait; the first async save of a
process, and the median of its next two), cold load and warm load
of the same synthetic state, each a ratio to its limit (limit / Stagehand: 1.0 is at the limit);
the loads also against the hashed reads.

    python3 bench/physical_limits.py [--bin build/bin] [--bytes 1GiB] [--ranks 1] [--threads 8]
                                     [--rounds 3] [--dir /work/limits]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))
from bench_common import baseline_lines, run_bench, save_lines  # noqa: E402
from peer_common import parse_size  # noqa: E402


def bench(args, *argv):
    return run_bench([os.path.join(args.bin, "stagehand-bench"), *argv], "physical_limits", timeout=1200)


def load_lines(stdout):
    """The per-load JSON lines of `stagehand-bench load` (not its summary)."""
    return [line for line in save_lines(stdout) if "load_s" in line]


def memcpy_s(nbytes):
    # np.full writes every page (np.zeros would map them lazily, and the copy would time the
    # page faults); the best of two copies, as a copy into memory already in use is what a save's
    # staging into its persistent buffers is.
    src = np.full(nbytes, 1, dtype=np.uint8)
    dst = np.full(nbytes, 2, dtype=np.uint8)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def dd_direct_s(path, nbytes):
    block = 64 * 2**20
    count = -(-nbytes // block)
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}", "oflag=direct",
                    "conv=fsync", "status=none"], check=True)
    elapsed = time.perf_counter() - t0
    os.remove(path)
    return elapsed * nbytes / (count * block)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--bytes", default="1GiB", help="bytes per rank")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/work/limits")
    args = ap.parse_args()
    nbytes = parse_size(args.bytes) * args.ranks
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    ckpt = os.path.join(args.dir, "ckpt")
    state = ["--bytes-per-rank", args.bytes, "--ranks", str(args.ranks)]
    threads = ["--thread-count", str(args.threads)]
    f = {k: [] for k in ("memcpy", "dd", "buffered", "cold_read", "warm_read",
                         "cold_read_hashed", "warm_read_hashed", "cold_read_placed", "warm_read_placed",
                         "cold_read_placed_hashed", "warm_read_placed_hashed", "save", "first_stall", "stall", "cold_load",
                         "warm_load")}
    for _ in range(args.rounds):
        f["memcpy"].append(memcpy_s(nbytes))
        f["dd"].append(dd_direct_s(os.path.join(args.dir, "dd.bin"), nbytes))
        raw = baseline_lines(bench(args, "save", "--out", ckpt, *state, *threads, "--baseline-only"))
        f["buffered"].append(raw[0]["raw_write_parallel_s"])
        shutil.rmtree(ckpt, ignore_errors=True)
        f["save"].append(save_lines(bench(args, "save", "--out", ckpt, *state, *threads))[0]["save_s"])
        shutil.rmtree(ckpt, ignore_errors=True)
        # Three async saves in one process: the first pays the process's one-time costs (the
        # global plan, the first touch of the staging memory); the stall is the median of the
        # other two.
        stalls = [x["stall_s"] for x in save_lines(bench(args, "save", "--out", ckpt, *state, *threads, "--async",
                                                         "--repeat", "3"))]
        f["first_stall"].append(stalls[0])
        f["stall"].append(statistics.median(stalls[1:]))
        cold = load_lines(bench(args, "load", "--out", ckpt, *state, *threads, "--cold"))
        f["cold_load"].append(cold[0]["load_s"])
        f["cold_read"].append(cold[0]["raw_read_s"])
        f["cold_read_hashed"].append(cold[0]["raw_read_hashed_s"])
        f["cold_read_placed"].append(cold[0]["raw_read_placed_s"])
        f["cold_read_placed_hashed"].append(cold[0]["raw_read_placed_hashed_s"])
        # Warm: the median of 3 loads and 3 raw reads, interleaved in one process.
        warm = load_lines(bench(args, "load", "--out", ckpt, *state, *threads, "--repeat", "3"))
        f["warm_load"].append(statistics.median(x["load_s"] for x in warm))
        f["warm_read"].append(statistics.median(x["raw_read_s"] for x in warm))
        f["warm_read_hashed"].append(statistics.median(x["raw_read_hashed_s"] for x in warm))
        f["warm_read_placed"].append(statistics.median(x["raw_read_placed_s"] for x in warm))
        f["warm_read_placed_hashed"].append(statistics.median(x["raw_read_placed_hashed_s"] for x in warm))
        shutil.rmtree(ckpt, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in f.items()}
    gib = nbytes / 2**30
    print(f"{nbytes / 2**20:.0f} MiB ({args.ranks} rank(s) x {args.bytes}), {args.threads} threads, "
          f"{args.rounds} interleaved rounds; medians")
    print(f"{'limit':<34}{'s':>8}{'GiB/s':>8}")
    for key, name in (("memcpy", "memcpy of the state"), ("dd", "dd O_DIRECT + fsync, one stream"),
                      ("buffered", "buffered write + fsync, parallel"), ("cold_read", "cold read"),
                      ("warm_read", "warm read"), ("cold_read_hashed", "cold read + XXH3"),
                      ("warm_read_hashed", "warm read + XXH3"), ("cold_read_placed", "cold read, placed"),
                      ("warm_read_placed", "warm read, placed"),
                      ("cold_read_placed_hashed", "cold read, placed + XXH3"),
                      ("warm_read_placed_hashed", "warm read, placed + XXH3")):
        print(f"{name:<34}{m[key]:8.3f}{gib / m[key]:8.2f}")
    print(f"\n{'stagehand':<34}{'s':>8}{'limit / stagehand':>20}   against")
    for key, limit, name, against in (
            ("save", min(m["dd"], m["buffered"]), "sync save (staging 0)", "the faster write"),
            ("first_stall", m["memcpy"], "async stall, first of a process", "memcpy of the state"),
            ("stall", m["memcpy"], "async stall, saves 2-3", "memcpy of the state"),
            ("cold_load", m["cold_read"], "cold load", "cold read"),
            ("warm_load", m["warm_read"], "warm load", "warm read"),
            ("cold_load", m["cold_read_hashed"], "cold load", "cold read + XXH3"),
            ("warm_load", m["warm_read_hashed"], "warm load", "warm read + XXH3"),
            ("cold_load", m["cold_read_placed"], "cold load", "cold read, placed"),
            ("warm_load", m["warm_read_placed"], "warm load", "warm read, placed"),
            ("cold_load", m["cold_read_placed_hashed"], "cold load", "cold read, placed + XXH3"),
            ("warm_load", m["warm_read_placed_hashed"], "warm load", "warm read, placed + XXH3")):
        print(f"{name:<34}{m[key]:8.3f}{limit / m[key]:20.2f}   {against}")
    print("by round: " + json.dumps({k: [round(x, 4) for x in v] for k, v in f.items()}))


if __name__ == "__main__":
    main()
