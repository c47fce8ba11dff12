#!/usr/bin/env python3
"""The commit and metadata.json at many ranks: for each rank count, one `stagehand-bench save` of a
state of small shards and many tensors (in-process ranks), then `stagehand-bench metadata` on
what it wrote. Prints one JSON line per run, then a table: commit_s (last rank's report to the
tracker written; beside it the coordinator thread's CPU seconds in it, which a busy machine does
not inflate), the same commit timed alone from the same reports (`stagehand-bench commit`, the
median of --commit-repeat), metadata.json's size, and each rank's metadata read on load: the first rank
of a process reads and checks the whole file, every other takes its part (time and heap peak),
and all ranks together; beside it the cost before parts (every rank reading the whole file,
measured on --whole ranks and multiplied out).

  bench/scale_curve.py --bench build/bin/stagehand-bench --out /tmp/stagehand-scale \
      --ranks 8,64,256,1024 --tensors 500 --bytes-per-rank 64K --columns 16
"""
import argparse
import json
import shutil
import statistics
import subprocess

import bench_common


def json_lines(stdout):
    return [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]


def run(args, ranks):
    out = f"{args.out}/ranks{ranks}"
    shutil.rmtree(out, ignore_errors=True)
    state = ["--ranks", str(ranks), "--tensors", str(args.tensors), "--bytes-per-rank", args.bytes_per_rank,
             "--columns", str(args.columns)]
    save = subprocess.run([args.bench, "save", "--out", out, *state, "--thread-count", str(args.thread_count)],
                          capture_output=True, text=True, check=True)
    line = bench_common.save_lines(save.stdout)[0]
    metadata = subprocess.run([args.bench, "metadata", "--out", out, *state, "--whole", str(min(ranks, args.whole))],
                              capture_output=True, text=True, check=True)
    reads = {l["read"]: l for l in json_lines(metadata.stdout)}
    # The commit alone, from the same reports, with nothing else running in the process.
    commit = subprocess.run([args.bench, "commit", "--from", out, "--out", out + "-commit", "--repeat",
                             str(args.commit_repeat)], capture_output=True, text=True, check=True)
    commits = json_lines(commit.stdout)
    if not all(c["same_metadata"] for c in commits):
        raise SystemExit(f"{ranks} ranks: `stagehand-bench commit` wrote another metadata.json than the save")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out + "-commit", ignore_errors=True)
    return {"ranks": ranks, "save_s": line["save_s"], "commit_s": line["commit_s"],
            "commit_cpu_s": line["commit_cpu_s"],
            "commit_alone_s": statistics.median(c["commit_s"] for c in commits),
            "commit_alone_cpu_s": statistics.median(c["commit_cpu_s"] for c in commits),
            "metadata_bytes": line["metadata_bytes"], "save_peak_rss_bytes": line["peak_rss_bytes"],
            "part": reads["part"], "whole": reads["whole"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="the stagehand-bench binary")
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", default="8,64,256,1024", help="comma-separated rank counts")
    p.add_argument("--tensors", type=int, default=500)
    p.add_argument("--bytes-per-rank", default="64K")
    p.add_argument("--columns", type=int, default=16)
    p.add_argument("--thread-count", type=int, default=1)
    p.add_argument("--whole", type=int, default=4, help="ranks measured reading the whole metadata.json each")
    p.add_argument("--commit-repeat", type=int, default=5, help="commits of the same reports, timed alone")
    args = p.parse_args()
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        row = run(args, ranks)
        print(json.dumps(row), flush=True)
        rows.append(row)
    mib = 1 << 20
    print()
    print("| ranks | commit_s (CPU s) | commit alone, median s (CPU s) | metadata.json | first rank: read+check s / heap peak | other ranks: part s (median) / "
          "heap peak | all ranks s | before: every rank whole s / heap peak | before: all ranks s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        part, whole = r["part"], r["whole"]
        print(f"| {r['ranks']} | {r['commit_s']:.3f} ({r['commit_cpu_s']:.3f}) "
              f"| {r['commit_alone_s']:.3f} ({r['commit_alone_cpu_s']:.3f}) | {r['metadata_bytes'] / mib:.1f} MiB "
              f"| {part['first_rank_s']:.3f} / {part['first_rank_peak_bytes'] / mib:.1f} MiB "
              f"| {part['median_rank_s'] * 1e3:.2f} ms / {part['median_rank_peak_bytes'] / 1024:.0f} KiB "
              f"| {part['total_s']:.2f} "
              f"| {whole['median_rank_s']:.3f} / {whole['median_rank_peak_bytes'] / mib:.1f} MiB "
              f"| {whole['total_s']:.1f}{' (x ranks)' if whole['total_extrapolated'] else ''} |")


if __name__ == "__main__":
    main()
