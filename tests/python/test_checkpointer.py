"""The Python package against the C++ engine: round trips, objects, async saves, errors, checkpoints
shared with C++ byte for byte, and SPMD saves and resharded loads in several processes.

Run by ctest (python_test) with PYTHONPATH=<build>/python and STAGEHAND_BIN_DIR=<build>/bin."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import stagehand

BIN = pathlib.Path(os.environ.get("STAGEHAND_BIN_DIR", "build/bin"))
SOURCE = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("spmd_worker.py")

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32,
          np.uint16, np.uint8, np.bool_]


def random_array(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return np.asarray(rng.standard_normal(shape) * 4).astype(dtype)  # 0-d stays an array


def save_in(root, step, state):
    with stagehand.Checkpointer(root) as ckpt:
        ckpt.save(step, state)


def load_from(root, state, path=None):
    """Loads into `state` with a fresh Checkpointer (as a restarted process does)."""
    with stagehand.Checkpointer(root) as ckpt:
        ckpt.load(state, path)
    return state


def files_of(folder):
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, dtype):
    saved = {"a": random_array(dtype, (37, 5), 1), "scalar": random_array(dtype, (), 2)}
    save_in(tmp_path, 1, saved)
    loaded = {k: np.zeros_like(v) for k, v in saved.items()}
    load_from(tmp_path, loaded)
    for key in saved:
        assert loaded[key].dtype == saved[key].dtype
        assert loaded[key].tobytes() == saved[key].tobytes(), key


def test_tensors_are_wrapped_where_they_are_not_copied():
    base = np.zeros((8, 16), np.float32)
    bf = np.zeros(8, ml_dtypes.bfloat16)
    bound = stagehand._Bound({"w": base, "b": bf, "s": stagehand.Shard(base[2:4], [8, 16], [2, 0])}, writable=True)
    ptrs = {name: ptr for name, _, ptr in bound.entries.describe()}
    assert ptrs == {"w": base.ctypes.data, "b": bf.ctypes.data, "s": base[2:4].ctypes.data}
    dtypes = {name: dtype for name, dtype, _ in bound.entries.describe()}
    assert dtypes == {"w": "F32", "b": "BF16", "s": "F32"}


def test_nested_dicts_and_objects_come_back(tmp_path):
    state = {
        "model": {"layers": {"0": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}},
        "optimizer": {"m": np.ones(4, np.float32), "hyper": {"lr": 3e-4, "betas": [0.9, 0.95]}},
        "scheduler": {"last_epoch": 12, "name": "cosine"},
        "rng": [1, 2, 3],
        "step": np.int64(12),
        # A torch-style flat state_dict: dotted keys stay as they are.
        "flat": {"layers.0.weight": np.full(3, 2.0, np.float32), "epoch.count": 4},
    }
    save_in(tmp_path, 12, state)
    target = {
        "model": {"layers": {"0": {"w": np.zeros((2, 3), np.float32)}}},
        "optimizer": {"m": np.zeros(4, np.float32), "hyper": None},
        "scheduler": None,
        "rng": None,
        "step": None,
        "flat": {"layers.0.weight": np.zeros(3, np.float32), "epoch.count": None},
    }
    load_from(tmp_path, target)
    assert np.array_equal(target["model"]["layers"]["0"]["w"], state["model"]["layers"]["0"]["w"])
    assert np.array_equal(target["optimizer"]["m"], np.ones(4, np.float32))
    assert target["optimizer"]["hyper"] == {"lr": 3e-4, "betas": [0.9, 0.95]}
    assert target["scheduler"] == {"last_epoch": 12, "name": "cosine"}
    assert target["rng"] == [1, 2, 3]
    assert target["step"] == 12
    assert np.all(target["flat"]["layers.0.weight"] == 2.0) and target["flat"]["epoch.count"] == 4
    # The tensors are saved under the joined names, as C++ sees them.
    meta = json.loads((tmp_path / "global_step_12" / "policy" / "metadata.json").read_text())
    assert "model.layers.0.w" in json.dumps(meta)


@pytest.mark.parametrize("staging_buckets", [0, 2])
def test_a_tensor_modified_after_async_save_does_not_reach_that_step(tmp_path, staging_buckets):
    arrays = {f"t{i}": np.full(1 << 16, i, np.float32) for i in range(8)}
    with stagehand.Checkpointer(tmp_path, staging_buckets=staging_buckets, thread_count=4) as ckpt:
        pending = ckpt.async_save(1, arrays)
        # The rule: modify once staged() (at once with staging_buckets 0).
        if staging_buckets == 0:
            assert pending.staged()
        pending.wait_staged()
        assert pending.staged()
        for a in arrays.values():
            a[:] = -1
        pending.wait()
        assert pending.done()
    loaded = {k: np.zeros_like(v) for k, v in arrays.items()}
    load_from(tmp_path, loaded, tmp_path / "global_step_1")
    for i in range(8):
        assert np.all(loaded[f"t{i}"] == i)


def test_bad_input_is_refused_naming_the_tensor(tmp_path):
    with stagehand.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="'w' is not C-contiguous"):
            ckpt.save(1, {"w": np.zeros((4, 4), np.float32)[:, ::2]})
        with pytest.raises(TypeError, match="'c'.*dtype"):
            ckpt.save(1, {"c": np.zeros(3, np.complex64)})
        with pytest.raises(ValueError, match="both named 'a.b'"):
            ckpt.save(1, {"a.b": np.zeros(3, np.float32), "a": {"b": np.zeros(3, np.float32)}})
        # A tensor and an object, and two objects (under a dict that also holds a tensor).
        with pytest.raises(ValueError, match="both named 'a.b'"):
            ckpt.save(1, {"a.b": 1, "a": {"b": np.zeros(3, np.float32)}})
        with pytest.raises(ValueError, match="both named 'a.b'"):
            ckpt.save(1, {"a.b": 1, "a": {"b": 2, "t": np.zeros(3, np.float32)}})
        with pytest.raises(TypeError, match="object 'o' cannot be saved as JSON"):
            ckpt.save(1, {"o": object()})
        ckpt.save(1, {"w": np.zeros(3, np.float32)})
        with pytest.raises(stagehand.Error, match="other tensors or shapes"):
            ckpt.save(2, {"w": np.zeros(4, np.float32)})
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    with stagehand.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="'w' is read-only"):
            ckpt.load({"w": frozen})
        with pytest.raises(stagehand.Error, match="tensor 'missing'.*not in the checkpoint"):
            ckpt.load({"missing": np.zeros(3, np.float32)})
    with pytest.raises(stagehand.Error, match="holds neither a committed checkpoint"):
        with stagehand.Checkpointer(tmp_path / "empty") as ckpt:
            ckpt.load({"w": np.zeros(3, np.float32)})


def test_more_bad_input_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="both rank and world_size"):
        stagehand.Checkpointer(tmp_path, world_size=4)
    # A week at most: 6 x the timeout in nanoseconds must not overflow (a close then never ended).
    for bad in (float("inf"), float("nan"), -1, 0, 1e-4, 1e10, True, "60"):
        with pytest.raises(ValueError, match="timeout must be a number of seconds from 0.001 to 604800"):
            stagehand.Checkpointer(tmp_path, timeout=bad)
    with pytest.raises(ValueError, match="join_timeout must be"):
        stagehand.Checkpointer(tmp_path, join_timeout=8 * 24 * 3600)
    with pytest.raises(ValueError, match="a 2-d tensor cannot be a block"):
        stagehand.Shard(np.zeros((2, 2), np.float32), [], [])
    with stagehand.Checkpointer(tmp_path) as ckpt:
        for dtype in (np.longdouble, ml_dtypes.float8_e4m3fnuz, ml_dtypes.int4):
            with pytest.raises(TypeError, match=f"tensor 'odd': dtype {np.dtype(dtype).name}"):
                ckpt.save(1, {"odd": np.zeros(4, dtype)})
        with pytest.raises(TypeError, match="object 'layers' holds a tensor"):
            ckpt.save(1, {"layers": [np.zeros(3, np.float32)]})
        with pytest.raises(TypeError, match="object 'o' has key 1"):
            ckpt.save(1, {"o": {1: 2}})
        with pytest.raises(TypeError, match="tensor 'be': its bytes are not in this machine's byte order"):
            ckpt.save(1, {"be": np.arange(4, dtype=">f4")})
        for step in (3.7, "3", None):
            with pytest.raises(TypeError, match="step must be an integer"):
                ckpt.save(step, {"w": np.zeros(4, np.float32)})
        ckpt.save(np.int64(3), {"w": np.zeros(4, np.float32)})  # any integer type
    assert (tmp_path / "global_step_3").is_dir()
    with stagehand.Checkpointer(tmp_path, write_rate_limit_mib_s=-1) as ckpt:
        with pytest.raises(stagehand.Error, match="write_rate_limit_mib_s must be 0"):
            ckpt.save(1, {"w": np.zeros(4, np.float32)})


def test_read_only_arrays_save(tmp_path):
    saved = np.arange(10, dtype=np.float32)
    np.save(tmp_path / "a.npy", saved)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert not mapped.flags.writeable
    save_in(tmp_path / "ckpt", 1, {"w": mapped})
    loaded = {"w": np.zeros(10, np.float32)}
    load_from(tmp_path / "ckpt", loaded)
    assert np.array_equal(loaded["w"], saved)


def test_a_state_dropped_after_async_save_is_kept_until_the_save_is_done(tmp_path):
    # The next call finishes the pending save, which still stages from the dropped arrays.
    with stagehand.Checkpointer(tmp_path, staging_buckets=1, thread_count=2) as ckpt:
        ckpt.async_save(1, {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(8)})
        ckpt.save(2, {f"t{i}": np.full(1 << 20, -i, np.float32) for i in range(8)})
    loaded = {f"t{i}": np.zeros(1 << 20, np.float32) for i in range(8)}
    load_from(tmp_path, loaded, tmp_path / "global_step_1")
    assert all(np.all(loaded[f"t{i}"] == i) for i in range(8))


class _CopyingProducer:
    """A DLPack producer that exports a copy of its data (the protocol allows it): the copy lives
    only as long as the capsule it came in."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return np.array(self.array, copy=True).__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_a_producer_that_exports_a_copy_is_saved_from_that_copy(tmp_path):
    # The capsule is kept with its entry until the save is done: its copy was freed before (a
    # segfault, or garbage in the file).
    values = np.arange(4 << 20, dtype=np.float32)
    with stagehand.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"w": _CopyingProducer(values)})
        ckpt.async_save(2, {"w": _CopyingProducer(values * 2)}).wait()
    for step, expected in ((1, values), (2, values * 2)):
        loaded = {"w": np.zeros_like(values)}
        load_from(tmp_path, loaded, tmp_path / f"global_step_{step}")
        assert np.array_equal(loaded["w"], expected)


