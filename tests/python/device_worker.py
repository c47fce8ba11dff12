"""CUDA arrays from Python, saved and loaded on the process's device: the simulated one under
STAGEHAND_SIMULATED_GPU=1 (python_test), or a GPU (scripts/device-check.sh). The arrays are DLPack
arrays of device type CUDA, as torch.cuda tensors arrive; this script fills and reads them only
through the copy engine (stagehand._stagehand._device_copy), since host code may not touch
device memory.

    python device_worker.py OUT_DIR

Checks, and exits 1 naming the first that fails:
- a sync save of device arrays writes the same files, byte for byte, as a save of the same
  values from host memory;
- async saves (staging 0, and staging 1 with the rest staged from the live arrays behind
  wait_staged) keep the values of the call: the arrays are overwritten once the rule allows;
- loads into device arrays (of a host-saved and a device-saved step) give the values back;
- the copy engine found no misuse, and the saves and loads went through it.
Prints one JSON line: the engine's name, its misuse count and the bytes it copied each way within
the three saves (until each is staged) and within the four loads."""

import json
import pathlib
import sys

import ml_dtypes
import numpy as np

import stagehand
from stagehand import _stagehand as native

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(7)
HOST = {
    "layers": {
        "w": rng.standard_normal((256, 1024)).astype(np.float32),
        "b": rng.standard_normal(1024).astype(ml_dtypes.bfloat16),
        "h": rng.standard_normal((3, 5)).astype(np.float16),
    },
    "counts": rng.integers(-(2**62), 2**62, 7, dtype=np.int64),
    "mask": rng.integers(0, 2, 33).astype(np.bool_),
    "bytes": rng.integers(0, 256, 4099, dtype=np.uint8),
    "lr": 0.25,
}
STORED = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int64": "I64", "bool": "BOOL", "uint8": "U8"}


def leaves(state, prefix=""):
    for key, value in state.items():
        if isinstance(value, dict):
            yield from leaves(value, prefix + key + ".")
        else:
            yield prefix + key, value


def raw(array):
    """The array's bytes as a same-size unsigned view (what _device_copy takes from numpy)."""
    return array.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[array.itemsize])


def device_like(state, fill=True):
    result = {}
    for key, value in state.items():
        if isinstance(value, dict):
            result[key] = device_like(value, fill)
        elif isinstance(value, np.ndarray):
            array = native._device_empty(list(value.shape), STORED[value.dtype.name])
            native._device_copy(array, raw(value) if fill else raw(np.zeros_like(value)))
            result[key] = array
        else:
            result[key] = value if fill else 0.0
    return result


def to_host(device_state):
    result = {}
    for (name, value), (_, like) in zip(leaves(device_state), leaves(HOST)):
        if isinstance(like, np.ndarray):
            host = np.empty_like(like)
            native._device_copy(raw(host), value)
            result[name] = host
        else:
            result[name] = value
    return result


class Copies:
    """The bytes the copy engine moved each way while the block ran (added to `totals`)."""

    def __init__(self, totals):
        self.totals = totals

    def __enter__(self):
        self.before = native._copy_engine()

    def __exit__(self, *exc):
        after = native._copy_engine()
        for way in ("device_to_host_bytes", "host_to_device_bytes"):
            self.totals[way] += after[way] - self.before[way]


saves = {"device_to_host_bytes": 0, "host_to_device_bytes": 0}
loads = {"device_to_host_bytes": 0, "host_to_device_bytes": 0}


def files_of(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def check(what, ok):
    if not ok:
        print("device_worker: " + what, file=sys.stderr)
        sys.exit(1)


def same(loaded, expected, what):
    for name, value in leaves(expected):
        got = loaded[name]
        if isinstance(value, np.ndarray):
            check(f"{what}: tensor '{name}' differs", raw(got).tobytes() == raw(value).tobytes())
        else:
            check(f"{what}: object '{name}' is {got!r}, not {value!r}", got == value)


def overwrite(device_state):
    """What a trainer's next step does to its tensors: every byte changes."""
    for (_, array), (_, like) in zip(leaves(device_state), leaves(HOST)):
        if isinstance(like, np.ndarray):
            native._device_copy(array, raw(np.full_like(like, 1 if like.dtype == np.bool_ else 3)))


with stagehand.Checkpointer(out / "host", thread_count=2) as ckpt:
    ckpt.save(1, HOST)

device = device_like(HOST)
with stagehand.Checkpointer(out / "device", thread_count=2) as ckpt:
    with Copies(saves):
        ckpt.save(1, device)
    host_files, device_files = files_of(out / "host" / "global_step_1"), files_of(out / "device" / "global_step_1")
    check(f"a device save wrote {sorted(device_files)}, a host save {sorted(host_files)}",
          sorted(host_files) == sorted(device_files))
    for name in host_files:
        check(f"'{name}' of the device save differs from the host save's", host_files[name] == device_files[name])
    with Copies(saves):
        pending = ckpt.async_save(2, device)
    check("an async save with staging 0 returned before staging everything", pending.staged())
    overwrite(device)
    pending.wait()

device = device_like(HOST)
with stagehand.Checkpointer(out / "staged", thread_count=2, staging_buckets=1) as ckpt:
    with Copies(saves):
        pending = ckpt.async_save(3, device)
        pending.wait_staged()
    overwrite(device)
    pending.wait()

for root, step in (("host", 1), ("device", 1), ("device", 2), ("staged", 3)):
    target = device_like(HOST, fill=False)
    with stagehand.Checkpointer(out / root) as ckpt:
        with Copies(loads):
            ckpt.load(target, out / root / f"global_step_{step}")
    same(to_host(target), HOST, f"{root} step {step} loaded into device arrays")

engine = native._copy_engine()
check(f"the copy engine found {engine['misuse']} misuse(s)", engine["misuse"] == 0)
print(json.dumps({"engine": engine["name"], "misuse": engine["misuse"], "saves": saves, "loads": loads}))
