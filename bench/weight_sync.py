#!/usr/bin/env python3
"""Weight sync on one host: Stagehand's shared-memory and TCP channels against their raw transports
and against rank 0 gathering the state and broadcasting it (torch.distributed, gloo), in one run,
interleaved.

The model is `--bytes` of int32 (one matrix, every value exact: each receiver is checked after each transfer) split by rows over 2 trainer ranks; each of N
receivers (N in `--receivers`) wants all of it (inference tensor 1, N replicas). For each N one
set of 2 + N processes is started (one gloo world, used for barriers and the baseline) and runs
`--rounds` rounds after one warm-up round, the methods' order rotating each round:
  stagehand   each trainer rank pushes its half through its ring of 2 buckets of --bucket bytes;
              every receiver copies straight into its own tensor.
  raw         the raw transport of shared memory: each trainer rank memcpy's its half into a
              shared buffer of the whole model, then every receiver memcpy's the whole out (two
              copies, no pipelining, unbounded memory: the model's size in shared memory).
  raw_read    the floor: only the receivers' memcpy out of shared memory already holding the model.
  gather_bcast rank 1 sends its half to rank 0 (gather), rank 0 broadcasts the whole to the
              receivers (dist.broadcast over gloo): the common baseline.
  stagehand_tcp the TCP channel (tcp://127.0.0.1:PORT): each trainer rank streams its half to each
              receiver straight from its tensor; every receiver reads straight into its own.
  raw_tcp     the raw TCP transport between the same processes: each trainer rank sendall()s its
              half on a plain socket to each receiver (a thread per receiver), which recv_into()s
              it (a thread per trainer rank); no framing, no versions.
Each time is from a barrier of all processes to the next; reported: medians of GB/s delivered
(N x model bytes / time), the ratios stagehand/raw, stagehand/raw_read and
stagehand/gather_bcast, stagehand_tcp/raw_tcp and stagehand_tcp/gather_bcast, and the trainer
ranks' peak extra memory during a push (anonymous RSS above the one before it, plus the segment:
header and ring) against 2 buckets, for each channel.

  python3 bench/compare_peers.py --setup      # once: torch into /work/peers-venv
  PYTHONPATH=build/python /work/peers-venv/bin/python bench/weight_sync.py \\
      [--bytes 1GiB] [--receivers 1,2,4] [--rounds 3] [--bucket 64MiB] [--json bench/results/weight_sync_DATE.json]
"""
import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from peer_common import PeakSampler, anon_rss_bytes, parse_size  # noqa: E402

METHODS = ("stagehand", "raw", "raw_read", "gather_bcast", "stagehand_tcp", "raw_tcp")
TRAINERS = 2