class _PythonRuns:
    """Counts, on a thread of its own, how often Python code ran while the block ran: a call
    that holds the GIL lets it run hardly at all. `pause`: seconds between counts (0: none)."""

    def __init__(self, pause=0.0):
        self.pause = pause
        self.count = 0
        self.seconds = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._done.is_set():
            self.count += 1
            if self.pause:
                time.sleep(self.pause)

    def __enter__(self):
        self._thread.start()
        self._before = self.count
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start
        self.count -= self._before
        self._done.set()
        self._thread.join()


def test_a_checkpointer_dropped_with_a_pending_save_finishes_it_without_the_gil(tmp_path):
    ckpt = stagehand.Checkpointer(tmp_path, write_rate_limit_mib_s=16)
    pending = ckpt.async_save(1, {"w": np.ones(4 << 20, np.float32)})  # 16 MiB: about a second
    with _PythonRuns(pause=0.005) as ran:
        del ckpt
    assert pending.done()
    assert (tmp_path / "global_step_1").is_dir()
    # With the GIL held the counter would not move (it did once in 2 s before __del__ closed).
    assert ran.seconds > 0.3 and ran.count > ran.seconds / 0.005 / 4, f"{ran.count} counts in {ran.seconds:.2f} s"


def test_a_subtree_without_tensors_is_one_object(tmp_path):
    save_in(tmp_path, 1, {"w": np.ones(2, np.float32), "sched": {"cfg": {"a": 1}, "n": 2}})
    target = {"w": np.zeros(2, np.float32), "sched": None}
    load_from(tmp_path, target)
    assert target["sched"] == {"cfg": {"a": 1}, "n": 2}


