#!/usr/bin/env python3
"""Async saves staged in waves behind the fence, against async saves that stage everything at once.

Runs `stagehand-bench save --async` on the same synthetic state in these modes, interleaved round
by round (medians over every save of every round):
  all0      --staging-buckets 0, no compute          (the async baseline: whole shard staged)
  waves     --staging-buckets N, no compute          (the fence waits for the later waves)
  all0_c    --staging-buckets 0, --compute-s C       (training work after the save)
  waves_c   --staging-buckets N, --compute-s C
  waves_ps  --staging-buckets N, --per-save-staging  (staging buffers freed after every save)
C is measured first: the median time to commit of `all0` times --compute-factor (at least the
write time, as the issue asks). Prints, as ratios:
  host staging peak of `waves` against `all0`;
  stall_s + fence_wait_s of `waves_c` against the stall of `all0_c`;
  the fence wait of `waves` against the time to write all but the last N buckets (the commit
  time of `waves` x (buckets - N) / buckets);
  the time to commit of `waves_ps` against `waves` (per_save against persistent staging memory).

  bench/compare_fence.py --bench build/bin/stagehand-bench --out /tmp/stagehand-fence \\
      --ranks 2 --bytes-per-rank 256M --thread-count 8 --staging-buckets 2 --rounds 3 --repeat 3
"""
import json
import shutil
import statistics
import subprocess
import sys

import bench_common


def run(args, repeat, *flags):
    proc = subprocess.run(bench_common.save_command(args, args.out, repeat, "--async", *flags), capture_output=True,
                          text=True, check=True)
    shutil.rmtree(args.out, ignore_errors=True)
    return bench_common.save_lines(proc.stdout)


def main():
    p = bench_common.parser(__doc__, "256M", 32, 8, 3, 3)
    p.add_argument("--staging-buckets", type=int, default=2)
    p.add_argument("--compute-factor", type=float, default=1.2)
    args = p.parse_args()
    n = str(args.staging_buckets)
    calibration = run(args, args.repeat, "--staging-buckets", "0")
    compute_s = args.compute_factor * statistics.median(l["save_s"] for l in calibration)
    print(json.dumps({"calibration_median_save_s": compute_s / args.compute_factor, "compute_s": compute_s}),
          flush=True)
    c = ("--compute-s", f"{compute_s:.3f}")
    modes = {"all0": ("--staging-buckets", "0"), "waves": ("--staging-buckets", n),
             "all0_c": ("--staging-buckets", "0", *c), "waves_c": ("--staging-buckets", n, *c),
             "waves_ps": ("--staging-buckets", n, "--per-save-staging")}
    saves = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode, flags in modes.items():
            for line in run(args, args.repeat, *flags):
                saves[mode].append(line)
                print(json.dumps({"round": r, "case": mode, **line}), flush=True)
    med = lambda mode, key: statistics.median(x[key] for x in saves[mode])
    blocked = lambda mode: statistics.median(x["stall_s"] + x["fence_wait_s"] for x in saves[mode])
    all_but_last = med("waves", "save_s") * (args.thread_count - args.staging_buckets) / args.thread_count
    print(json.dumps({
        "summary": "fence", "thread_count": args.thread_count, "staging_buckets": args.staging_buckets,
        "peak_waves_vs_all0": med("waves", "host_staging_peak_bytes") / med("all0", "host_staging_peak_bytes"),
        "median_stall_plus_fence_waves_c_s": blocked("waves_c"), "median_stall_all0_c_s": med("all0_c", "stall_s"),
        "blocked_waves_c_vs_all0_c_stall": blocked("waves_c") / med("all0_c", "stall_s"),
        "median_fence_wait_waves_s": med("waves", "fence_wait_s"), "write_all_but_last_n_s": all_but_last,
        "fence_wait_vs_write_all_but_last_n": med("waves", "fence_wait_s") / all_but_last,
        "median_save_s_waves": med("waves", "save_s"), "median_save_s_waves_per_save": med("waves_ps", "save_s"),
        "per_save_vs_persistent_save_s": med("waves_ps", "save_s") / med("waves", "save_s"),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
