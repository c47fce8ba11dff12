#!/usr/bin/env python3
"""What a write + fsync of a checkpoint's bytes costs by where its disk blocks come from, without
Stagehand: K sets of T files (8 x 128 MiB by default, one writer thread each, os.write, fsync of
each file and of the folder) per process, for each way of treating the set before, the ways'
processes interleaved round by round. Prints each set's seconds, the median of sets 3+ and the
slowest / median of sets 3+.

  delete       the set before is removed after each set (as retention removes a step): the next
               set's blocks are freed ones, reused once the file system has committed the free
  delete_sync  the same, then `sync` (the free committed before the next set)
  delete_fsync the same, then an fsync of the folder that held the set (on ext4 that commits the
               journal's transaction, the free with it)
  keep         nothing removed: every set writes blocks never written in this run
  reuse        the set two before is renamed into place and written over (no O_TRUNC): the same
               blocks, still allocated to the files (what reuse_files does)

    python3 bench/fresh_blocks.py [--dir /work/fresh-blocks] [--sets 12] [--rounds 2]
        [--files 8] [--file-mib 128] [--modes reuse,delete,delete_sync,delete_fsync,keep]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench_common import write_files


def one_process(args):
    """The child: K sets in one mode; prints one line of seconds."""
    base = os.path.join(args.dir, args.child)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    buf = os.urandom(args.file_mib << 20)

    def write_set(folder, reuse_from):
        if reuse_from:
            os.rename(reuse_from, folder)
        else:
            os.makedirs(folder)

        write_files(folder, lambda k: [buf], args.files, truncate=not reuse_from)

    times = []
    for i in range(args.sets):
        reuse = os.path.join(base, "s%d" % (i - 2)) if args.child == "reuse" and i >= 2 else None
        t0 = time.perf_counter()
        write_set(os.path.join(base, "s%d" % i), reuse)
        times.append(time.perf_counter() - t0)
        if args.child.startswith("delete") and i > 0:
            shutil.rmtree(os.path.join(base, "s%d" % (i - 1)))
            if args.child == "delete_sync":
                os.sync()
            elif args.child == "delete_fsync":
                fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    shutil.rmtree(base, ignore_errors=True)
    print(" ".join("%.4f" % t for t in times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/work/fresh-blocks")
    ap.add_argument("--sets", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mib", type=int, default=128)
    ap.add_argument("--modes", default="reuse,delete,delete_sync,keep")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return one_process(args)
    modes = args.modes.split(",")
    for m in modes:
        if m not in ("reuse", "delete", "delete_sync", "delete_fsync", "keep"):
            sys.exit(f"fresh_blocks: no mode '{m}'")
    os.makedirs(args.dir, exist_ok=True)
    print(f"{args.files} files x {args.file_mib} MiB per set, {args.sets} sets per process, {args.rounds} rounds, "
          f"in {args.dir}; seconds per set")
    results = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % len(modes):] + modes[:r % len(modes)]:
            cmd = [sys.executable, __file__, "--child", m, "--dir", args.dir, "--sets", str(args.sets),
                   "--files", str(args.files), "--file-mib", str(args.file_mib)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
            times = [float(t) for t in out]
            later = times[2:]
            results[m].append(later)
            print(f"{m:<12} {' '.join('%.3f' % t for t in times)}   median 3+ {statistics.median(later):.3f}, "
                  f"slowest / median {max(later) / statistics.median(later):.2f}", flush=True)
            subprocess.run(["sync"], check=False)
    print("\nmode          median of sets 3+   slowest / median (all rounds)   within a process (median, largest)")
    base = statistics.median(sum(results["delete"], [])) if "delete" in results else None
    for m in modes:
        pooled = sum(results[m], [])
        med = statistics.median(pooled)
        within = [max(v) / statistics.median(v) for v in results[m]]
        rel = f" ({med / base:.2f} of delete)" if base else ""
        print(f"{m:<14}{med:.3f}{rel:<18} {max(pooled) / med:>5.2f}                          "
              f"{statistics.median(within):.2f}, {max(within):.2f}")


if __name__ == "__main__":
    main()
