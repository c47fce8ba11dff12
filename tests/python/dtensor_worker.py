"""One rank of a torch job for test_checkpointer.py (started by scripts/launch-local.sh): torch's
gloo group over the launch variables and a device mesh of every rank, on CPU.

save ROOT: a 2-D mesh (2 x 2 over 4 ranks) saves step 3: "w" (8 x 6) as a DTensor sharded by rows
over mesh dim 0 and replicated over dim 1, "m" (16) sharded over both dims, "b" (6) replicated.
load ROOT: a 1-D mesh of any size loads it with "w" sharded by columns, "m" replicated and "b"
sharded, and checks every value against the global tensors."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import stagehand


def globals_():
    return {"w": torch.arange(48, dtype=torch.float32).reshape(8, 6) * 0.5,
            "m": torch.arange(16, dtype=torch.float64) - 3.0,
            "b": torch.arange(6, dtype=torch.bfloat16)}


def main():
    verb, root = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    full = globals_()
    if verb == "save":
        mesh = init_device_mesh("cpu", (2, world // 2))
        state = {"w": distribute_tensor(full["w"], mesh, [Shard(0), Replicate()]),
                 "m": distribute_tensor(full["m"], mesh, [Shard(0), Shard(0)]),
                 "b": distribute_tensor(full["b"], mesh, [Replicate(), Replicate()]),
                 "step": 3}
    else:
        mesh = init_device_mesh("cpu", (world,))
        state = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)]),
                 "m": distribute_tensor(torch.zeros(16, dtype=torch.float64), mesh, [Replicate()]),
                 "b": distribute_tensor(torch.zeros(6, dtype=torch.bfloat16), mesh, [Shard(0)]),
                 "step": 0}
    with stagehand.Checkpointer(root, timeout=30, join_timeout=30) as ckpt:
        if verb == "save":
            ckpt.save(3, state)
            print("saved", flush=True)
        else:
            ckpt.load(state)
            for name, tensor in full.items():
                if not torch.equal(state[name].full_tensor(), tensor):
                    sys.exit(f"rank {dist.get_rank()}: '{name}' differs")
            assert state["step"] == 3
            print("loaded ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
