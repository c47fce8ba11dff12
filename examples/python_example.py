#!/usr/bin/env python3
"""The Python quick start of the README, run by the test suite in 4 processes:

    scripts/launch-local.sh 4 python3 examples/python_example.py ROOT

Each rank holds columns 16*rank .. 16*rank+15 of "model.w" (64 x 64 over 4 ranks) and a scheduler
object; it saves step 1, async-saves step 2 (changing its weights right after the call), then
loads the latest step back and checks it holds step 2's values."""

import sys

import numpy as np

import stagehand

root = sys.argv[1]
with stagehand.Checkpointer(root) as ckpt:  # rank and world from RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = ckpt.rank, ckpt.world_size
    w = np.full((64, 16), float(rank), np.float32)
    # [python]
    state = {"model": {"w": stagehand.Shard(w, [64, 16 * world], [0, 16 * rank])},
             "scheduler": {"step": 1}}          # small objects: anything JSON can hold
    ckpt.save(1, state)                         # collective: committed on every rank on return
    pending = ckpt.async_save(2, state)         # returns once this rank's bytes are copied
    w[0, 0] = -1.0                              # safe: step 2 holds the old value
    pending.wait()                              # optional: the next call waits anyway
    ckpt.load(state)                            # the step the tracker names, in any layout
    # [python]
    assert np.all(w == float(rank)), w
    assert state["scheduler"] == {"step": 1}
print(f"rank {rank} of {world}: saved steps 1 and 2 and loaded step 2 back")
