#!/usr/bin/env python3
"""Async against sync save stall on the same state, and resident memory over many async saves.

Runs `stagehand-bench save --async` and a sync `stagehand-bench save` (through the same actors) on the same
synthetic state, alternating round by round, and reports the ratio of median stalls (the time the
caller was blocked). The first save of each process allocates and first-touches the staging
buffers; medians are over every save. Then one process makes --rss-saves consecutive async saves
and reports how its resident set size moves after the first save.

  bench/compare_async.py --bench build/bin/stagehand-bench --out /tmp/stagehand-async \
      --ranks 2 --bytes-per-rank 512M --rounds 3 --repeat 3 --rss-saves 20
"""
import json
import shutil
import statistics
import subprocess
import sys

import bench_common


def run(args, mode_flags, repeat):
    proc = subprocess.run(bench_common.save_command(args, args.out, repeat, *mode_flags), capture_output=True, text=True,
                          check=True)
    shutil.rmtree(args.out, ignore_errors=True)
    return bench_common.save_lines(proc.stdout)


def main():
    p = bench_common.parser(__doc__, "512M", 32, 4, 3, 3)
    p.add_argument("--rss-saves", type=int, default=20)
    args = p.parse_args()
    saves = {"async": [], "sync": []}
    for r in range(args.rounds):
        for mode, flags in (("sync", ()), ("async", ("--async",))):
            for line in run(args, flags, args.repeat):
                saves[mode].append(line)
                print(json.dumps({"round": r, **line}), flush=True)
    med = lambda mode, key: statistics.median(x[key] for x in saves[mode])
    print(json.dumps({"summary": "stall", "median_sync_stall_s": med("sync", "stall_s"),
                      "median_async_stall_s": med("async", "stall_s"),
                      "async_stall_vs_sync_stall": med("async", "stall_s") / med("sync", "stall_s"),
                      "median_async_time_to_commit_s": med("async", "save_s"),
                      "median_sync_save_s": med("sync", "save_s")}), flush=True)
    if args.rss_saves > 0:
        lines = run(args, ("--async",), args.rss_saves)
        rss = [l["rss_bytes"] for l in lines]
        after_first = rss[1:]
        print(json.dumps({"summary": "rss", "saves": len(rss), "rss_first_save": rss[0],
                          "rss_min_after_first": min(after_first), "rss_max_after_first": max(after_first),
                          "rss_growth_after_first_bytes": max(after_first) - rss[1],
                          "rss_growth_after_first_fraction": (max(after_first) - rss[1]) / rss[1]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
