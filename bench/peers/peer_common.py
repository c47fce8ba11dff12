"""What the peer processes of bench/compare_peers.py share: the synthetic state's layout (the same
tensors, dtypes, byte sizes and replication as `stagehand-bench save`'s synthetic state), the
process group, page-cache dropping and the JSON lines they print.

Only the standard library here; torch is imported by the peers that need it."""
import json
import os
import resource
import sys
import time

MASK = (1 << 64) - 1
# bench/synthetic_state.cpp's dtype cycle: f32, bf16, f32, f16, i64, u8.
DTYPES = [("float32", 4), ("bfloat16", 2), ("float32", 4), ("float16", 2), ("int64", 8), ("uint8", 1)]
COLS = 1024


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def parse_size(text):
    units = {"": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
    i = len(text)
    while i and not (text[i - 1].isdigit() or text[i - 1] == "."):
        i -= 1
    return int(float(text[:i]) * units[text[i:]])


def tensor_specs(bytes_per_rank, tensors, seed=1):
    """[(name, dtype, rows, cols, replicated)] as make_synthetic_state lays out one rank's state."""
    weights = [1.0 + (splitmix64(seed ^ i) % 8) / 4.0 for i in range(tensors)]
    total = sum(weights)
    specs = []
    for i in range(tensors):
        dtype, elem = DTYPES[i % len(DTYPES)]
        nbytes = int(bytes_per_rank * weights[i] / total)
        rows = max(1, nbytes // elem // COLS)
        specs.append((f"layer{i // 4}.param{i % 4}", dtype, rows, COLS, i % 4 == 3))
    return specs


def state_bytes(bytes_per_rank, tensors):
    """(bytes one rank holds in memory, bytes the whole checkpoint writes) for `ranks` = 1."""
    return sum(rows * cols * dict(DTYPES)[dtype] for _, dtype, rows, cols, _ in tensor_specs(bytes_per_rank, tensors))


def status_bytes(field):
    """A size field of /proc/self/status ("VmRSS", "RssAnon", ...) in bytes; 0 if absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes():
    return status_bytes("VmRSS")


def anon_rss_bytes():
    """Anonymous RSS (heap, not shared memory nor files mapped)."""
    return status_bytes("RssAnon")


class PeakSampler:
    """The highest `read()` seen while it runs (every 2 ms); `base` is the value when it began."""

    def __init__(self, read=rss_bytes):
        import threading

        self._read = read
        self.base = self.peak = read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._read())
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def emit(**record):
    print(json.dumps(record), flush=True)


def drop_cache(root):
    """fsync then POSIX_FADV_DONTNEED every file under root: the next read comes from the disk."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def rank_world():
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init_gloo():
    """A gloo process group from the torchrun-like environment the parent sets (world size 1 too)."""
    import torch.distributed as dist
    rank, world = rank_world()
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
                            rank=rank, world_size=world)
    return dist


def make_torch_state(bytes_per_rank, tensors, seed=1):
    """{name: (local tensor, rows, replicated)} for this rank, filled with non-zero pseudo-random bytes
    (every page touched, as a trained state's would be)."""
    import torch
    rank, world = rank_world()
    gen = torch.Generator().manual_seed(seed * 1000003 + rank)
    state = {}
    for name, dtype, rows, cols, replicated in tensor_specs(bytes_per_rank, tensors, seed):
        t = torch.empty((rows, cols), dtype=getattr(torch, dtype))
        t.view(torch.uint8).random_(1, 256, generator=gen)
        state[name] = (t, rows, replicated)
    return state


def remove_tree(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def fail(msg):
    emit(kind="error", error=msg)
    sys.exit(2)


def now():
    return time.perf_counter()