def test_the_gil_is_released_while_a_save_runs(tmp_path):
    with stagehand.Checkpointer(tmp_path, thread_count=2) as ckpt:
        state = {f"t{i}": np.full(4 << 20, i, np.float32) for i in range(8)}  # 128 MiB
        with _PythonRuns() as ran:
            ckpt.save(1, state)
    # With the GIL held for the whole save the counter would not move (beyond a switch or two).
    assert ran.count > 1000, f"the counter moved {ran.count} times during a {ran.seconds:.3f} s save"


def test_a_closed_checkpointer_refuses_calls(tmp_path):
    ckpt = stagehand.Checkpointer(tmp_path)
    ckpt.close()
    with pytest.raises(stagehand.Error, match="closed"):
        ckpt.save(1, {"w": np.zeros(3, np.float32)})


INTERRUPTED = """
import signal, sys, time
import numpy as np
import stagehand
# A shell that starts CI in the background ignores SIGINT, the child inherits that, and Python
# then installs no handler: install Python's own, as an interactive run has.
signal.signal(signal.SIGINT, signal.default_int_handler)
# 128 MiB in 8 tensors at 32 MiB/s: the background write takes about 4 s. Waiting for the
# staging: one bucket of two is staged before the return, the other as the slow writes free slots.
state = {f"w{i}": np.arange(i << 22, (i + 1) << 22, dtype=np.float32) for i in range(8)}
state["step"] = 5
staging = sys.argv[2] in ("wait_staged", "fence")
with stagehand.Checkpointer(sys.argv[1], write_rate_limit_mib_s=32, staging_buckets=1 if staging else 0) as ckpt:
    pending = ckpt.async_save(5, state)
    print("waiting", flush=True)
    start = time.monotonic()
    try:
        getattr(ckpt if sys.argv[2] == "fence" else pending, sys.argv[2])()
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        over = pending.staged() if staging else pending.done()
        print(f"interrupted after {time.monotonic() - start:.2f} s, over={over}", flush=True)
print("closed", flush=True)
"""


@pytest.mark.parametrize("wait", ["wait", "wait_staged", "fence"])
def test_ctrl_c_in_a_wait_interrupts_the_wait_and_the_checkpoint_still_commits_whole(tmp_path, wait):
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED, tmp_path, wait], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    child.send_signal(2)  # SIGINT, as Ctrl-C sends it
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    lines = out.split("\n")
    # Interrupted while the write still ran (not when it ended), then the with block's close
    # finished the save.
    assert lines[0].startswith("interrupted after ") and lines[0].endswith("over=False"), out
    assert float(lines[0].split()[2]) < 2.0, out
    assert lines[1] == "closed", out
    assert (tmp_path / "latest_ckpt_global_step.txt").read_text().strip() == "5"
    subprocess.run([BIN / "stagehand-ckpt", "verify", tmp_path], check=True, capture_output=True)
    target = load_from(tmp_path, {**{f"w{i}": np.zeros(4 << 20, np.float32) for i in range(8)}, "step": 0})
    assert all(np.array_equal(target[f"w{i}"], np.arange(i << 22, (i + 1) << 22, dtype=np.float32)) for i in range(8))
    assert target["step"] == 5


@pytest.mark.parametrize("wait", ["wait_staged", "fence"])
def test_a_staging_wait_past_the_limit_raises_instead_of_saying_staged(tmp_path, wait):
    # One bucket of two staged at a time; the second waits for the first's write, about 4 s at
    # 16 MiB/s; the limit is 1.5 s, which the save's own staging of the first bucket must fit in
    # (0.5 s did not, once, in CI beside another test). wait_staged once returned as if staged
    # (and its poll, like fence's, had no limit); both raise once the limit passed, without
    # another wait.
    state = {f"w{i}": np.ones(4 << 20, np.float32) for i in range(8)}
    with stagehand.Checkpointer(tmp_path, write_rate_limit_mib_s=16, staging_buckets=1, timeout=1.5) as ckpt:
        pending = ckpt.async_save(1, state)
        start = time.monotonic()
        what = "the fence did not open" if wait == "fence" else "step 1 was not staged"
        with pytest.raises(stagehand.Error, match=f"timeout: {what} within 1.5 s"):
            getattr(ckpt if wait == "fence" else pending, wait)()
        assert time.monotonic() - start < 2.4
        assert not pending.staged()
        with pytest.raises(stagehand.Error):
            pending.wait()


