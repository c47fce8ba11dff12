#!/usr/bin/env python3
"""Staging waves against staging everything: host memory peak, save time and throughput.

Runs `stagehand-bench save` with the same state and thread count for each staging value,
interleaved round by round (so that machine noise hits every configuration alike), each process
making --repeat saves (the first allocates the staging buffers, the others reuse them, as in
training), each process under `/usr/bin/time -v` for the maximum resident set size seen from outside. Prints one JSON line per
run, then medians and ratios against staging 0.

  bench/compare_staging.py --bench build/bin/stagehand-bench --out /tmp/stagehand-bench \
      --ranks 2 --bytes-per-rank 1G --thread-count 8 --staging 0,1,2 --rounds 5 --repeat 3
"""
import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys


def run_once(args, staging):
    cmd = ["/usr/bin/time", "-v", args.bench, "save", "--out", args.out, "--ranks", str(args.ranks),
           "--bytes-per-rank", args.bytes_per_rank, "--tensors", str(args.tensors),
           "--thread-count", str(args.thread_count), "--staging-buckets", str(staging), "--baseline",
           "--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    saves = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{") and "summary" not in l]
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    for save in saves:
        save["max_rss_bytes"] = rss_kb * 1024
    shutil.rmtree(args.out, ignore_errors=True)
    return saves


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes-per-rank", default="1G")
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--thread-count", type=int, default=8)
    p.add_argument("--staging", default="0,1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3,
                   help="saves per process; the first allocates the staging buffers, later ones reuse them")
    args = p.parse_args()
    stagings = [int(s) for s in args.staging.split(",")]
    runs = {s: [] for s in stagings}
    for r in range(args.rounds):
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
            "median_raw_write_s": med(s, "raw_write_s"),
            "throughput_vs_raw": med(s, "raw_write_s") / med(s, "save_s"),
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
