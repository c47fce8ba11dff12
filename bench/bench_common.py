"""What the bench/compare_*.py scripts share: the synthetic-state options of `stagehand-bench save`,
its command line, and its JSON output lines; a raw parallel write of files, as a baseline."""
import argparse
import json
import os
import subprocess
import sys
import threading


def parser(doc, bytes_per_rank, tensors, thread_count, rounds, repeat, repeat_help=None):
    """An argument parser with --bench, --out and the synthetic state's options."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="the stagehand-bench binary")
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes-per-rank", default=bytes_per_rank)
    p.add_argument("--tensors", type=int, default=tensors)
    p.add_argument("--thread-count", type=int, default=thread_count)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    return p


def save_command(args, out, repeat, *flags):
    """`stagehand-bench save` on the state `args` describes, into `out`."""
    return [args.bench, "save", "--out", out, "--ranks", str(args.ranks), "--bytes-per-rank", args.bytes_per_rank,
            "--tensors", str(args.tensors), "--thread-count", str(args.thread_count), "--repeat", str(repeat),
            *flags]


def save_lines(stdout):
    """The per-save JSON lines of stagehand-bench's output (not its summary or baselines)."""
    return [json.loads(l) for l in stdout.splitlines()
            if l.startswith("{") and "summary" not in l and '"baseline"' not in l]


def baseline_lines(stdout):
    """The raw-write lines of `stagehand-bench save --baseline[-only]`."""
    return [json.loads(l) for l in stdout.splitlines() if l.startswith("{") and '"baseline"' in l]


def run_bench(cmd, who, timeout=1800):
    """Runs a stagehand-bench command line and returns its stdout; exits naming `who` (the
    script), the command and the end of its stderr when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"{who}: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def rotated(items, round_index):
    """`items` in the order of round `round_index`: started one further each round, so that none
    always runs first or last."""
    k = round_index % len(items)
    return items[k:] + items[:k]


def write_files(folder, buffers_of, files, truncate=True):
    """The raw write a save is measured against: file k of `files` (f0, f1, ... in `folder`) gets
    the buffers `buffers_of(k)` with os.write, from a thread of its own, then fsync; then the
    folder's fsync. Without `truncate` an existing file is written over in place."""
    def write(k):
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        fd = os.open(os.path.join(folder, "f%d" % k), flags, 0o644)
        for buf in buffers_of(k):
            view = memoryview(buf)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(files)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