def test_max_to_keep_removes_old_steps_and_later_saves_write_over_their_files(tmp_path):
    arrays = {"w": np.arange(1 << 16, dtype=np.float32), "b": np.ones(8, np.float32), "step": 0}
    data_files = lambda step: {p.name: p.stat().st_ino
                               for p in (tmp_path / f"global_step_{step}" / "policy").glob("__*.safetensors")}
    with stagehand.Checkpointer(tmp_path, max_to_keep=2, thread_count=2) as ckpt:
        ckpt.save(1, arrays)
        first = data_files(1)
        assert first
        ckpt.save(2, arrays)
        ckpt.save(3, arrays)
        assert not (tmp_path / "global_step_1").exists()
        arrays["w"][:] = 5
        arrays["step"] = 4
        ckpt.async_save(4, arrays).wait()
        # Step 4 is step 1's files, written over (kept alive as spares in between).
        assert data_files(4) == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("global_step")) == \
        ["global_step_3", "global_step_4"]
    assert not (tmp_path / ".spare_files").exists()
    subprocess.run([BIN / "stagehand-ckpt", "verify", tmp_path], check=True, capture_output=True)
    loaded = load_from(tmp_path, {"w": np.zeros(1 << 16, np.float32), "b": np.zeros(8, np.float32), "step": 0})
    assert np.all(loaded["w"] == 5) and np.all(loaded["b"] == 1) and loaded["step"] == 4
    with pytest.raises(stagehand.Error, match="max_to_keep must be 0"):
        with stagehand.Checkpointer(tmp_path / "other", max_to_keep=-1) as bad:
            bad.save(1, arrays)


