"""One rank of PyTorch DCP on the synthetic state (bench/compare_peers.py starts it, one process per rank).

  --mode save   k x dcp.save(FileSystemWriter(thread_count=T, sync_files=True)); prints save_s per position
  --mode async  k x dcp.async_save: block_s (until the call returns) and save_s (until the future resolves)
  --mode load   one untimed save, then k cold loads (files fsync'd and dropped from the page cache with
                POSIX_FADV_DONTNEED first) and k warm loads, in place into the state's tensors

A gloo process group from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, world size 1 too. With more than
one rank each rank holds its row block of every sharded tensor as a DTensor (Shard(0)) and the whole of
every replicated tensor (DCP writes each replicated tensor once)."""
import argparse
import os

import peer_common as pc


def build_state_dict(dist, state):
    rank, world = pc.rank_world()
    if world == 1:
        return {name: t for name, (t, _, _) in state.items()}
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:
        from torch.distributed._tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world,))
    sd = {}
    for name, (t, rows, replicated) in state.items():
        if replicated:
            sd[name] = t
        else:
            sd[name] = DTensor.from_local(t, mesh, [Shard(0)], run_check=False, shape=(rows * world, t.shape[1]),
                                          stride=(t.shape[1], 1))
    return sd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["save", "async", "load"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--bytes-per-rank", required=True)
    p.add_argument("--tensors", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--saves", type=int, required=True)
    args = p.parse_args()
    import torch  # noqa: F401
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    dist = pc.init_gloo()
    rank, world = pc.rank_world()
    state = pc.make_torch_state(pc.parse_size(args.bytes_per_rank), args.tensors)
    sd = build_state_dict(dist, state)
    local_bytes = sum(t.numel() * t.element_size() for t, _, _ in state.values())
    dist.barrier()
    pc.emit(kind="info", rank=rank, world=world, state_bytes=local_bytes, pre_rss=pc.rss_bytes(),
            pre_max_rss=pc.max_rss_bytes(), torch=torch.__version__)
    writer = lambda path: FileSystemWriter(path, thread_count=args.threads, sync_files=True)
    if args.mode in ("save", "async"):
        previous = None
        for k in range(1, args.saves + 1):
            path = os.path.join(args.dir, "step_%d" % k)
            dist.barrier()
            t0 = pc.now()
            if args.mode == "save":
                dcp.save(sd, storage_writer=writer(path))
                t1 = t2 = pc.now()
            else:
                fut = dcp.async_save(sd, storage_writer=writer(path))
                t1 = pc.now()
                if hasattr(fut, "upload_completion"):  # AsyncSaveResponse
                    fut.upload_completion.result()
                else:
                    fut.result()
                t2 = pc.now()
            pc.emit(kind="save", rank=rank, pos=k, save_s=t2 - t0, block_s=t1 - t0, rss=pc.rss_bytes())
            dist.barrier()
            if rank == 0 and previous:
                pc.remove_tree(previous)  # as stagehand-bench keeps only the latest step
            previous = path
    else:
        path = os.path.join(args.dir, "step_load")
        dcp.save(sd, storage_writer=writer(path))
        dist.barrier()
        for cold, label in ((True, "cold"), (False, "warm")):
            for k in range(1, args.saves + 1):
                if cold:
                    pc.drop_cache(path)
                dist.barrier()
                t0 = pc.now()
                dcp.load(sd, storage_reader=FileSystemReader(path))
                t1 = pc.now()
                pc.emit(kind="load", rank=rank, pos=k, cold=cold, load_s=t1 - t0, rss=pc.rss_bytes())
                dist.barrier()
    pc.emit(kind="done", rank=rank, max_rss=pc.max_rss_bytes())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
