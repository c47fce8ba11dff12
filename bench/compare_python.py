#!/usr/bin/env python3
"""stagehand.Checkpointer against PyTorch DCP in one Python process, on the same torch CPU tensors:
sync save (dcp.save), the blocking part of an async save (dcp.async_save), and a cold load
(page cache dropped first; dcp.load in place), interleaved op by op and round by round, so both
see the same machine. Prints each op's seconds by position (round) in the process, the ratio
stagehand / DCP at each position, and each op's peak resident memory above its start (sampled
every 2 ms from /proc/self/statm). A raw write of the same bytes (one file per thread, os.write
from the tensors' memory, fsync of each file and the folder) runs interleaved with the sync saves,
as the physical limit both are measured against. For each op it also prints the process's CPU
seconds per GiB (time.process_time over the op, an async save's background writing included).

    PYTHONPATH=build/python /work/peers-venv/bin/python bench/compare_python.py \\
        [--bytes 1GiB] [--tensors 32] [--threads 8] [--rounds 5] [--dir /work/cmp-py] [--staging-buckets N]
        [--no-prepare] [--max-to-keep 2]

Needs torch (DCP) and the stagehand package (PYTHONPATH=<build>/python or pip install .).
Targets (issue 28): sync save <= 0.8x DCP, async blocking part <= 0.3x, load <= 1.0x, at every
position."""

import argparse
import os
import shutil
import statistics
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
    args = ap.parse_args()
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

    def raw_write():
        shutil.rmtree(raw_dir, ignore_errors=True)
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
            with PeakRss() as m:
                t0 = time.perf_counter()
                raw_write()
                t1 = time.perf_counter()
        elif system == "dcp":
            if op == "save":
                path = dcp_path()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    dcp.save(sd, storage_writer=writer(path))
                    t1 = time.perf_counter()
            elif op == "async":
                path = dcp_path()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    fut = dcp.async_save(sd, storage_writer=writer(path))
                    t1 = time.perf_counter()
                    (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
            else:
                path = dcp_dirs[-1]
                pc.drop_cache(path)
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    dcp.load(target, storage_reader=FileSystemReader(path))
                    t1 = time.perf_counter()
        else:
            if op == "save":
                k = sh_step()
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    ckpt.save(k, sd)
                    t1 = time.perf_counter()
            elif op == "async":
                k = sh_step()
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
                with PeakRss() as m:
                    t0 = time.perf_counter()
                    ckpt.load(target)
                    t1 = time.perf_counter()
        record(system, op, t1 - t0, m.added)

    ops = ["save", "async", "load"]
    for r in range(args.rounds):
        for op in ops:
            # Alternate which system goes first, round by round.
            order = ("dcp", "stagehand") if r % 2 == 0 else ("stagehand", "dcp")
            if op == "save":
                order = ("raw",) + order if r % 2 == 0 else order + ("raw",)
            for system in order:
                run(system, op)
    ckpt.close()
    # Bit for bit (the random bytes hold NaNs, which torch.equal never finds equal).
    check = {name: torch.equal(target[name].view(torch.uint8), sd[name].view(torch.uint8)) for name in sd}
    print(f"torch {torch.__version__}; {total / 2**20:.0f} MiB in {args.tensors} CPU tensors; "
          f"{args.threads} threads; stagehand staging_buckets {args.staging_buckets}, max_to_keep {args.max_to_keep}; {args.rounds} rounds; "
          f"last load equal to the state: {all(check.values())}")
    print("stagehand: " + (f"Checkpointer.prepare at the start, before any op, not timed in them: {prepare_s:.3f} s "
                           "(reserves and touches the staging of async saves)" if prepare_s is not None
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
        gib = total / 2**30
        per_gib = {name: statistics.median(cpu[(name, op)]) / gib
                   for name in ("dcp", "stagehand", "raw") if (name, op) in cpu}
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
            print(f"  stagehand staged {args.staging_buckets} of {args.threads} buckets before returning; then "
                  "waited until all were staged: " + " ".join(f"{x:5.3f}" for x in staged_waits))
            both = [b + w for b, w in zip(s, staged_waits)]
            print("  blocking part + that wait, ratio to DCP's blocking part "
                  + " ".join(f"{b / a:5.2f}" for a, b in zip(d, both)))
        pd, ps = peaks[("dcp", op)], peaks[("stagehand", op)]
        print(f"  peak RSS above start, MiB: dcp {max(pd) / 2**20:.0f}, stagehand {max(ps) / 2**20:.0f}")
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if all(check.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
