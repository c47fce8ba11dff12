"""One rank of an SPMD job for test_checkpointer.py, started by scripts/launch-local.sh.

save ROOT [--bad-rank R]: 4 ranks (tensor 2 x data 2) save step 5: "w" (8 x 6) split by rows over
the tensor ranks and replicated over the data ranks; "m" (16) split over all four; "step".
load ROOT: any number of ranks (1 or 2 here) load it split by columns and check every value."""

import os
import sys

import numpy as np

import stagehand


def w_global():
    return np.arange(48, dtype=np.float32).reshape(8, 6) * 0.5


def m_global():
    return np.arange(16, dtype=np.float64) - 3.0


def main():
    verb, root = sys.argv[1], sys.argv[2]
    bad_rank = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--bad-rank" else -1
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    with stagehand.Checkpointer(root, timeout=30, join_timeout=30) as ckpt:
        if verb == "save":
            tp, dp = rank % 2, rank // 2
            rows = np.ascontiguousarray(w_global()[tp * 4:(tp + 1) * 4])
            m = m_global()[rank * 4:(rank + 1) * 4].copy()
            if rank == bad_rank:
                m = np.zeros(5, np.float64)  # another shape than the plan of the others
            state = {"w": stagehand.Shard(rows, [8, 6], [tp * 4, 0], replica_id=dp),
                     "m": stagehand.Shard(m, [16], [rank * 4 if rank != bad_rank else 11]),
                     "step": 5}
            try:
                ckpt.save(5, state)
            except stagehand.Error as e:
                print(f"rank {rank}: save failed: {e}", flush=True)
                sys.exit(1)
            print(f"rank {rank}: saved", flush=True)
        else:
            cols = 6 // world
            w = np.zeros((8, cols), np.float32)
            n = 16 // world
            m = np.zeros(n, np.float64)
            state = {"w": stagehand.Shard(w, [8, 6], [0, rank * cols]),
                     "m": stagehand.Shard(m, [16], [rank * n]), "step": None}
            ckpt.load(state)
            assert np.array_equal(w, w_global()[:, rank * cols:(rank + 1) * cols]), w
            assert np.array_equal(m, m_global()[rank * n:(rank + 1) * n]), m
            assert state["step"] == 5, state["step"]
            print(f"rank {rank}: loaded ok", flush=True)


if __name__ == "__main__":
    main()
