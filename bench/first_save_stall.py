#!/usr/bin/env python3
"""The first async save of a process against its later ones, for two stagehand-bench binaries (an
old build against a new one): each run is `stagehand-bench save --async --repeat 3` into a fresh
folder, the binaries alternating and their order swapped every round. Prints, per layout, every
run's first stall / the median of its later two, then for each binary the medians of the first
stall, of the later stalls and of first / later, the staging peak over what is saved
(host_staging_peak_fraction), the huge-page faults of the first save (vmstat thp_fault_alloc) and
the peak RSS.

  python3 bench/first_save_stall.py --old /work/old/build/bin/stagehand-bench \\
      --new build/bin/stagehand-bench [--rounds 6] [--out /work/fs] [--layout "1 rank"]
"""
import argparse
import json
import shutil
import statistics
import subprocess

LAYOUTS = [("1 rank x 1 GiB, 8 threads", ["--ranks", "1", "--bytes-per-rank", "1G", "--thread-count", "8"]),
           ("2 ranks x 1 GiB, 8 threads", ["--ranks", "2", "--bytes-per-rank", "1G", "--thread-count", "8"]),
           ("4 ranks x 256 MiB, 4 threads", ["--ranks", "4", "--bytes-per-rank", "256M", "--thread-count", "4"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="/work/fs")
    ap.add_argument("--layout", action="append",
                    help="run only the layouts whose name starts with this (repeatable), e.g. '1 rank'")
    args = ap.parse_args()
    bins = {"old": args.old, "new": args.new}
    for layout, flags in LAYOUTS:
        if args.layout and not any(layout.startswith(prefix) for prefix in args.layout):
            continue
        runs = {name: [] for name in bins}
        for r in range(args.rounds):
            for name in (list(bins) if r % 2 == 0 else list(bins)[::-1]):
                shutil.rmtree(args.out, ignore_errors=True)
                out = subprocess.run([bins[name], "save", "--out", args.out, *flags, "--async", "--repeat", "3"],
                                     capture_output=True, text=True, check=True).stdout
                rows = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"stall_s"' in line]
                stalls = [row["stall_s"] for row in rows]
                runs[name].append({"first": stalls[0], "later": statistics.median(stalls[1:]),
                                   "peak": rows[0]["host_staging_peak_fraction"],
                                   "thp": rows[0]["vmstat"]["thp_fault_alloc"], "rss": rows[-1]["peak_rss_bytes"]})
        print(layout)
        for name, rows in runs.items():
            med = lambda key: statistics.median(row[key] for row in rows)  # noqa: E731
            print(f"  {name}: " + " ".join(f"{row['first']:.3f}/{row['later']:.3f}" for row in rows))
            print(f"  {name}: median first {med('first'):.3f} s, later {med('later'):.3f} s, first / later "
                  f"{statistics.median(row['first'] / row['later'] for row in rows):.2f}, staging peak / saved "
                  f"{med('peak'):.4f}, huge-page faults in the first save {med('thp'):.0f}, peak RSS "
                  f"{med('rss') / 2**30:.2f} GiB")
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
