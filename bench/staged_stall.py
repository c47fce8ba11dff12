#!/usr/bin/env python3
"""The async stall against what it stages before returning (issue 29's target: at most 1.2x a
memcpy of those bytes, plus 5 ms), for several arms of `stagehand-bench save --async` flags, the
arms' processes interleaved round by round. With --staging-buckets M of T threads, a save stages
M / T of each rank's bytes before it returns (all of them with 0). Prints every stall of saves
2+ of each process (the first pays for fresh staging memory), the memcpy of the staged bytes
(numpy, the best of two), the target, and how many stalls were under it.

    python3 bench/staged_stall.py --arm "staging 2 of 8=--staging-buckets 2" \\
        --arm "staging 2 of 8, written over=--staging-buckets 2 --reuse-files" \\
        --arm "staging 0=--staging-buckets 0" [--bench build/bin/stagehand-bench] [--rounds 4]
        [--ranks 2] [--bytes-per-rank 256M] [--threads 8] [--repeat 3] [--dir /work/staged-stall]
        [--old-bench /work/old/build/bin/stagehand-bench]

With --old-bench, every arm also runs on that build, as "<arm> (old)", interleaved with the rest.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))
from bench_common import rotated, save_lines  # noqa: E402
from peer_common import parse_size  # noqa: E402
from physical_limits import memcpy_s  # noqa: E402


def staged_fraction(flags, threads):
    m = re.search(r"--staging-buckets[ =](\d+)", " ".join(flags))
    buckets = int(m.group(1)) if m else 0
    return 1.0 if buckets == 0 else min(buckets, threads) / threads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", action="append", required=True, help="NAME=FLAGS for stagehand-bench save --async")
    ap.add_argument("--bench", default=os.path.join(os.path.dirname(HERE), "build", "bin", "stagehand-bench"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes-per-rank", default="256M")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/work/staged-stall")
    ap.add_argument("--old-bench", help="another build's stagehand-bench: every arm runs on it too")
    args = ap.parse_args()
    arms = []
    for text in args.arm:
        name, sep, flags = text.partition("=")
        if not sep or not name:
            sys.exit(f"staged_stall: --arm '{text}': expected NAME=FLAGS")
        arms.append((name, shlex.split(flags), args.bench))
    if args.old_bench:
        arms += [(f"{name} (old)", flags, args.old_bench) for name, flags, _ in arms]
    total = args.ranks * parse_size(args.bytes_per_rank)
    stalls = {name: [] for name, _, _ in arms}
    for r in range(args.rounds):
        for name, flags, bench in rotated(arms, r):
            out = os.path.join(args.dir, "ckpt")
            shutil.rmtree(out, ignore_errors=True)
            cmd = [bench, "save", "--out", out, "--ranks", str(args.ranks), "--bytes-per-rank",
                   args.bytes_per_rank, "--thread-count", str(args.threads), "--async", "--repeat",
                   str(args.repeat), *flags]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"staged_stall: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
            stalls[name] += [line["stall_s"] for line in save_lines(proc.stdout)[1:]]
            shutil.rmtree(out, ignore_errors=True)
    print(f"{args.ranks} rank(s) x {args.bytes_per_rank}, {args.threads} threads, {args.rounds} rounds of "
          f"{args.repeat} async saves per arm; stalls of saves 2+ in s")
    for name, flags, _ in arms:
        staged = int(total * staged_fraction(flags, args.threads))
        copy = memcpy_s(staged)
        target = 1.2 * copy + 0.005
        under = sum(s <= target for s in stalls[name])
        print(f"{name}: staged {staged / 2**20:.0f} MiB, memcpy {copy:.4f} s, target {target:.4f} s, "
              f"{under} of {len(stalls[name])} under it")
        print("  " + " ".join(f"{s:.4f}" for s in stalls[name]))
    print(json.dumps({"stalls": stalls}))


if __name__ == "__main__":
    main()
