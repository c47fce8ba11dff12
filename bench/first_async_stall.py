#!/usr/bin/env python3
"""How long the first async saves of a Checkpointer block, when its first call is a sync save and
when it is an async one (the first async call reserves and first-touches the staging memory).

    PYTHONPATH=build/python python3 bench/first_async_stall.py [--dir /work/fa-ck]"""

import argparse
import shutil
import time

import numpy as np

import stagehand


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/work/fa-ck")
    args = ap.parse_args()
    state = {f"t{i}": np.full(8 << 20, i, np.float32) for i in range(32)}  # 1 GiB
    for first in ("sync", "async"):
        shutil.rmtree(args.dir, ignore_errors=True)
        with stagehand.Checkpointer(args.dir, thread_count=8) as ckpt:
            if first == "sync":
                ckpt.save(1, state)
            stalls = []
            for step in range(2, 5):
                start = time.perf_counter()
                pending = ckpt.async_save(step, state)
                stalls.append(time.perf_counter() - start)
                pending.wait()
        print(f"first call {first}: async saves 1-3 blocked " + " / ".join(f"{s:.3f}" for s in stalls) + " s")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
