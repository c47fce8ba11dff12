#!/usr/bin/env python3
"""stagehand.Checkpointer against PyTorch DCP in one Python process, on the same torch CPU tensors:
sync save (dcp.save), the blocking part of an async save (dcp.async_save), and a cold load
(page cache dropped first; dcp.load in place), interleaved op by op and round by round, so both
see the same machine; each op starts after an untimed `sync`, so that none pays for the writes
the one before left. Prints each op's seconds by position (round) in the process, the ratio
stagehand / DCP at each position, and each op's peak resident memory above its start (sampled
every 2 ms from /proc/self/statm). A raw write of the same bytes (one file per thread, os.write
from the tensors' memory, fsync of each file and the folder) runs interleaved with the sync saves,
as the physical limit both are measured against. For each op it also prints the process's CPU
seconds per GiB (time.process_time over the op, an async save's background writing included).

    PYTHONPATH=build/python /work/peers-venv/bin/python bench/compare_python.py \\
        [--bytes 1GiB] [--tensors 32] [--threads 8] [--rounds 5] [--dir /work/cmp-py] [--staging-buckets N]
        [--no-prepare] [--max-to-keep 2] [--processes 3]

With --processes N the whole run repeats in N fresh processes, one after the other, and each
position's figure is the median over the processes (a ratio is of those medians): one process
gives one sample per position, as noisy as the disk. Which system goes first alternates round by
round and, at each position, process by process (use an even N for both orders equally).

Needs torch (DCP) and the stagehand package (PYTHONPATH=<build>/python or pip install .).
Targets (issue 28): sync save <= 0.8x DCP, async blocking part <= 0.3x, load <= 1.0x, at every
position."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import peer_common as pc  # noqa: E402
from bench_common import write_files  # noqa: E402

import stagehand  # noqa: E402


class PeakRss:
    """The highest RSS seen while the block runs, above its value at the start."""

    def __enter__(self):
        self.start = pc.rss_bytes()
        self.peak = self.start
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, pc.rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, pc.rss_bytes())
        self.added = self.peak - self.start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/work/cmp-py")
    ap.add_argument("--staging-buckets", type=int, default=0,
                    help="stagehand's async saves stage this many buckets before returning and the "
                         "rest from the live state (0: all); the wait until every bucket is staged "
                         "(when the tensors may change again) is printed beside the blocking part")
    ap.add_argument("--max-to-keep", type=int, default=0,
                    help="stagehand's Checkpointer keeps this many steps itself (max_to_keep, its later saves "
                         "writing over the removed steps' files); 0: the script removes them, as for DCP")
    ap.add_argument("--no-prepare", action="store_true",
                    help="leave out stagehand's Checkpointer.prepare at the start (then its first async save "
                         "allocates and first-touches its staging inside its blocking part)")
    ap.add_argument("--processes", type=int, default=1,
                    help="repeat the run in this many fresh processes; each position's figure is the "
                         "median over them")
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    ap.add_argument("--child-parity", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_json:
        with open(args.child_json, "w") as f:
            json.dump(measure(args), f)
        return 0
    if args.processes <= 1:
        results = [measure(args)]
    else:
        results = []
        for k in range(args.processes):
            out = os.path.join(os.path.dirname(os.path.abspath(args.dir)), ".compare_python_%d.json" % os.getpid())
            child = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child-json", out,
                                    "--child-parity", str(k % 2)],
                                   capture_output=True, text=True)
            if child.returncode != 0:
                sys.stderr.write(child.stdout[-4000:] + child.stderr[-4000:])
                sys.exit(f"compare_python: process {k + 1} of {args.processes} exited {child.returncode}")
            with open(out) as f:
                results.append(json.load(f))
            os.remove(out)
            subprocess.run(["sync"], check=False)
            print(f"process {k + 1} of {args.processes} done", flush=True)
    return report(args, results)


def measure(args):
    """One process's run: every op at every position. Returns its figures as plain lists."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    total = pc.parse_size(args.bytes)
    state = pc.make_torch_state(total, args.tensors)
    sd = {name: tensor for name, (tensor, _, _) in state.items()}
    target = {name: torch.empty_like(t) for name, t in sd.items()}
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    sh_root = os.path.join(args.dir, "stagehand")
    writer = lambda path: FileSystemWriter(path, thread_count=args.threads, sync_files=True)
    ckpt = stagehand.Checkpointer(sh_root, thread_count=args.threads, load_thread_count=args.threads,
                                  staging_buckets=args.staging_buckets, max_to_keep=args.max_to_keep)
    staged_waits = []  # stagehand's async saves: seconds from the return until every bucket is staged
    prepare_s = None
    if not args.no_prepare:
        # What a trainer does once at its start, before its first step: reserve the staging
        # memory async saves copy into (DCP has no counterpart; its first async_save allocates).
        t0 = time.perf_counter()
        ckpt.prepare(sd)
        prepare_s = time.perf_counter() - t0
    times = {}   # (system, op) -> [seconds by position]
    cpu = {}     # (system, op) -> [process CPU seconds by position]
    peaks = {}   # (system, op) -> [bytes by position]
    step = [0]
    dcp_dirs = []

    def record(system, op, seconds, added):
        times.setdefault((system, op), []).append(seconds)
        peaks.setdefault((system, op), []).append(added)

    def dcp_path():
        path = os.path.join(args.dir, "dcp_%d" % len(dcp_dirs))
        dcp_dirs.append(path)
        if len(dcp_dirs) > 2:
            shutil.rmtree(dcp_dirs[-3], ignore_errors=True)
        return path

    def sh_step():
        step[0] += 1
        if not args.max_to_keep:
            old = os.path.join(sh_root, "global_step_%d" % (step[0] - 2))
            shutil.rmtree(old, ignore_errors=True)
        return step[0]

    raw_dir = os.path.join(args.dir, "raw")
    views = [t.view(torch.uint8).numpy() for t in sd.values()]

    def quiesce():
        # Every op starts on a quiet device: what the op before left (the other system's writes
        # or the blocks its removals freed, discarded at the file system's next commit) is
        # written first, untimed, so that no op pays for another's.
        os.sync()

    def raw_write():
        os.makedirs(raw_dir)

        write_files(raw_dir, lambda k: views[k::args.threads], args.threads)

    def run(system, op):
        cpu0 = time.process_time()
        run_op(system, op)
        # The process's CPU seconds over the whole op, its background writing included (an async
        # save's until it is durable): what the save takes from the cores that training uses.
        cpu.setdefault((system, op), []).append(time.process_time() - cpu0)

    def run_op(system, op):
        if system == "raw":
            shutil.rmtree(raw_dir, ignore_errors=True)
            quiesce()
            with PeakRss() as m:
                t0 = time.perf_counter()
                raw_write()
                t1 = time.perf_counter()
        elif system == "dcp":
            if op == "save":
                path = dcp_path()
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    dcp.save(sd, storage_writer=writer(path))
                    t1 = time.perf_counter()
            elif op == "async":
                path = dcp_path()
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    fut = dcp.async_save(sd, storage_writer=writer(path))
                    t1 = time.perf_counter()
                    (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
            else:
                path = dcp_dirs[-1]
                pc.drop_cache(path)
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    dcp.load(target, storage_reader=FileSystemReader(path))
                    t1 = time.perf_counter()
        else:
            if op == "save":
                k = sh_step()
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    ckpt.save(k, sd)
                    t1 = time.perf_counter()
            elif op == "async":
                k = sh_step()
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    pending = ckpt.async_save(k, sd)
                    t1 = time.perf_counter()
                    # What a trainer that changes the tensors at once would wait (0 unless
                    # --staging-buckets): the fence.
                    staged_waits.append(pending.wait_staged())
                    pending.wait()
            else:
                pc.drop_cache(sh_root)
                quiesce()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    ckpt.load(target)
                    t1 = time.perf_counter()
        record(system, op, t1 - t0, m.added)

    ops = ["save", "async", "load"]
    for r in range(args.rounds):
        for op in ops:
            # Alternate which system goes first, round by round.
            # Which goes first at a position also alternates process by process (--processes), so
            # that each position is measured in both orders: going first or second in a round
            # is worth up to 0.2 s to a cold load on this machine, for either system.
            flip = (r + args.child_parity) % 2
            order = ("dcp", "stagehand") if flip == 0 else ("stagehand", "dcp")
            if op == "save":
                order = ("raw",) + order if flip == 0 else order + ("raw",)
            for system in order:
                run(system, op)
    ckpt.close()
    # Bit for bit (the random bytes hold NaNs, which torch.equal never finds equal).
    check = all(torch.equal(target[name].view(torch.uint8), sd[name].view(torch.uint8)) for name in sd)
    shutil.rmtree(args.dir, ignore_errors=True)
    key = lambda k: k[0] + "|" + k[1]
    return {"torch": torch.__version__, "total": total, "check": check, "prepare_s": prepare_s,
            "staged_waits": staged_waits, "times": {key(k): v for k, v in times.items()},
            "cpu": {key(k): v for k, v in cpu.items()}, "peaks": {key(k): v for k, v in peaks.items()}}


def report(args, results):
    """Prints the figures of one or more processes' runs: by position, the median over processes."""
    med = statistics.median
    n = len(results)
    total = results[0]["total"]

    def by_position(what, system, op):
        runs = [r[what][system + "|" + op] for r in results]
        return [med(run[p] for run in runs) for p in range(len(runs[0]))]

    def per_process_ratios(op):
        # Each process's own stagehand / DCP at each position: their spread beside the ratio of medians.
        return [[b / a for a, b in zip(r["times"]["dcp|" + op], r["times"]["stagehand|" + op])] for r in results]

    times = {(sys_, op): by_position("times", sys_, op) for sys_ in ("dcp", "stagehand", "raw")
             for op in ("save", "async", "load") if sys_ + "|" + op in results[0]["times"]}
    ops = ["save", "async", "load"]
    check = all(r["check"] for r in results)
    print(f"torch {results[0]['torch']}; {total / 2**20:.0f} MiB in {args.tensors} CPU tensors; "
          f"{args.threads} threads; stagehand staging_buckets {args.staging_buckets}, max_to_keep {args.max_to_keep}; "
          f"{args.rounds} rounds in each of {n} process(es)"
          + ("; figures by position are medians over the processes" if n > 1 else "")
          + f"; last load equal to the state: {check}")
    prepares = [r["prepare_s"] for r in results]
    print("stagehand: " + (f"Checkpointer.prepare at the start, before any op, not timed in them: "
                           + ", ".join(f"{x:.3f}" for x in prepares) + " s "
                           "(reserves and touches the staging of async saves)" if prepares[0] is not None
                           else "no Checkpointer.prepare (its first async save allocates its staging)"))
    targets = {"save": 0.8, "async": 0.3, "load": 1.0}
    names = {"save": "sync save", "async": "async blocking part", "load": "cold load"}
    for op in ops:
        d, s = times[("dcp", op)], times[("stagehand", op)]
        ratios = [b / a for a, b in zip(d, s)]
        print(f"\n{names[op]} (target <= {targets[op]}x DCP at every position)")
        print("  position " + " ".join(f"{p + 1:>7}" for p in range(len(d))) + "   median")
        print("  dcp s    " + " ".join(f"{x:7.3f}" for x in d) + f"  {statistics.median(d):7.3f}")
        print("  stagehand" + " ".join(f"{x:7.3f}" for x in s) + f"  {statistics.median(s):7.3f}")
        print("  ratio    " + " ".join(f"{x:7.2f}" for x in ratios) + f"  {statistics.median(ratios):7.2f}"
              + ("   ok" if max(ratios) <= targets[op] else "   ABOVE TARGET at some position"))
        if n > 1:
            each = per_process_ratios(op)
            print("  each process's ratio, lowest-highest "
                  + " ".join(f"{min(x[p] for x in each):.2f}-{max(x[p] for x in each):.2f}" for p in range(len(d))))
        gib = total / 2**30
        per_gib = {name: statistics.median(x for r in results for x in r["cpu"][name + "|" + op]) / gib
                   for name in ("dcp", "stagehand", "raw") if name + "|" + op in results[0]["cpu"]}
        # Median over positions of the whole process's user + system seconds over the op (an
        # async save's until it is durable), per GiB.
        print("  CPU s per GiB: " + ", ".join(f"{name} {x:.2f}" for name, x in per_gib.items()))
        if op == "save":
            w = times[("raw", op)]
            print("  raw write" + " ".join(f"{x:7.3f}" for x in w) + f"  {statistics.median(w):7.3f}")
            print("  stagehand / raw " + " ".join(f"{b / a:5.2f}" for a, b in zip(w, s))
                  + f"   median {statistics.median([b / a for a, b in zip(w, s)]):.2f}")
            print("  dcp / raw       " + " ".join(f"{b / a:5.2f}" for a, b in zip(w, d))
                  + f"   median {statistics.median([b / a for a, b in zip(w, d)]):.2f}")
        if op == "async" and args.staging_buckets:
            staged_waits = [med(r["staged_waits"][p] for r in results) for p in range(len(s))]
            print(f"  stagehand staged {args.staging_buckets} of {args.threads} buckets before returning; then "
                  "waited until all were staged: " + " ".join(f"{x:5.3f}" for x in staged_waits))
            both = [b + w for b, w in zip(s, staged_waits)]
            print("  blocking part + that wait, ratio to DCP's blocking part "
                  + " ".join(f"{b / a:5.2f}" for a, b in zip(d, both)))
        pd = [x for r in results for x in r["peaks"]["dcp|" + op]]
        ps = [x for r in results for x in r["peaks"]["stagehand|" + op]]
        print(f"  peak RSS above start, MiB: dcp {max(pd) / 2**20:.0f}, stagehand {max(ps) / 2**20:.0f}")
    return 0 if check else 1


if __name__ == "__main__":
    sys.exit(main())
