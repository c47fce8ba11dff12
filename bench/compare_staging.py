#!/usr/bin/env python3
"""Bounded staging against staging everything: host memory peak, save time and throughput.

Runs `stagehand-bench save --source device` (state copied out through host staging buffers, as
GPU memory is) with the same state and thread count for each staging value, and the raw
write + fsync of the same bytes (`--baseline-only`, one stream and one per file) in its own
process, interleaved round by round (so that machine noise hits every configuration alike), each process
making --repeat saves (the first allocates the staging buffers, the others reuse them, as in
training), each process under `/usr/bin/time -v` for the maximum resident set size seen from outside. Prints one JSON line per
run, then medians and ratios against staging 0.

  bench/compare_staging.py --bench build/bin/stagehand-bench --out /tmp/stagehand-bench \
      --ranks 2 --bytes-per-rank 1G --thread-count 8 --staging 0,1,2 --rounds 5 --repeat 3
"""
import json
import re
import shutil
import statistics
import subprocess
import sys

import bench_common


def run_raw(args):
    proc = subprocess.run(bench_common.save_command(args, args.out, args.repeat, "--baseline-only"),
                          capture_output=True, text=True, check=True)
    shutil.rmtree(args.out, ignore_errors=True)
    return [min(b["raw_write_s"], b["raw_write_parallel_s"]) for b in bench_common.baseline_lines(proc.stdout)]


def run_once(args, staging):
    cmd = ["/usr/bin/time", "-v"] + bench_common.save_command(args, args.out, args.repeat, "--staging-buckets",
                                                              str(staging), "--source", args.source)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    saves = bench_common.save_lines(proc.stdout)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    for save in saves:
        save["max_rss_bytes"] = rss_kb * 1024
    shutil.rmtree(args.out, ignore_errors=True)
    return saves


def main():
    p = bench_common.parser(__doc__, "1G", 64, 8, 5, 3,
                            "saves per process; the first allocates the staging buffers, later ones reuse them")
    p.add_argument("--staging", default="0,1,2")
    p.add_argument("--source", default="device", choices=["host", "device"])
    args = p.parse_args()
    stagings = [int(s) for s in args.staging.split(",")]
    runs = {s: [] for s in stagings}
    raw = []
    for r in range(args.rounds):
        raw += run_raw(args)
        print(json.dumps({"round": r, "best_raw_write_s": raw[-args.repeat:]}), flush=True)
        for s in stagings:
            for result in run_once(args, s):
                runs[s].append(result)
                print(json.dumps({"round": r, **result}), flush=True)
    base = stagings[0]
    med = lambda s, k: statistics.median(x[k] for x in runs[s])
    summary = {}
    for s in stagings:
        summary[s] = {
            "staging_buckets": s,
            "median_save_s": med(s, "save_s"),
            "median_best_raw_write_s": statistics.median(raw),
            "throughput_vs_best_raw": statistics.median(raw) / med(s, "save_s"),
            "host_staging_peak_bytes": med(s, "host_staging_peak_bytes"),
            "staging_peak_fraction_of_shard": med(s, "host_staging_peak_fraction"),
            "median_max_rss_bytes": med(s, "max_rss_bytes"),
            "save_time_vs_staging_%d" % base: med(s, "save_s") / med(base, "save_s"),
            "staging_peak_vs_staging_%d" % base: med(s, "host_staging_peak_bytes") / med(base, "host_staging_peak_bytes"),
            "max_rss_vs_staging_%d" % base: med(s, "max_rss_bytes") / med(base, "max_rss_bytes"),
        }
        print(json.dumps({"summary": summary[s]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
