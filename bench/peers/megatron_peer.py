"""One rank of megatron-core `dist_checkpointing.save` with the `torch_dist` backend on the synthetic state
(bench/compare_peers.py starts it, one process per rank): k saves, save_s per position.

The save strategy is Megatron-LM's: `get_default_save_sharded_strategy('torch_dist')` (thread_count set to
T, Megatron's default is 2) wrapped in `FullyParallelSaveStrategyWrapper` over the world group. Each rank
holds its row block of every sharded tensor (`ShardedTensor.from_rank_offsets(key, t, (0, rank, world))`)
and a replica of every replicated one (replica_id = rank; the wrapper spreads their writing).

megatron-core is written for GPUs: on a CPU-only host `torch.cuda.synchronize` and
`torch.cuda.current_device` are shimmed (a no-op, and "cpu") in this process only."""
import argparse
import os

import peer_common as pc


def shim_cuda(torch):
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"
        return True
    return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--bytes-per-rank", required=True)
    p.add_argument("--tensors", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--saves", type=int, required=True)
    p.add_argument("--no-fully-parallel", action="store_true")
    args = p.parse_args()
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    shimmed = shim_cuda(torch)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    import importlib.metadata
    dist = pc.init_gloo()
    rank, world = pc.rank_world()
    state = pc.make_torch_state(pc.parse_size(args.bytes_per_rank), args.tensors)
    local_bytes = sum(t.numel() * t.element_size() for t, _, _ in state.values())

    def sharded_state_dict():
        sd = {}
        for name, (t, rows, replicated) in state.items():
            if replicated:
                sd[name] = ShardedTensor.from_rank_offsets(name, t, replica_id=rank)
            else:
                sd[name] = ShardedTensor.from_rank_offsets(name, t, (0, rank, world))
        return sd

    strategy = get_default_save_sharded_strategy("torch_dist")
    strategy.thread_count = args.threads
    if not args.no_fully_parallel:
        strategy = FullyParallelSaveStrategyWrapper(strategy, dist.group.WORLD)
    dist.barrier()
    pc.emit(kind="info", rank=rank, world=world, state_bytes=local_bytes, pre_rss=pc.rss_bytes(),
            pre_max_rss=pc.max_rss_bytes(), torch=torch.__version__, cuda_shimmed=shimmed,
            megatron_core=importlib.metadata.version("megatron-core"), fully_parallel=not args.no_fully_parallel)
    previous = None
    for k in range(1, args.saves + 1):
        path = os.path.join(args.dir, "step_%d" % k)
        if rank == 0:
            os.makedirs(path, exist_ok=True)  # dist_checkpointing.save wants an existing, empty folder
        dist.barrier()
        t0 = pc.now()
        dist_checkpointing.save(sharded_state_dict(), path, sharded_strategy=strategy)
        t1 = pc.now()
        pc.emit(kind="save", rank=rank, pos=k, save_s=t1 - t0, rss=pc.rss_bytes())
        dist.barrier()
        if rank == 0 and previous:
            pc.remove_tree(previous)
        previous = path
    pc.emit(kind="done", rank=rank, max_rss=pc.max_rss_bytes())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
