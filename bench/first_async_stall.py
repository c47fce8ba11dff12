#!/usr/bin/env python3
"""How long the first async save of a new process blocks against its later ones, Stagehand's SPMD
Checkpointer without prepare() beside PyTorch DCP's async_save, in one run.

Each measurement is one fresh process: it touches and frees --warm of memory (see below), builds
the state (--tensors torch CPU tensors, --bytes in all, every page touched), then runs --saves
async saves to new folders, each waited for before the next, and prints how long each call
blocked. Cases, interleaved round by round (the order rotates):
  stagehand        stagehand.Checkpointer: the first call is an async_save (no prepare)
  stagehand_state  stagehand.Checkpointer(..., state=state): the constructor starts reserving the
                   staging in the background and returns; the first async_save comes --gap
                   seconds later (the trainer's steps before its first save: there, minutes)
  stagehand_sync   the first call is a sync save, then the async saves
  dcp              dcp.async_save with a FileSystemWriter of --threads threads (Gloo, world 1)
Reported: medians over --rounds of the first async call's block and of the later ones' median,
and their ratio (target: Stagehand's first <= 1.5x its later).

--warm: on a virtual machine whose host backs guest memory at its first touch (this one:
Firecracker), memory no process has touched since boot costs ~10x more to touch the first time
(measured by hand: 2.5-3.0 s for 1 GiB against 0.13 s), whichever program touches it. Touching and freeing that much
first makes each process find backed memory, as on a real host; --warm 0 measures without.

  python3 bench/compare_peers.py --setup          # once: torch into /work/peers-venv
  PYTHONPATH=build/python /work/peers-venv/bin/python bench/first_async_stall.py \
      [--bytes 1GiB] [--tensors 32] [--rounds 3] [--saves 4] [--warm 4GiB] [--gap 1] [--json FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from peer_common import parse_size as parse_bytes  # noqa: E402

CASES = ("stagehand", "stagehand_state", "stagehand_sync", "dcp")




def warm(total):
    import mmap
    if total <= 0:
        return
    m = mmap.mmap(-1, total)
    for at in range(0, total, 4096):
        m[at] = 1
    m.close()


def worker(case, args, folder):
    warm(parse_bytes(args.warm))
    import torch
    each = parse_bytes(args.bytes) // args.tensors // 4
    state = {f"t{i}": torch.full((each,), float(i), dtype=torch.float32) for i in range(args.tensors)}
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    blocks = []
    if case.startswith("stagehand"):
        import stagehand
        given = {"state": state} if case == "stagehand_state" else {}
        start = time.perf_counter()
        with stagehand.Checkpointer(folder, thread_count=args.threads, **given) as ckpt:
            construct_s = time.perf_counter() - start
            if case == "stagehand_state":
                time.sleep(args.gap)
            if case == "stagehand_sync":
                ckpt.save(1, state)
            for step in range(2, 2 + args.saves):
                start = time.perf_counter()
                pending = ckpt.async_save(step, state)
                blocks.append(time.perf_counter() - start)
                pending.wait()
    else:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
        for step in range(2, 2 + args.saves):
            writer = dcp.FileSystemWriter(os.path.join(folder, f"step{step}"), thread_count=args.threads)
            start = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=writer)
            blocks.append(time.perf_counter() - start)
            (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
            shutil.rmtree(os.path.join(folder, f"step{step}"), ignore_errors=True)
        dist.destroy_process_group()
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"case": case, "blocks": blocks, "construct_s": construct_s if case.startswith("stagehand")
                      else 0.0}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--warm", default="4GiB")
    ap.add_argument("--gap", type=float, default=1.0)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dir", default="/work/first-async")
    ap.add_argument("--json", help="also write the medians and every run to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args, os.path.join(args.dir, args.worker))
        return
    cases = args.cases.split(",")
    runs = {c: [] for c in cases}
    for r in range(args.rounds):
        k = r % len(cases)
        for case in cases[k:] + cases[:k]:
            cmd = [sys.executable, __file__, "--worker", case] + [
                f"--{name}={getattr(args, name)}" for name in ("bytes", "tensors", "threads", "saves", "warm", "gap", "dir")]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                sys.exit(f"first_async_stall: {case} failed:\n{proc.stderr[-3000:]}")
            line = json.loads(proc.stdout.strip().splitlines()[-1])
            print(json.dumps({"round": r, **line}), flush=True)
            runs[case].append(line)
    print(f"\n{args.bytes} in {args.tensors} tensors, {args.threads} threads, warm {args.warm}, "
          f"medians of {args.rounds} rounds")
    print(f"{'case':>16} {'first_s':>9} {'later_s':>9} {'first/later':>12} {'construct_s':>12}")
    medians = {}
    for case in cases:
        first = statistics.median(l["blocks"][0] for l in runs[case])
        later = statistics.median(statistics.median(l["blocks"][1:]) for l in runs[case])
        construct = statistics.median(l["construct_s"] for l in runs[case])
        medians[case] = {"first_s": first, "later_s": later, "ratio": first / later, "construct_s": construct}
        print(f"{case:>16} {first:9.3f} {later:9.3f} {first / later:12.2f} {construct:12.4f}")
    if "dcp" in medians and "stagehand" in medians:
        print(f"stagehand / dcp: first {medians['stagehand']['first_s'] / medians['dcp']['first_s']:.2f}, "
              f"later {medians['stagehand']['later_s'] / medians['dcp']['later_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "bytes": args.bytes,
                       "tensors": args.tensors, "threads": args.threads, "warm": args.warm, "rounds": args.rounds,
                       "medians": medians, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
