#!/usr/bin/env python3
"""Save and load time of two stagehand-bench binaries (an old build against a new one), same state.

Runs `stagehand-bench save` (sync, host state, each process saving step 1 into a fresh folder
under --out, removed after) with --old and --new alternately, the order swapped every round
(old-new, new-old, ...), so that machine noise hits both alike; then `stagehand-bench load`
the same way, both binaries loading one checkpoint written once by --new (warm page cache, as
the save left it), each process making --load-repeat loads. Reads save_s and load_s from the
per-run JSON lines (load_s: the load through the dispatch; raw_read_s: plain reads of the same
files in the same process, a noise control). Prints one JSON line per run, then for save and
for load the median old and new times, new/old of the medians, the median of the rounds'
new/old ratios, and every run's figure.

  bench/compare_binaries.py --old /work/old/build/bin/stagehand-bench \
      --new build/bin/stagehand-bench --out /tmp/stagehand-binaries \
      --ranks 1 --bytes-per-rank 1G --rounds 7 --load-repeat 3
"""
import argparse
import json
import os
import shutil
import statistics
import sys

import bench_common


def run(cmd):
    return bench_common.save_lines(bench_common.run_bench(cmd, "compare_binaries"))


def save(args, binary, out, keep=False):
    lines = run(bench_common.save_command(argparse.Namespace(**vars(args), bench=binary), out, 1))
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return lines


def load(args, binary, out):
    return run([binary, "load", "--out", out, "--ranks", str(args.ranks), "--bytes-per-rank", args.bytes_per_rank,
                "--tensors", str(args.tensors), "--thread-count", str(args.load_thread_count),
                "--repeat", str(args.load_repeat)])


def compare(args, what, figure, once):
    runs = {"old": [], "new": []}
    paired = []
    for r in range(args.rounds):
        this_round = {}
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            this_round[which] = once(getattr(args, which))
            for line in this_round[which]:
                runs[which].append(line)
                print(json.dumps({"round": r, "binary": which, **line}), flush=True)
        round_med = {w: statistics.median(x[figure] for x in lines) for w, lines in this_round.items()}
        paired.append(round_med["new"] / round_med["old"])
    med = {w: statistics.median(x[figure] for x in runs[w]) for w in runs}
    summary = {"summary": what, "figure": figure, "bytes": runs["old"][0]["bytes"],
               "median_old_s": med["old"], "median_new_s": med["new"], "new_vs_old": med["new"] / med["old"],
               "median_round_new_vs_old": statistics.median(paired),
               "old_s": [x[figure] for x in runs["old"]], "new_s": [x[figure] for x in runs["new"]]}
    if figure == "load_s":
        summary["load_vs_raw_old"] = statistics.median(x["load_s"] / x["raw_read_s"] for x in runs["old"])
        summary["load_vs_raw_new"] = statistics.median(x["load_s"] / x["raw_read_s"] for x in runs["new"])
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="the baseline stagehand-bench binary")
    p.add_argument("--new", required=True, help="the stagehand-bench binary to compare with it")
    p.add_argument("--out", required=True, help="scratch folder for the checkpoints (removed at the end)")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--bytes-per-rank", default="1G")
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--thread-count", type=int, default=2, help="ckpt_save_thread_count")
    p.add_argument("--load-thread-count", type=int, default=4, help="ckpt_load_thread_count")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--load-repeat", type=int, default=3, help="loads per process")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    summaries = [compare(args, "save", "save_s", lambda b: save(args, b, os.path.join(args.out, "save")))]
    ckpt = os.path.join(args.out, "load")
    save(args, args.new, ckpt, keep=True)
    summaries.append(compare(args, "load", "load_s", lambda b: load(args, b, ckpt)))
    for s in summaries:
        print(json.dumps(s), flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
