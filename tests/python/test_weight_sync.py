"""stagehand.WeightPublisher / WeightReceiver: weights from trainer ranks to receivers in another
layout over shared memory and over TCP, bit-exact, from numpy and torch tensors, across processes."""

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import stagehand

ROWS, COLS = 64, 48


def full(step):
    """The whole model at `step`: every value depends on the step and the element."""
    w = (np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + step * 10000).astype(np.float32)
    b = (np.arange(COLS, dtype=np.float32) - step).astype(np.float32)
    return {"w": w, "b": b}


def trainer_state(rank, tp, step):
    """Trainer rank `rank` of tensor-parallel `tp`: rows of w split, b whole (a replica on ranks > 0)."""
    model = full(step)
    rows = ROWS // tp
    return {
        "layer": {
            "w": stagehand.Shard(np.ascontiguousarray(model["w"][rank * rows:(rank + 1) * rows]), [ROWS, COLS],
                                 [rank * rows, 0]),
            "b": stagehand.Shard(model["b"].copy(), [COLS], [0], replica_id=0 if rank == 0 else 1),
        }
    }


def channel(what, transport="shm"):
    """A channel of `transport`: a shared-memory name, or TCP on a free port of 127.0.0.1."""
    if transport == "tcp":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"tcp://127.0.0.1:{s.getsockname()[1]}"
    return f"pytest-{what}-{os.getpid()}"


TRANSPORTS = pytest.mark.parametrize("transport", ["shm", "tcp"])


def serve(name, tp, steps, done, errors, waiting=None):
    """Trainer ranks in threads: rank r pushes every step once `waiting[r]` receivers wait (default
    1 each; a rank that sends a receiver nothing does not serve it)."""
    waiting = waiting or [1] * tp
    def rank_main(rank):
        try:
            with stagehand.WeightPublisher(name, trainer_state(rank, tp, 0), rank=rank, world_size=tp,
                                           bucket_bytes=4096) as pub:
                for step in steps:
                    deadline = time.monotonic() + 30
                    while pub.waiting_receivers < waiting[rank]:
                        assert time.monotonic() < deadline, "no receiver came"
                        time.sleep(0.001)
                    report = pub.push(step, trainer_state(rank, tp, step))
                    assert report["dropped"] == [], report
                    assert len(report["delivered"]) == waiting[rank], report
                done.wait(30)
        except BaseException as e:  # reported by the test
            errors.append(e)
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    return threads


@contextlib.contextmanager
def serving(name, tp, steps, waiting=None):
    """serve() for the block's length; the publishers' errors are checked after it."""
    done, errors = threading.Event(), []
    threads = serve(name, tp, steps, done, errors, waiting)
    try:
        yield
    finally:
        done.set()
        for t in threads:
            t.join()
    assert errors == []


