#!/usr/bin/env python3
"""How steady a run of saves is: K sync (or async) saves per process of `stagehand-bench save`, for
several arms (a binary and its flags), the arms' processes interleaved round by round (the order
rotated each round). Per arm: the median save 1, save 2 and saves 3+ over every process, and the
slowest / median of saves 3+ (issue 29's steadiness figure), with the write and fsync phases of
the slowest save.

    python3 bench/save_steadiness.py --arm "old=/work/head/build/bin/stagehand-bench" \\
        --arm "new=build/bin/stagehand-bench" \\
        --arm "new, no early write-back=build/bin/stagehand-bench --no-early-writeback" \\
        --rounds 3 --saves 10 [--bytes-per-rank 1G] [--tensors 32] [--threads 8] [--dir /work/steady]

An older build to compare with: `git worktree add /work/head <commit>`, then
`cmake -S /work/head -B /work/head/build -DCMAKE_BUILD_TYPE=Release && cmake --build
/work/head/build --target stagehand-bench`. An arm's flags are passed to `stagehand-bench save` as they are (--async, --staging-buckets 2,
...); the figure is save_s (for --async: until the commit; the stall is stall_s, also printed).
"""
import argparse
import os
import shlex
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import rotated, run_bench, save_command, save_lines  # noqa: E402


def parse_arm(text):
    name, sep, command = text.partition("=")
    if not sep or not name or not command:
        raise argparse.ArgumentTypeError(f"--arm '{text}': expected NAME=BINARY [FLAGS...]")
    words = shlex.split(command)
    return name, words[0], words[1:]


def run_process(args, binary, flags):
    out = os.path.join(args.dir, "ckpt")
    shutil.rmtree(out, ignore_errors=True)
    state = argparse.Namespace(bench=binary, ranks=1, bytes_per_rank=args.bytes_per_rank, tensors=args.tensors,
                               thread_count=args.threads)
    stdout = run_bench(save_command(state, out, args.saves, *flags), "save_steadiness")
    shutil.rmtree(out, ignore_errors=True)
    return [x for x in save_lines(stdout) if "save_s" in x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", action="append", type=parse_arm, required=True, help="NAME=BINARY [FLAGS...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--saves", type=int, default=10, help="saves per process (at least 4)")
    ap.add_argument("--bytes-per-rank", default="1G")
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--dir", default="/work/steady")
    args = ap.parse_args()
    if args.saves < 4:
        sys.exit("save_steadiness: --saves must be at least 4")
    os.makedirs(args.dir, exist_ok=True)
    saves = {name: [] for name, _, _ in args.arm}
    for r in range(args.rounds):
        for name, binary, flags in rotated(args.arm, r):
            saves[name].append(run_process(args, binary, flags))
    print(f"1 rank x {args.bytes_per_rank} in {args.tensors} tensors, {args.threads} threads, {args.rounds} rounds "
          f"of {args.saves} saves per process; seconds, medians over the processes")
    print(f"{'arm':<34}{'save 1':>8}{'save 2':>8}{'saves 3+':>10}{'slowest 3+':>12}{'slowest / median':>18}"
          f"   slowest: write, fsync")
    for name, _, _ in args.arm:
        first = [p[0]["save_s"] for p in saves[name]]
        second = [p[1]["save_s"] for p in saves[name]]
        later = [x for p in saves[name] for x in p[2:]]
        times = [x["save_s"] for x in later]
        median = statistics.median(times)
        slowest = max(later, key=lambda x: x["save_s"])
        phases = slowest.get("phases", {})
        print(f"{name:<34}{statistics.median(first):8.3f}{statistics.median(second):8.3f}{median:10.3f}"
              f"{slowest['save_s']:12.3f}{slowest['save_s'] / median:18.2f}"
              f"   {phases.get('write_s', 0):.3f}, {phases.get('fsync_s', 0):.3f}")
        stalls = [x["stall_s"] for x in later if x.get("mode") == "async"]
        if stalls:
            print(f"{'':<34}stall of saves 3+: median {statistics.median(stalls):.3f}, slowest {max(stalls):.3f}")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