def worker(rank, world, receivers, args, port, results):
    import numpy as np
    import torch
    import torch.distributed as dist
    from multiprocessing import shared_memory

    import stagehand

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    bcast = dist.new_group([0] + list(range(TRAINERS, world)))
    cols = 4096
    rows = args.bytes // (4 * cols) // TRAINERS * TRAINERS
    half = rows // TRAINERS
    model_bytes = rows * cols * 4
    trainer = rank < TRAINERS
    channel = f"bench-{os.getppid()}-{receivers}"
    raw_name = f"sh-bench-raw-{os.getppid()}-{receivers}"
    if trainer:
        mine = torch.arange(half * cols, dtype=torch.int32).reshape(half, cols) + rank * half * cols
        state = {"w": stagehand.Shard(mine, [rows, cols], [rank * half, 0])}
        full = torch.empty(rows, cols, dtype=torch.int32) if rank == 0 else None
        pub = stagehand.WeightPublisher(channel, state, rank=rank, world_size=TRAINERS, bucket_bytes=args.bucket,
                                        receiver_timeout=60, connect_timeout=120)
    else:
        own = torch.zeros(rows, cols, dtype=torch.int32)
        state = {"w": own}
    if rank == 0:
        raw = shared_memory.SharedMemory(name=raw_name, create=True, size=model_bytes)
    dist.barrier()
    if rank != 0:
        raw = shared_memory.SharedMemory(name=raw_name)
    raw_view = np.ndarray((rows, cols), np.int32, buffer=raw.buf)
    tcp_channel = f"tcp://127.0.0.1:{port + 2100}"
    if trainer:
        tcp_pub = [None]
        made = threading.Thread(target=lambda: tcp_pub.__setitem__(0, stagehand.WeightPublisher(
            tcp_channel, state, rank=rank, world_size=TRAINERS, bucket_bytes=args.bucket, receiver_timeout=60,
            connect_timeout=120)))
        made.start()
    # The raw TCP streams: trainer rank t listens on port + 4200 + t; each receiver connects to both.
    raw_socks = []
    if trainer:
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", port + 4200 + rank))
        lsock.listen(receivers)
    dist.barrier()
    if trainer:
        raw_socks = [lsock.accept()[0] for _ in range(receivers)]
        lsock.close()
        made.join()
        tcp_pub = tcp_pub[0]
    else:
        for t in range(TRAINERS):
            c = socket.create_connection(("127.0.0.1", port + 4200 + t))
            raw_socks.append(c)
        rx = stagehand.WeightReceiver(channel, state, name=f"gen-{rank - TRAINERS}", connect_timeout=120)
        tcp_rx = stagehand.WeightReceiver(tcp_channel, state, name=f"gen-{rank - TRAINERS}", connect_timeout=120)
    for c in raw_socks:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    dist.barrier()

    def in_threads(fns):
        threads = [threading.Thread(target=f) for f in fns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def recv_exactly(sock, view):
        while len(view):
            n = sock.recv_into(view)
            if n == 0:
                raise RuntimeError("raw_tcp: a trainer rank closed its socket")
            view = view[n:]

    def run(method, step):
        extra = None
        if method in ("stagehand", "stagehand_tcp"):
            if method == "stagehand":
                p, r_ = (pub, None) if trainer else (None, rx)
            else:
                p, r_ = (tcp_pub, None) if trainer else (None, tcp_rx)
            if trainer:
                deadline = time.monotonic() + 60
                while p.waiting_receivers < receivers:
                    if time.monotonic() > deadline:
                        raise RuntimeError("receivers never waited")
                    time.sleep(0.0002)
                with PeakSampler(anon_rss_bytes) as peak:
                    report = p.push(step, state)
                if report["dropped"] or len(report["delivered"]) != receivers:
                    raise RuntimeError(f"push: {report}")
                extra = peak.peak - peak.base
            else:
                got = r_.receive(state, min_step=step, timeout=120)
                assert got == step
        elif method == "raw":
            if trainer:
                np.copyto(raw_view[rank * half:(rank + 1) * half], mine.numpy())
            dist.barrier()
            if not trainer:
                np.copyto(own.numpy(), raw_view)
        elif method == "raw_read":
            if not trainer:
                np.copyto(own.numpy(), raw_view)
        elif method == "gather_bcast":
            if rank == 1:
                dist.send(mine, dst=0)
            elif rank == 0:
                full[:half] = mine
                dist.recv(full[half:], src=1)
            if rank == 0 or not trainer:
                dist.broadcast(full if rank == 0 else own, src=0, group=bcast)
        elif method == "raw_tcp":
            if trainer:
                data = memoryview(mine.numpy()).cast("B")
                in_threads([lambda c=c: c.sendall(data) for c in raw_socks])
            else:
                flat = memoryview(own.numpy()).cast("B")
                part = len(flat) // TRAINERS
                in_threads([lambda t=t: recv_exactly(raw_socks[t], flat[t * part:(t + 1) * part])
                            for t in range(TRAINERS)])
        return extra

    times = {m: [] for m in METHODS}
    extras = []
    for r in range(args.rounds + 1):
        order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
        for method in order:
            dist.barrier()
            t0 = time.perf_counter()
            extra = run(method, r * 10 + METHODS.index(method) + 1)
            dist.barrier()
            took = time.perf_counter() - t0
            if r > 0:
                times[method].append(took)
                if extra is not None:
                    extras.append((method, extra))
            if not trainer and method != "raw_read":
                # Every receiver holds the whole model exactly (each method, each round).
                expect = torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols)
                if not torch.equal(own, expect):
                    raise RuntimeError(f"{method}: receiver {rank} got other weights")
                own.zero_()
    results.put({"rank": rank, "times": times, "extra": extras})
    for c in raw_socks:
        c.close()
    if trainer:
        pub.close()
        tcp_pub.close()
    else:
        rx.close()
        tcp_rx.close()
    raw.close()
    dist.barrier()
    if rank == 0:
        raw.unlink()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--receivers", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bucket", default="64MiB")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.bytes = parse_size(args.bytes)
    args.bucket = parse_size(args.bucket)
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = {"bytes": args.bytes, "bucket": args.bucket, "rounds": args.rounds, "trainers": TRAINERS, "by_receivers": {}}
    for n in [int(x) for x in args.receivers.split(",")]:
        world = TRAINERS + n
        results = ctx.Queue()
        port = 29500 + (os.getpid() + n) % 2000
        procs = [ctx.Process(target=worker, args=(r, world, n, args, port, results)) for r in range(world)]
        for p in procs:
            p.start()
        got = [results.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join(120)
            if p.exitcode != 0:
                sys.exit(f"weight_sync: a process of the {n}-receiver run failed ({p.exitcode})")
        rank0 = next(g for g in got if g["rank"] == 0)
        model = args.bytes // (4 * 4096) // TRAINERS * TRAINERS * 4096 * 4
        gbs = {m: statistics.median(n * model / t / 1e9 for t in rank0["times"][m]) for m in METHODS}
        extra = max(e for g in got if g["rank"] < TRAINERS for m, e in g["extra"] if m == "stagehand")
        extra_tcp = max(e for g in got if g["rank"] < TRAINERS for m, e in g["extra"] if m == "stagehand_tcp")
        ring = 2 * args.bucket
        row = {"gb_s": gbs, "stagehand_over_raw": gbs["stagehand"] / gbs["raw"],
               "stagehand_over_raw_read": gbs["stagehand"] / gbs["raw_read"],
               "stagehand_over_gather_bcast": gbs["stagehand"] / gbs["gather_bcast"],
               "tcp_over_raw_tcp": gbs["stagehand_tcp"] / gbs["raw_tcp"],
               "tcp_over_gather_bcast": gbs["stagehand_tcp"] / gbs["gather_bcast"],
               "raw_tcp_over_gather_bcast": gbs["raw_tcp"] / gbs["gather_bcast"],
               "trainer_peak_extra_anon_mib": extra / 2**20, "ring_mib": ring / 2**20,
               "tcp_trainer_peak_extra_anon_mib": extra_tcp / 2**20,
               "times_s": rank0["times"]}
        out["by_receivers"][n] = row
        print(f"{n} receiver(s): GB/s delivered " + ", ".join(f"{m} {gbs[m]:.2f}" for m in METHODS) +
              f"; stagehand/raw {row['stagehand_over_raw']:.2f}, /raw_read {row['stagehand_over_raw_read']:.2f}, "
              f"/gather_bcast {row['stagehand_over_gather_bcast']:.2f}; trainer peak extra anon "
              f"{row['trainer_peak_extra_anon_mib']:.1f} MiB + ring {row['ring_mib']:.0f} MiB (2 buckets); "
              f"tcp/raw_tcp {row['tcp_over_raw_tcp']:.2f}, tcp/gather_bcast {row['tcp_over_gather_bcast']:.2f} "
              f"(raw_tcp/gather_bcast {row['raw_tcp_over_gather_bcast']:.2f}), "
              f"tcp trainer peak extra anon {row['tcp_trainer_peak_extra_anon_mib']:.1f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