@TRANSPORTS
def test_numpy_receiver_in_its_own_layout_gets_each_version_bit_exact(transport):
    name = channel("numpy", transport)
    with serving(name, 2, [3, 4]):
        # The receiver's layout: w split by columns into 2, this receiver holding the second half.
        state = {"layer": {"w": stagehand.Shard(np.zeros((ROWS, COLS // 2), np.float32), [ROWS, COLS],
                                                [0, COLS // 2]),
                           "b": np.zeros(COLS, np.float32)}}
        rx = stagehand.WeightReceiver(name, state, name="gen-0")
        for step in (3, 4):
            assert rx.receive(state, min_step=step, timeout=30) == step
            np.testing.assert_array_equal(state["layer"]["w"].tensor, full(step)["w"][:, COLS // 2:])
            np.testing.assert_array_equal(state["layer"]["b"], full(step)["b"])
        assert rx.newest_pushed_step >= 3
        rx.close()


@TRANSPORTS
def test_weights_returns_name_tensor_pairs_in_the_receivers_layout(transport):
    name = channel("pairs", transport)
    with serving(name, 2, [7]):
        template = {"layer.w": np.zeros((ROWS, COLS), np.float32), "layer.b": np.zeros(COLS, np.float32)}
        rx = stagehand.WeightReceiver(name, template)
        step, pairs = rx.weights(timeout=30)
        assert step == 7
        got = dict(pairs)
        assert sorted(got) == ["layer.b", "layer.w"]
        np.testing.assert_array_equal(got["layer.w"], full(7)["w"])
        np.testing.assert_array_equal(got["layer.b"], full(7)["b"])
        assert not np.shares_memory(got["layer.w"], template["layer.w"])  # its own arrays


@TRANSPORTS
def test_a_torch_receiver_in_another_process_gets_the_weights(transport):
    torch = pytest.importorskip("torch")
    name = channel("torch", transport)
    child = f"""
import sys, numpy as np, torch, stagehand
state = {{"layer": {{"w": stagehand.Shard(torch.zeros({ROWS // 4}, {COLS}), [{ROWS}, {COLS}], [{ROWS // 4}, 0]),
                     "b": torch.zeros({COLS})}}}}
rx = stagehand.WeightReceiver({name!r}, state, name="torch-gen")
print(rx.receive(state, min_step=2, timeout=30))
np.save(sys.argv[1], state["layer"]["w"].tensor.numpy())
"""
    # Rows 16-31 of w lie on rank 0, which also sends b: rank 1 sends this receiver nothing.
    with serving(name, 2, [2], waiting=[1, 0]):
        out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"torch-rx-{os.getpid()}-{transport}.npy")
        proc = subprocess.run([sys.executable, "-c", child, out], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "2"
        np.testing.assert_array_equal(np.load(out), full(2)["w"][ROWS // 4:ROWS // 2])
        os.remove(out)
    del torch


DEVICE_WORKER = """
import json, sys, threading
import numpy as np
import stagehand
from stagehand import _stagehand as native

channel, tp = sys.argv[1], 2
full = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) * 0.5


def dev(a):  # a CUDA DLPack array filled through the copy engine, as torch.cuda tensors arrive
    d = native._device_empty(list(a.shape), "F32")
    native._device_copy(d, np.ascontiguousarray(a).view(np.uint32))
    return d


def host(d, shape):
    h = np.empty(shape, np.float32)
    native._device_copy(h.view(np.uint32), d)
    return h


before = native._copy_engine()
# Trainer tensor 2 (rows) in device memory; one receiver in device memory, in columns of 2 halves.
senders = [{"w": stagehand.Shard(dev(full[r * 32:(r + 1) * 32]), [64, 48], [r * 32, 0])} for r in range(tp)]
halves = [{"w": stagehand.Shard(dev(np.zeros((64, 24), np.float32)), [64, 48], [0, c * 24])} for c in range(2)]
reports = [None] * tp


def publish(r):
    with stagehand.WeightPublisher(channel, senders[r], rank=r, world_size=tp, bucket_bytes=512) as pub:
        reports[r] = pub.push(5, senders[r], wait_for=2)  # waits at most its receiver timeout


threads = [threading.Thread(target=publish, args=(r,)) for r in range(tp)]
for t in threads:
    t.start()
got = [None, None]


def receive(c):
    with stagehand.WeightReceiver(channel, halves[c], name=f"half-{c}", connect_timeout=30) as rx:
        got[c] = rx.receive(halves[c], min_step=5, timeout=30)


receivers = [threading.Thread(target=receive, args=(c,)) for c in range(2)]
for t in receivers:
    t.start()
for t in receivers + threads:
    t.join()
after = native._copy_engine()
exact = all(np.array_equal(host(halves[c]["w"].tensor, (64, 24)), full[:, c * 24:(c + 1) * 24]) for c in range(2))
print(json.dumps({"engine": after["name"], "misuse": after["misuse"], "got": got, "exact": exact,
                  "delivered": [sorted(r["delivered"]) for r in reports],
                  "d2h": after["device_to_host_bytes"] - before["device_to_host_bytes"],
                  "h2d": after["host_to_device_bytes"] - before["host_to_device_bytes"]}))
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_cuda_arrays_on_both_sides_go_through_the_simulated_device(transport):
    """DLPack arrays of device type CUDA (as torch.cuda tensors arrive) on the publishers and the
    receivers, on the simulated device: the bytes leave and enter device memory through the copy
    engine, bit-exact, with no misuse. Not yet run on a GPU."""
    import json
    env = {**os.environ, "STAGEHAND_SIMULATED_GPU": "1"}
    env.pop("STAGEHAND_FORCE_HOST", None)
    child = subprocess.run([sys.executable, "-c", DEVICE_WORKER, channel("device", transport)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["engine"] == "simulated" and found["misuse"] == 0, found
    assert found["got"] == [5, 5] and found["exact"], found
    assert found["delivered"] == [["half-0", "half-1"]] * 2, found
    model = 64 * 48 * 4
    # Counted: the test filling the senders and the receivers (2 models in), and the channel,
    # which moved every byte out of the senders and into the receivers through the engine.
    assert found["d2h"] >= model and found["h2d"] >= 2 * model + model, found


def test_bad_input_is_refused_by_name():
    with pytest.raises(stagehand.Error, match="channel name 'a b'"):
        stagehand.WeightPublisher("a b", {"w": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match="receiver_timeout must be a number of seconds"):
        stagehand.WeightPublisher("x", {"w": np.zeros(4, np.float32)}, receiver_timeout=0)
    name = channel("bad")
    with stagehand.WeightPublisher(name, {"w": np.zeros(4, np.float32)}) as pub:
        with pytest.raises(stagehand.Error, match="tensor 'v' is held by no trainer rank"):
            stagehand.WeightReceiver(name, {"v": np.zeros(4, np.float32)})
        rx = stagehand.WeightReceiver(name, {"w": np.zeros(4, np.float32)})
        with pytest.raises(stagehand.Error, match="waited in vain for a version of trainer rank 0"):
            rx.receive({"w": np.zeros(4, np.float32)}, timeout=0.05)
        with pytest.raises(stagehand.Error, match="other tensors or shapes"):
            pub.push(1, {"w": np.zeros(5, np.float32)})


BIN = pathlib.Path(os.environ.get("STAGEHAND_BIN_DIR", "build/bin"))
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "configs"


def _policy(D, K, H):
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    return {"model": {"fc1": {"weight": np.zeros((H, D), bf16), "bias": np.zeros(H, bf16)},
                      "fc2": {"weight": np.zeros((K, H), bf16), "bias": np.zeros(K, bf16)}}}


def _train_cmd(sets):
    cmd = [BIN / "stagehand-train", "--quiet", "--config", CONFIGS / "sync_rl.yaml"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def _same_bits(a_state, b_state):
    for layer in ("fc1", "fc2"):
        for part in ("weight", "bias"):
            a, b = a_state["model"][layer][part], b_state["model"][layer][part]
            assert a.view(np.uint16).tobytes() == b.view(np.uint16).tobytes(), (layer, part)


def test_a_receiver_joining_between_pushes_gets_the_newest_version_at_once(tmp_path):
    """stagehand-train (sync RL, tensor 2 x data 2, no receiver awaited) hangs in its save of step 4,
    which comes after the push of step 4: a receiver that joins then gets step 4 at once (each
    Worker serves late receivers until its next optimizer step), bit-exact what a run of 4 steps
    saves, though no later push comes."""
    name = channel("late")
    D, K, H = 16, 8, 128
    common = {"model.context_dim": D, "model.num_arms": K, "model.hidden": H, "trainer.ckpt_interval": 4,
              "megatron_config.async_dist_ckpt_save": "false"}
    hung = tmp_path / "hung"
    env = dict(os.environ, STAGEHAND_TEST_HANG_FILES_UNDER=str(hung / "global_step_4"))
    proc = subprocess.Popen(_train_cmd({**common, "trainer.ckpt_path": hung, "trainer.total_steps": 12,
                                        "weight_sync.channel": name}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        state = _policy(D, K, H)
        with stagehand.WeightReceiver(name, state, name="late", connect_timeout=60) as rx:
            deadline = time.monotonic() + 60
            while rx.newest_pushed_step < 4:
                assert proc.poll() is None and time.monotonic() < deadline, "the run never pushed step 4"
                time.sleep(0.02)
            got = rx.receive(state, min_step=0, timeout=20)
            assert rx.newest_pushed_step == 4
        assert proc.poll() is None  # still in the save of step 4: no later push served the receiver
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=60)
    assert got == 4, out
    done = tmp_path / "done"
    run = subprocess.run(_train_cmd({**common, "trainer.ckpt_path": done, "trainer.total_steps": 4}),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert run.returncode == 0, run.stdout
    saved = _policy(D, K, H)
    with stagehand.Checkpointer(str(tmp_path / "load-root"), rank=0, world_size=1) as ckpt:
        ckpt.load(saved, str(done / "global_step_4"))
    _same_bits(state, saved)
    assert np.any(state["model"]["fc1"]["weight"].view(np.uint16) != 0)


def test_a_sync_training_run_pushes_every_step_to_a_receiver_outside_it_bit_exact(tmp_path):
    """stagehand-train (sync RL, tensor 2 x data 2) with weight_sync.channel and receivers 1: each
    push waits for this receiver, so it gets every step's weights, and the last equal the last
    checkpoint's."""
    name = channel("train")
    steps, D, K, H = 12, 16, 8, 128
    sets = {"trainer.ckpt_path": tmp_path / "ckpt", "trainer.total_steps": steps, "model.context_dim": D,
            "model.num_arms": K, "model.hidden": H, "weight_sync.channel": name, "weight_sync.receivers": 1,
            "weight_sync.receiver_timeout_s": 60}
    proc = subprocess.Popen(_train_cmd(sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        state = _policy(D, K, H)
        got = []
        with stagehand.WeightReceiver(name, state, name="rollout", connect_timeout=60) as rx:
            while not got or got[-1] < steps:
                got.append(rx.receive(state, min_step=got[-1] + 1 if got else 0, timeout=60))
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert got == list(range(steps + 1))  # the weights before the first step, then after each
    saved = _policy(D, K, H)
    with stagehand.Checkpointer(str(tmp_path / "load-root"), rank=0, world_size=1) as ckpt:
        ckpt.load(saved, str(tmp_path / "ckpt" / f"global_step_{steps}"))
    _same_bits(state, saved)
    assert np.any(state["model"]["fc1"]["weight"].view(np.uint16) != 0)
