"""Raw I/O baselines of the checkpoint's bytes in one process (standard library only; bench/compare_peers.py
starts it): the bytes are split into S files of equal size, each written (or read) by its own thread.

  --mode write  k x (write + fsync of S files from one in-memory buffer); save_s per position
  --mode read   S files written and fsync'd once (untimed), then k cold reads (files dropped from the page
                cache with POSIX_FADV_DONTNEED first) into one preallocated buffer; load_s per position"""
import argparse
import os
import random
import threading

import peer_common as pc

CHUNK = 256 << 20


def filled_buffer(n):
    block = random.Random(1).randbytes(1 << 20)
    buf = bytearray(n)
    mv = memoryview(buf)
    for off in range(0, n, len(block)):
        end = min(n, off + len(block))
        mv[off:end] = block[:end - off]
    return buf


def slices(n, streams):
    return [(i * n // streams, (i + 1) * n // streams) for i in range(streams)]


def run_threads(fn, parts):
    errors = []

    def wrap(i, part):
        try:
            fn(i, part)
        except BaseException as e:  # reported, not swallowed
            errors.append(repr(e))

    threads = [threading.Thread(target=wrap, args=(i, part)) for i, part in enumerate(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        pc.fail("; ".join(errors))


def write_files(directory, mv, parts):
    os.makedirs(directory, exist_ok=True)

    def write(i, part):
        fd = os.open(os.path.join(directory, "part_%03d.bin" % i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            off, end = part
            while off < end:
                off += os.write(fd, mv[off:min(end, off + CHUNK)])
            os.fsync(fd)
        finally:
            os.close(fd)

    run_threads(write, parts)


def read_files(directory, mv, parts):
    def read(i, part):
        with open(os.path.join(directory, "part_%03d.bin" % i), "rb", buffering=0) as f:
            off, end = part
            while off < end:
                got = f.readinto(mv[off:min(end, off + CHUNK)])
                if not got:
                    raise IOError("short file part_%03d.bin" % i)
                off += got

    run_threads(read, parts)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["write", "read"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--bytes", type=int, required=True, help="bytes of the checkpoint, all ranks")
    p.add_argument("--state-bytes", type=int, required=True, help="bytes of the state in memory, all ranks")
    p.add_argument("--streams", type=int, required=True)
    p.add_argument("--saves", type=int, required=True)
    args = p.parse_args()
    buf = filled_buffer(args.bytes)
    mv = memoryview(buf)
    parts = slices(args.bytes, args.streams)
    pc.emit(kind="info", rank=0, world=1, state_bytes=args.state_bytes, pre_rss=pc.rss_bytes(),
            pre_max_rss=pc.max_rss_bytes(), streams=args.streams)
    if args.mode == "write":
        previous = None
        for k in range(1, args.saves + 1):
            path = os.path.join(args.dir, "step_%d" % k)
            t0 = pc.now()
            write_files(path, mv, parts)
            t1 = pc.now()
            pc.emit(kind="save", rank=0, pos=k, save_s=t1 - t0, rss=pc.rss_bytes())
            if previous:
                pc.remove_tree(previous)
            previous = path
    else:
        path = os.path.join(args.dir, "files")
        write_files(path, mv, parts)
        for k in range(1, args.saves + 1):
            pc.drop_cache(path)
            t0 = pc.now()
            read_files(path, mv, parts)
            t1 = pc.now()
            pc.emit(kind="load", rank=0, pos=k, cold=True, load_s=t1 - t0, rss=pc.rss_bytes())
    pc.emit(kind="done", rank=0, max_rss=pc.max_rss_bytes())


if __name__ == "__main__":
    main()