def test_cuda_arrays_save_and_load_through_the_simulated_device(tmp_path):
    """DLPack arrays of device type CUDA (as torch.cuda tensors arrive) on the simulated device:
    device_worker.py checks files equal to a host save's, async saves that keep the call's values,
    loads back into device arrays, and no misuse; here, that the copies went through the device."""
    env = {**os.environ, "STAGEHAND_SIMULATED_GPU": "1"}
    run = subprocess.run([sys.executable, pathlib.Path(__file__).with_name("device_worker.py"), tmp_path],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["engine"] == "simulated" and found["misuse"] == 0, found
    state_bytes = 256 * 1024 * 4 + 1024 * 2 + 15 * 2 + 7 * 8 + 33 + 4099
    # Each of the three saves copied the whole state out of the device (until staged), and each of
    # the four loads into it.
    assert found["saves"]["device_to_host_bytes"] == 3 * state_bytes, found
    assert found["loads"]["host_to_device_bytes"] == 4 * state_bytes, found


def test_device_arrays_need_a_device():
    with pytest.raises(stagehand.Error, match="device 99 does not exist"):
        stagehand._stagehand._device_empty([4], "F32", 99)
    with pytest.raises(TypeError, match="F8_E4M3"):
        stagehand._stagehand._device_empty([4], "F8_E4M3", 0)


def peer_state(zero=False):
    """The state tests/python/py_peer.cpp saves."""
    w = (np.arange(64 * 48) % 97).astype(np.float32).reshape(64, 48) * 0.25
    b = ((np.arange(48) - 24) * 0.5).astype(ml_dtypes.bfloat16)
    state = {"model": {"w": w, "b": b}, "opt": {"step": np.array([7], np.int64)},
             "sched": {"lr": 0.5, "step": 7}}
    if zero:
        state = {"model": {"w": np.zeros_like(w), "b": np.zeros_like(b)},
                 "opt": {"step": np.zeros(1, np.int64)}, "sched": None}
    return state


def test_python_and_cpp_write_the_same_bytes_and_read_each_other(tmp_path):
    save_in(tmp_path / "py", 3, peer_state())
    subprocess.run([BIN / "py_peer", "save", tmp_path / "cpp", "3"], check=True)
    py, cpp = files_of(tmp_path / "py" / "global_step_3"), files_of(tmp_path / "cpp" / "global_step_3")
    assert sorted(py) == sorted(cpp)
    for name in py:
        assert py[name] == cpp[name], f"{name} differs"
    # C++ loads what Python saved; Python loads what C++ saved.
    subprocess.run([BIN / "py_peer", "check", tmp_path / "py"], check=True)
    loaded = peer_state(zero=True)
    load_from(tmp_path / "cpp", loaded)
    expected = peer_state()
    assert np.array_equal(loaded["model"]["w"], expected["model"]["w"])
    assert loaded["model"]["b"].tobytes() == expected["model"]["b"].tobytes()
    assert loaded["opt"]["step"][0] == 7
    assert loaded["sched"] == {"lr": 0.5, "step": 7}
    # And the tool verifies it.
    subprocess.run([BIN / "stagehand-ckpt", "verify", tmp_path / "py"], check=True, capture_output=True)


def launch(n, *args, timeout=120):
    return subprocess.run([SOURCE / "scripts" / "launch-local.sh", str(n), sys.executable, WORKER, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "GRACE_S": "10"})


def test_four_processes_save_spmd_and_two_load_it_resharded(tmp_path):
    saved = launch(4, "save", tmp_path)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert (tmp_path / "latest_ckpt_global_step.txt").read_text().strip() == "5"
    loaded = launch(2, "load", tmp_path)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert loaded.stdout.count("loaded ok") == 2, loaded.stdout
    # One process reads the whole of it too.
    single = subprocess.run([sys.executable, WORKER, "load", tmp_path], capture_output=True, text=True,
                            timeout=60, env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert single.returncode == 0, single.stdout + single.stderr


def test_a_rank_that_disagrees_fails_every_rank_naming_it(tmp_path):
    job = launch(4, "save", tmp_path, "--bad-rank", "3")
    assert job.returncode != 0
    assert job.stdout.count("save failed") == 4, job.stdout + job.stderr
    assert "rank 3" in job.stdout
    assert not (tmp_path / "latest_ckpt_global_step.txt").exists()


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="torch is not installed for this Python (CI installs numpy only; "
                                          "the numpy tests cover the same engine)")
def test_torch_cpu_tensors_round_trip_without_copies(tmp_path):
    state = {"w": torch.randn(128, 64, dtype=torch.bfloat16), "m": torch.randn(64), "b": torch.ones(3, dtype=torch.bool),
             "f8": torch.randn(16).to(torch.float8_e4m3fn)}
    bound = stagehand._Bound(state, writable=False)
    assert [ptr for _, _, ptr in bound.entries.describe()] == [t.data_ptr() for t in state.values()]
    assert [dtype for _, dtype, _ in bound.entries.describe()] == ["BF16", "F32", "BOOL", "F8_E4M3"]
    save_in(tmp_path, 1, state)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    load_from(tmp_path, target)
    for key in state:
        assert target[key].view(torch.uint8).equal(state[key].view(torch.uint8)), key


@pytest.mark.skipif(torch is None, reason="torch is not installed for this Python (CI installs numpy only; "
                                          "the Shard tests cover the same layouts)")
def test_torch_dtensors_save_from_a_2d_mesh_and_load_resharded(tmp_path):
    worker = pathlib.Path(__file__).with_name("dtensor_worker.py")
    env = {**os.environ, "GRACE_S": "10"}
    saved = subprocess.run([SOURCE / "scripts" / "launch-local.sh", "4", sys.executable, worker, "save", tmp_path],
                           capture_output=True, text=True, timeout=180, env=env)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert saved.stdout.count("saved") == 4, saved.stdout
    # Saved once each: "w" by mesh row 0 and 1 only (replicas skipped), "b" by one rank.
    subprocess.run([BIN / "stagehand-ckpt", "verify", tmp_path], check=True, capture_output=True)
    loaded = subprocess.run([SOURCE / "scripts" / "launch-local.sh", "2", sys.executable, worker, "load", tmp_path],
                            capture_output=True, text=True, timeout=180, env=env)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert loaded.stdout.count("loaded ok") == 2, loaded.stdout
    # Plain tensors in one process read the global values.
    target = {"w": torch.zeros(8, 6), "m": torch.zeros(16, dtype=torch.float64), "b": torch.zeros(6, dtype=torch.bfloat16),
              "step": 0}
    load_from(tmp_path, target)
    assert torch.equal(target["w"], torch.arange(48, dtype=torch.float32).reshape(8, 6) * 0.5)
    assert target["step"] == 3


@pytest.mark.skipif(torch is None, reason="torch is not installed for this Python")
def test_a_partial_dtensor_is_refused_naming_it(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    partial = DTensor.from_local(torch.ones(4), mesh, [Partial()])
    with stagehand.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(TypeError, match="tensor 'g': a DTensor placed .* redistribute"):
            ckpt.save(1, {"g": partial})



def test_python_m_stagehand_verify_checks_every_chunk(tmp_path):
    save_in(tmp_path, 4, {"w": random_array(np.float32, (256, 64), 3), "step": 4})
    run = lambda path: subprocess.run([sys.executable, "-m", "stagehand", "verify", str(path)],
                                      capture_output=True, text=True, timeout=60)
    good = run(tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith(f"OK {tmp_path}/global_step_4: ") and "0 problems" in good.stdout
    assert stagehand.verify(tmp_path / "global_step_4")["chunks_checked"] >= 1
    # A flipped byte in a data file is found and named.
    data = next((tmp_path / "global_step_4" / "policy").glob("*.safetensors"))
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    bad = run(tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert data.name in bad.stdout and "FAILED" in bad.stdout
    missing = run(tmp_path / "nothing-here")
    assert missing.returncode == 2 and "nothing-here" in missing.stderr


def test_python_m_stagehand_verify_and_export_draw_a_progress_line_when_asked(tmp_path):
    """As stagehand-ckpt's: "verify: 72.0 KiB of 72.0 KiB (100%)", on stderr, ended by a new line;
    none when not asked and stderr is no terminal (auto), or with never."""
    w = random_array(np.float32, (256, 64), 11)
    save_in(tmp_path / "ckpt", 2, {"model": {"w": w}, "step": 2})
    m = [sys.executable, "-m", "stagehand"]
    for args, phase in ((["verify", str(tmp_path / "ckpt")], "verify"),
                        (["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")], "export")):
        shown = subprocess.run(m + args + ["--progress", "always"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        lines = [line.split("\r")[-1] for line in shown.stderr.splitlines()]
        assert any(line.startswith(f"{phase}: ") and "(100%)" in line for line in lines), shown.stderr
        assert shown.stderr.endswith("\n")
        if phase == "export":
            shutil.rmtree(tmp_path / "hf")
        quiet = subprocess.run(m + args, capture_output=True, text=True, timeout=60)  # auto, stderr a pipe
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        if phase == "export":
            shutil.rmtree(tmp_path / "hf")
    bad = subprocess.run(m + ["verify", str(tmp_path / "ckpt"), "--progress", "sometimes"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--progress" in bad.stderr
    with pytest.raises(ValueError, match="progress: 'sometimes'"):
        stagehand.verify(tmp_path / "ckpt", progress="sometimes")


def test_inspect_lists_what_was_saved_and_python_m_prints_it(tmp_path):
    w = random_array(np.float32, (256, 64), 5)
    b = random_array(ml_dtypes.bfloat16, (64,), 6)
    save_in(tmp_path, 7, {"model": {"w": w, "b": b}, "scheduler": {"step": 7}})
    info = stagehand.inspect(tmp_path)
    assert info["checkpoint"] == f"{tmp_path}/global_step_7" and info["step"] == 7
    assert set(info["tensors"]) == {"model.w", "model.b"}
    tw = info["tensors"]["model.w"]
    assert tw["dtype"] == "F32" and tw["global_shape"] == [256, 64] and tw["bytes"] == w.nbytes
    assert info["tensors"]["model.b"]["dtype"] == "BF16" and info["tensors"]["model.b"]["bytes"] == b.nbytes
    # Each chunk names its file, and the files are listed with the sizes they have on disk.
    policy = tmp_path / "global_step_7" / "policy"
    for t in info["tensors"].values():
        for chunk in t["chunks"]:
            assert chunk["file"] in info["files"] and len(chunk["xxh3"]) == 16
        assert sum(c["bytes"] for c in t["chunks"]) == t["bytes"]
    for name, f in info["files"].items():
        assert (policy / name).stat().st_size == f["size"]
    assert json.loads(info["objects"]["scheduler"]) == {"step": 7}
    # python -m stagehand inspect: the same as text and as JSON.
    text = subprocess.run([sys.executable, "-m", "stagehand", "inspect", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "model.w" in text.stdout and "[256, 64]" in text.stdout and "2 tensors" in text.stdout
    as_json = subprocess.run([sys.executable, "-m", "stagehand", "inspect", "--json", str(tmp_path / "global_step_7")],
                             capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == info
    # A folder that holds no checkpoint: an Error naming it (exit 2 from python -m).
    with pytest.raises(stagehand.Error, match="nothing-here"):
        stagehand.inspect(tmp_path / "nothing-here")
    missing = subprocess.run([sys.executable, "-m", "stagehand", "inspect", str(tmp_path / "nothing-here")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "nothing-here" in missing.stderr


def test_export_writes_hugging_face_files_that_safetensors_reads(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    w = random_array(np.float32, (128, 64), 8)
    b = random_array(np.float32, (64,), 9)
    m = random_array(np.float32, (128, 64), 10)
    save_in(tmp_path / "ckpt", 3, {"model": {"w": w, "b": b}, "optim": {"m": m}, "step": 3})
    # The model's tensors, as saved: one file.
    report = stagehand.export(tmp_path / "ckpt", tmp_path / "hf")
    assert report["files"] == ["model.safetensors"] and report["tensors"] == 2
    loaded = safetensors_numpy.load_file(tmp_path / "hf" / "model.safetensors")
    assert set(loaded) == {"model.w", "model.b"}
    assert np.array_equal(loaded["model.w"], w) and np.array_equal(loaded["model.b"], b)
    # Every tensor, converted to bf16, in shards of at most 20 KB: numbered files and an index.
    report = stagehand.export(tmp_path / "ckpt" / "global_step_3", tmp_path / "all", what="all", dtype="bf16",
                              max_shard_size="20KB")
    assert "model.safetensors.index.json" in report["files"] and len(report["files"]) > 2
    index = json.loads((tmp_path / "all" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"model.w", "model.b", "optim.m"}
    m_file = tmp_path / "all" / index["weight_map"]["optim.m"]
    m_bf16 = safetensors_numpy.load_file(m_file)["optim.m"]
    assert m_bf16.dtype == np.dtype(ml_dtypes.bfloat16) or m_bf16.dtype.itemsize == 2
    assert np.array_equal(m_bf16.view(np.uint16), m.astype(ml_dtypes.bfloat16).view(np.uint16))
    # Bad arguments are refused naming them; a folder that is not empty is never written into.
    with pytest.raises(ValueError, match="what: 'everything'"):
        stagehand.export(tmp_path / "ckpt", tmp_path / "x", what="everything")
    with pytest.raises(ValueError, match="dtype: 'fp8'"):
        stagehand.export(tmp_path / "ckpt", tmp_path / "x", dtype="fp8")
    with pytest.raises(ValueError, match="max_shard_size"):
        stagehand.export(tmp_path / "ckpt", tmp_path / "x", max_shard_size="lots")
    before = files_of(tmp_path / "hf")
    with pytest.raises(stagehand.Error, match="hf"):
        stagehand.export(tmp_path / "ckpt", tmp_path / "hf")
    assert files_of(tmp_path / "hf") == before
    # python -m stagehand export.
    run = subprocess.run([sys.executable, "-m", "stagehand", "export", str(tmp_path / "ckpt"), str(tmp_path / "cli"),
                          "--what", "all"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "exported 3 tensors" in run.stdout
    assert set(safetensors_numpy.load_file(tmp_path / "cli" / "model.safetensors")) == {"model.w", "model.b",
                                                                                        "optim.m"}
    again = subprocess.run([sys.executable, "-m", "stagehand", "export", str(tmp_path / "ckpt"), str(tmp_path / "cli")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "cli" in again.stderr


def test_a_state_given_at_construction_is_prepared_in_the_background(tmp_path):
    state = {"w": np.arange(1 << 20, dtype=np.float32), "opt": {"lr": 0.5}}
    with stagehand.Checkpointer(tmp_path, thread_count=2, state=state) as ckpt:
        # The background prepare started the Checkpointer: prepare is no longer the first call.
        with pytest.raises(stagehand.Error, match="prepare must be the first call"):
            ckpt.prepare(state)
        ckpt.async_save(1, state).wait()
        state["w"] += 1
        ckpt.async_save(2, state).wait()
    loaded = {"w": np.zeros(1 << 20, np.float32), "opt": {"lr": 0.0}}
    with stagehand.Checkpointer(tmp_path) as ckpt:
        ckpt.load(loaded)
    assert np.array_equal(loaded["w"], np.arange(1 << 20, dtype=np.float32) + 1) and loaded["opt"] == {"lr": 0.5}


def test_a_state_at_construction_of_another_structure_than_the_saves_is_refused_by_name(tmp_path):
    with stagehand.Checkpointer(tmp_path, state={"w": np.zeros(8, np.float32)}) as ckpt:
        with pytest.raises(stagehand.Error, match="other tensors or shapes than at this Checkpointer's first call"):
            ckpt.save(1, {"w": np.zeros(16, np.float32)})


def test_prepare_as_the_first_call_then_async_saves_and_a_late_prepare_is_refused(tmp_path):
    state = {"w": np.arange(1 << 20, dtype=np.float32), "opt": {"lr": 0.5}}
    with stagehand.Checkpointer(tmp_path, thread_count=2) as ckpt:
        ckpt.prepare(state)
        ckpt.async_save(1, state).wait()
        with pytest.raises(stagehand.Error, match="prepare must be the first call"):
            ckpt.prepare(state)
    loaded = {"w": np.zeros(1 << 20, np.float32), "opt": {"lr": 0.0}}
    with stagehand.Checkpointer(tmp_path) as ckpt:
        ckpt.load(loaded)
    assert np.array_equal(loaded["w"], state["w"]) and loaded["opt"] == {"lr": 0.5}


def test_a_refused_prepare_keeps_the_arrays_a_pending_save_still_stages_from(tmp_path):
    # staging_buckets=1: the save stages the rest of the state from the arrays after it returns;
    # the caller drops them (which is safe), and a refused prepare must not drop the
    # Checkpointer's own reference to them.
    expected = [np.full(4 << 20, i, np.float32) for i in range(8)]
    with stagehand.Checkpointer(tmp_path, thread_count=8, staging_buckets=1) as ckpt:
        state = {f"t{i}": expected[i].copy() for i in range(8)}
        pending = ckpt.async_save(1, state)
        del state
        with pytest.raises(stagehand.Error, match="prepare must be the first call"):
            ckpt.prepare({f"t{i}": np.zeros(4 << 20, np.float32) for i in range(8)})
        pending.wait()
    loaded = {f"t{i}": np.zeros(4 << 20, np.float32) for i in range(8)}
    with stagehand.Checkpointer(tmp_path) as ckpt:
        ckpt.load(loaded)
    assert all(np.array_equal(loaded[f"t{i}"], expected[i]) for i in range(8))


def test_a_refused_step_keeps_the_arrays_a_pending_save_still_stages_from(tmp_path):
    # A call refused for its step (a float: step / k) must not drop the arrays the pending
    # async save still stages from (staging_buckets=1); before, it swapped them out first.
    import weakref

    expected = [np.full(4 << 20, i, np.float32) for i in range(8)]
    with stagehand.Checkpointer(tmp_path, thread_count=8, staging_buckets=1, write_rate_limit_mib_s=64) as ckpt:
        state = {f"t{i}": expected[i].copy() for i in range(8)}
        alive = [weakref.ref(a) for a in state.values()]
        pending = ckpt.async_save(1, state)
        del state
        with pytest.raises(TypeError, match="step must be an integer"):
            ckpt.save(2.0, {f"t{i}": np.zeros(4 << 20, np.float32) for i in range(8)})
        with pytest.raises(TypeError, match="step must be an integer"):
            ckpt.async_save(2.5, {f"t{i}": np.zeros(4 << 20, np.float32) for i in range(8)})
        assert all(ref() is not None for ref in alive)
        pending.wait()
    loaded = {f"t{i}": np.zeros(4 << 20, np.float32) for i in range(8)}
    load_from(tmp_path, loaded)
    assert all(np.array_equal(loaded[f"t{i}"], expected[i]) for i in range(8))


IN_A_HANDLER = """
import os, signal, sys, threading
import numpy as np
import stagehand
# 64 MiB at 32 MiB/s, staging 1 bucket of 2 before the return: fence() waits about 2 s, and a
# preemption handler closes the Checkpointer from inside that wait.
state = {f"w{i}": np.full(2 << 20, i, np.float32) for i in range(8)}
ckpt = stagehand.Checkpointer(sys.argv[1], write_rate_limit_mib_s=32, staging_buckets=1)
def on_signal(*_):
    ckpt.close()
    print("closed in the handler", flush=True)
signal.signal(signal.SIGUSR1, on_signal)
ckpt.async_save(1, state)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
try:
    ckpt.fence()
except stagehand.Error as e:
    print("fence:", e, flush=True)
print("after the fence", flush=True)
"""


def test_a_signal_handler_may_close_the_checkpointer_while_a_call_waits(tmp_path):
    # The Python lock is re-entrant: a handler that runs inside fence()'s wait (or as any call
    # returns) and closes or saves does not wait on a lock its own thread holds (it hung).
    child = subprocess.run([sys.executable, "-c", IN_A_HANDLER, tmp_path], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr
    assert "closed in the handler" in child.stdout and "after the fence" in child.stdout, child.stdout
    assert (tmp_path / "latest_ckpt_global_step.txt").read_text().strip() == "1"
    loaded = load_from(tmp_path, {f"w{i}": np.zeros(2 << 20, np.float32) for i in range(8)})
    assert all(np.all(loaded[f"w{i}"] == i) for i in range(8))


FAKE_CUDA = """
import ctypes, sys
import numpy as np
import stagehand

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]

class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype = ctypes.py_object
new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

class FakeCuda:
    # Four floats that say they lie on CUDA device 0 (they are host memory): what a torch.cuda
    # tensor looks like to a process that uses no GPU.
    def __init__(self):
        self.host = np.arange(4, dtype=np.float32)
        self.shape = (ctypes.c_int64 * 1)(4)
        self.name = b"dltensor"
        self.managed = []
    def __dlpack_device__(self):
        return (2, 0)
    def __dlpack__(self, **kwargs):
        m = DLManagedTensor()
        m.dl_tensor.data = self.host.ctypes.data
        m.dl_tensor.device = DLDevice(2, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = DLDataType(2, 32, 1)
        m.dl_tensor.shape = self.shape
        self.managed.append(m)
        return new_capsule(ctypes.addressof(m), self.name, None)

with stagehand.Checkpointer(sys.argv[1]) as ckpt:
    try:
        ckpt.save(1, {"w": FakeCuda()})
        print("saved")
    except stagehand.Error as e:
        print("refused:", e)
"""


@pytest.mark.parametrize("simulated", ["0", "1"])
def test_cuda_tensors_in_a_process_that_uses_no_gpu_are_refused_naming_them(tmp_path, simulated):
    # Without a GPU the host copy engine would read the device pointer as host memory (a crash,
    # or wrong bytes); STAGEHAND_FORCE_HOST=1 makes this process use none wherever it runs, the
    # simulated device too (issue 58).
    env = {**os.environ, "STAGEHAND_FORCE_HOST": "1", "STAGEHAND_SIMULATED_GPU": simulated}
    child = subprocess.run([sys.executable, "-c", FAKE_CUDA, tmp_path], capture_output=True, text=True, env=env,
                           timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("refused: ") and "tensor 'w' is on CUDA device 0, but this process uses 0 GPU(s)" \
        in child.stdout and "STAGEHAND_FORCE_HOST" in child.stdout, child.stdout
    assert not (tmp_path / "global_step_1").exists()


def test_integer_keys_save_as_their_digits_and_load_back_in_place(tmp_path):
    # The shape of a torch optimizer's state_dict(): per-parameter state keyed by index.
    def optimizer_state(value):
        return {"state": {0: {"exp_avg": np.full(5, value, np.float32), "step": int(value)},
                          1: {"exp_avg": np.full(3, -value, np.float32), "step": int(value)}},
                "param_groups": [{"params": [0, 1], "lr": 0.1 * value}]}

    save_in(tmp_path, 1, {"optim": optimizer_state(4)})
    assert set(stagehand.inspect(tmp_path)["tensors"]) == {"optim.state.0.exp_avg", "optim.state.1.exp_avg"}
    target = {"optim": optimizer_state(0)}
    load_from(tmp_path, target)
    assert np.array_equal(target["optim"]["state"][0]["exp_avg"], np.full(5, 4, np.float32))
    assert np.array_equal(target["optim"]["state"][1]["exp_avg"], np.full(3, -4, np.float32))
    assert target["optim"]["state"][0]["step"] == 4 and set(target["optim"]["state"]) == {0, 1}
    assert target["optim"]["param_groups"] == [{"params": [0, 1], "lr": 0.4}]
    with stagehand.Checkpointer(tmp_path / "other") as ckpt:
        with pytest.raises(ValueError, match="both named 's.0'"):
            ckpt.save(1, {"s": {0: np.zeros(2, np.float32), "0": np.zeros(2, np.float32)}})
        with pytest.raises(TypeError, match="state key True under 's.' is neither a string nor an integer"):
            ckpt.save(1, {"s": {True: np.zeros(2, np.float32)}})


@pytest.mark.skipif(torch is None, reason="torch is not installed for this Python (CI installs numpy only; "
                                          "the integer-key test covers the same layout)")
def test_a_torch_optimizer_state_dict_round_trips(tmp_path):
    torch.manual_seed(0)

    def trained(steps):
        model = torch.nn.Linear(8, 4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(steps):
            model(torch.randn(16, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return model, optimizer

    model, optimizer = trained(3)
    save_in(tmp_path, 3, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    other_model, other_optimizer = trained(1)
    state = {"model": other_model.state_dict(), "optim": other_optimizer.state_dict()}
    load_from(tmp_path, state)
    other_model.load_state_dict(state["model"])
    other_optimizer.load_state_dict(state["optim"])
    for a, b in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(a, b)
    saved, loaded = optimizer.state_dict(), other_optimizer.state_dict()
    for index, per_param in saved["state"].items():
        for key, value in per_param.items():
            assert torch.equal(loaded["state"][index][key], value), (index, key)
    assert loaded["param_groups"][0]["lr"] == saved["param_groups"][0]["lr"]
