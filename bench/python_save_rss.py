#!/usr/bin/env python3
"""How much a sync save from Python adds to the process's peak memory: B bytes of numpy arrays in
N tensors, saved with stagehand.Checkpointer (no copy of host tensors is the claim). Prints the
max RSS before the save (the arrays, touched) and after, and the difference.

    PYTHONPATH=build/python python3 bench/python_save_rss.py [--bytes 1GiB] [--tensors 32] [--dir D]

Exit 1 when the save added more than --limit (default 64 MiB)."""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import peer_common as pc  # noqa: E402

import stagehand  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=pc.parse_size, default=1 << 30)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--limit", type=pc.parse_size, default=64 << 20)
    ap.add_argument("--dir", default=None, help="where to save (default: a fresh temporary folder)")
    args = ap.parse_args()
    per = args.bytes // args.tensors // 4
    # Every page written, so that the arrays are in the RSS before the save.
    state = {"model": {f"t{i:03d}": np.full(per, float(i), np.float32) for i in range(args.tensors)}, "step": 1}
    root = args.dir or tempfile.mkdtemp(prefix="stagehand-rss-")
    try:
        with stagehand.Checkpointer(root, thread_count=args.threads) as ckpt:
            # The actors and their threads start at this first call: their memory is counted too.
            before = pc.max_rss_bytes()
            start = time.perf_counter()
            ckpt.save(1, state)
            seconds = time.perf_counter() - start
            after = pc.max_rss_bytes()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    added = after - before
    print(f"state {args.bytes / 2**20:.0f} MiB in {args.tensors} numpy arrays, {args.threads} threads")
    print(f"max RSS before the save {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB")
    print(f"added by the save: {added / 2**20:.1f} MiB ({added / args.bytes:.3f} of the state), save {seconds:.3f} s")
    print(f"limit {args.limit / 2**20:.0f} MiB: {'ok' if added <= args.limit else 'EXCEEDED'}")
    return 0 if added <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
