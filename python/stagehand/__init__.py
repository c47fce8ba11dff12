"""Stagehand's checkpoints for Python: save, async save and load of a rank's state dict, collectively
with every process of the job (one process per rank, as torchrun starts them).

    import numpy as np, stagehand

    state = {"model": {"w": np.ones((1024, 1024), np.float32)}, "step": 10}
    with stagehand.Checkpointer("/tmp/ckpt") as ckpt:
        ckpt.save(10, state)                      # committed on every rank when it returns
        pending = ckpt.async_save(20, state)      # returns once the tensors are copied
        pending.wait()                            # optional: the next call waits anyway
        ckpt.load(state)                          # in place, from the step the tracker names

A state is a dict, nested as deep as you like, of tensors and small objects. Tensors are numpy
arrays (bf16 and fp8 through ml_dtypes) or anything with ``__dlpack__`` (torch tensors), saved
where they are, without a copy; a ``Shard`` says where a rank's block lies in a global tensor, and
a torch ``DTensor`` (Shard and Replicate placements) says it itself.
Everything else (ints, floats, strings, lists, dicts of those) is saved as JSON and comes back
from ``load``. Nested keys are joined with ".": ``{"model": {"w": ...}}`` saves tensor "model.w",
as ``{"model.w": ...}`` (a torch ``state_dict()``) does; integer keys (a torch optimizer's
``state_dict()``) as their digits.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import threading
from typing import Any, Iterator

import numpy as np

from ._stagehand import Error, PendingSave, _Tensors
from ._stagehand import export as _export
from ._stagehand import inspect as _inspect
from ._stagehand import verify as _verify
from ._stagehand import Checkpointer as _Checkpointer
from ._stagehand import _WeightPublisher, _WeightReceiver

__all__ = ["Checkpointer", "PendingSave", "Shard", "Error", "WeightPublisher", "WeightReceiver", "export", "inspect",
           "verify"]


def verify(path, *, progress: str = "never") -> dict:
    """Checks a checkpoint as ``stagehand-ckpt verify`` does: the metadata and headers as a load
    reads them, every file's and chunk's checksum. ``path`` is a root (the step its tracker names)
    or one global_step_N folder. Returns ``{"checkpoint", "ok", "problems", "files_checked",
    "chunks_checked", "bytes_checked"}``; raises ``stagehand.Error`` when it cannot be checked.
    ``progress``: a progress line on stderr as ``stagehand-ckpt --progress`` draws it: "auto" (on
    a terminal, once it has run a second), "always" or "never"."""
    return _verify(os.fspath(path), progress)


def inspect(path) -> dict:
    """What ``stagehand-ckpt inspect`` lists, as data: ``{"checkpoint", "step", "tensors",
    "files", "objects", "trainer_state"}``. ``tensors`` maps each saved tensor's name to
    ``{"dtype", "global_shape", "bytes", "chunks"}`` (each chunk: ``offsets``, ``shape``,
    ``file``, ``bytes``, ``xxh3``); ``files`` maps each data file to ``{"size", "xxh3"}``;
    ``objects`` holds the saved objects' JSON text; ``trainer_state`` the text of
    trainer_state.json, or None. ``path`` is a root (the step its tracker names) or one
    global_step_N folder; the metadata is read and checked as a load reads it (its checksum, its
    fields), the data files are not read. Raises ``stagehand.Error`` when it cannot be read."""
    return _inspect(os.fspath(path))


def export(checkpoint, out, *, what: str = "model", dtype: str | None = None, max_shard_size="5GiB",
           threads: int = 4, progress: str = "never") -> dict:
    """Writes the checkpoint's tensors as consolidated full tensors with their plain names, in the
    Hugging Face layout (``model.safetensors``, or numbered shards and
    ``model.safetensors.index.json``), as ``stagehand-ckpt export`` does, verifying every chunk it
    reads. ``what``: "model" (tensors named model.*) or "all"; ``dtype``: None (as saved),
    "bf16" or "fp32" (floating point tensors converted); ``max_shard_size``: bytes, or text such
    as "5GB" or "2GiB". ``out`` must not exist or be empty; it appears whole or not at all.
    ``progress``: a progress line on stderr, as for ``verify``. Returns ``{"tensors", "bytes",
    "files", "largest_tensor_bytes", "buffer_peak_bytes", "total_s"}``."""
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, (int, str)):
        raise TypeError(f"max_shard_size: {max_shard_size!r} is neither a byte count nor a size text")
    return _export(os.fspath(checkpoint), os.fspath(out), what, "as-saved" if dtype is None else dtype,
                   str(max_shard_size), threads, progress)


class Shard:
    """A rank's block of a global tensor: ``tensor`` lies at ``offsets`` in a tensor of
    ``global_shape``. Blocks of all ranks must tile the global tensor; a block held by several ranks
    (data-parallel copies) is saved once: mark every copy but one with ``replica_id`` > 0."""

    __slots__ = ("tensor", "global_shape", "offsets", "replica_id")

    def __init__(self, tensor: Any, global_shape, offsets, replica_id: int = 0):
        self.tensor = tensor
        self.global_shape = [int(d) for d in global_shape]
        self.offsets = [int(o) for o in offsets]
        self.replica_id = int(replica_id)
        if len(self.global_shape) != len(self.offsets):
            raise ValueError(
                f"Shard: global_shape {self.global_shape} and offsets {self.offsets} differ in rank"
            )
        ndim = getattr(tensor, "ndim", None)
        if ndim is not None and ndim != len(self.global_shape):
            raise ValueError(f"Shard: a {ndim}-d tensor cannot be a block of a global shape "
                             f"{self.global_shape}")

    def __repr__(self) -> str:
        return (
            f"Shard(global_shape={self.global_shape}, offsets={self.offsets}, "
            f"replica_id={self.replica_id})"
        )


# Longest timeout a Checkpointer takes (CheckpointerOptions::timeout: 6 x it in nanoseconds must fit).
_MOST_TIMEOUT_S = 7 * 24 * 3600


def _step(step: Any) -> int:
    """A step number as an int: an integer (a float or a string is refused, not rounded)."""
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an integer, not {step!r}") from None


# numpy dtypes that cross as a same-size unsigned view, with the dtype Stagehand stores.
_VIEWED = {"bfloat16": ("uint16", "BF16"), "float8_e4m3fn": ("uint8", "F8_E4M3"),
           "float8_e5m2": ("uint8", "F8_E5M2"), "bool": ("uint8", "BOOL")}
# ... and those that cross as they are.
_DIRECT = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32",
           "uint16", "uint8"}


def _is_tensor(value: Any) -> bool:
    # numpy scalars (np.int64(3)) are objects: counters, not tensors.
    if isinstance(value, np.generic):
        return False
    return isinstance(value, (Shard, np.ndarray)) or hasattr(value, "__dlpack__")


# Torch dtypes by the name Stagehand stores them under (torch CPU tensors are taken by pointer).
_TORCH_STORED = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                 "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16",
                 "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def _to_array(name: str, value: Any, writable: bool):
    """The array handed to C++ (the value itself or a view of it), the dtype name to store, and
    whether it goes by pointer (a torch CPU tensor: no DLPack capsule or detached tensor is made
    for it, which with many tensors is most of a save's own memory)."""
    module = type(value).__module__
    if module.startswith("torch"):
        import torch

        if not value.is_contiguous():
            raise ValueError(f"tensor '{name}' is not contiguous: pass .contiguous()")
        stored = _TORCH_STORED.get(str(value.dtype).removeprefix("torch."))
        if stored is None:
            raise TypeError(f"tensor '{name}': dtype {value.dtype} is not one Stagehand saves")
        if value.device.type == "cpu":
            return value, stored, True
        # Through DLPack, which has no bool or float8: those cross as bytes, stored by name.
        if value.dtype in (torch.bool, torch.float8_e4m3fn, torch.float8_e5m2):
            return value.detach().view(torch.uint8), stored, False
        return value.detach(), stored, False
    if isinstance(value, np.ndarray):
        array = value
        if not array.flags.c_contiguous:
            raise ValueError(f"tensor '{name}' is not C-contiguous: pass np.ascontiguousarray(...)")
        if writable and not array.flags.writeable:
            raise ValueError(f"tensor '{name}' is read-only: load fills tensors in place")
        if not array.dtype.isnative:
            raise TypeError(f"tensor '{name}': its bytes are not in this machine's byte order: pass "
                            "array.astype(array.dtype.newbyteorder('='))")
        if array.dtype.name in _VIEWED:
            view, stored = _VIEWED[array.dtype.name]
            return array.view(view), stored, False
        if array.dtype.name not in _DIRECT:
            raise TypeError(f"tensor '{name}': dtype {array.dtype.name} is not one Stagehand saves")
        return array, "", False
    return value, "", False  # another __dlpack__ producer: its own dtype


def _is_dtensor(value: Any) -> bool:
    if "torch" not in sys.modules or not type(value).__module__.startswith("torch.distributed"):
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _dtensor_shard(name: str, value: Any) -> Shard:
    """A torch DTensor as the Shard it is: its local tensor at its offset in the global tensor;
    of the copies a Replicate placement makes, all but one are replicas."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as TorchShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh, placements = value.device_mesh, value.placements
    for p in placements:
        if not isinstance(p, (Replicate, TorchShard)):
            raise TypeError(f"tensor '{name}': a DTensor placed {p} cannot be saved as it is: "
                            "redistribute it to Shard or Replicate first")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"tensor '{name}': this rank is not in the DTensor's device mesh")
    _, offsets = compute_local_shape_and_global_offset(value.shape, mesh, placements)
    replica = 0
    for dim, p in enumerate(placements):
        if isinstance(p, Replicate):
            replica = replica * mesh.size(dim) + coordinate[dim]
    return Shard(value.to_local(), list(value.shape), list(offsets), replica)


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return _is_tensor(value)


def _flatten(state: dict, prefix: str = "", path: list | None = None) -> Iterator[tuple[str, Any, bool, list]]:
    """(name, value, is_tensor, keys) of every leaf: its keys joined with '.', the keys."""
    path = path or []
    if not isinstance(state, dict):
        raise TypeError(f"a state is a dict, not {type(state).__name__}")
    for key, value in state.items():
        # Integer keys too: a torch optimizer's state_dict() keys its per-parameter state by index
        # ({"state": {0: {"exp_avg": ...}}} saves tensor "state.0.exp_avg").
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise TypeError(f"state key {key!r} under '{prefix}' is neither a string nor an integer")
        name = prefix + str(key)
        if isinstance(value, dict) and _holds_tensor(value):
            yield from _flatten(value, name + ".", path + [key])
        else:
            yield name, value, _is_tensor(value), path + [key]


class _Bound:
    """What one call hands to C++: the entries and the arrays they point into (kept alive)."""

    def __init__(self, state: dict, writable: bool):
        self.entries = _Tensors()
        self.arrays = []
        self.objects: dict[str, str] = {}
        self.object_paths: dict[str, list[str]] = {}
        self.cuda_devices: set = set()
        add = self.entries.add_writable if writable else self.entries.add
        for name, value, is_tensor, keys in _flatten(state):
            if is_tensor:
                shard = value if isinstance(value, Shard) else _dtensor_shard(name, value) if _is_dtensor(value) else None
                array, dtype, by_pointer = _to_array(name, shard.tensor if shard else value, writable)
                self.arrays.append(array)
                if getattr(array, "is_cuda", False):
                    self.cuda_devices.add(array.device)
                placed = (shard.global_shape, shard.offsets, shard.replica_id) if shard else ([], [], 0)
                try:
                    if by_pointer:
                        self.entries.add_host(name, array.data_ptr(), array.shape, dtype, *placed)
                    else:
                        add(name, array, dtype, *placed)
                except TypeError as e:
                    raise TypeError(f"tensor '{name}' cannot be {'loaded' if writable else 'saved'}: {e}") from None
            else:
                if name in self.objects:
                    _refuse_twice(name)
                _check_object(name, value)
                try:
                    self.objects[name] = json.dumps(value, default=_plain)
                except TypeError as e:
                    raise TypeError(f"object '{name}' cannot be saved as JSON: {e}") from None
                self.object_paths[name] = keys
        twice = self.entries.first_duplicate(list(self.objects))
        if twice is not None:
            _refuse_twice(twice)
        # Stagehand copies device memory on streams of its own, which do not wait for torch's:
        # what torch has queued on each device the state uses, on any of its streams (the
        # optimizer step that wrote a tensor, for a save; a kernel still reading one, for a
        # load), finishes first. CUDA arrays of other libraries must be ready when passed.
        if self.cuda_devices:
            import torch

            for device in self.cuda_devices:
                torch.cuda.synchronize(device)


def _refuse_twice(name: str) -> None:
    raise ValueError(f"two entries of the state are both named '{name}' (nested keys are joined with '.')")


def _plain(value: Any):
    """numpy scalars inside objects become plain numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _check_object(name: str, value: Any) -> None:
    """Refuses what JSON would change or lose: tensors inside an object (a list of tensors, say),
    and keys that are not strings."""
    if _is_tensor(value):
        raise TypeError(f"object '{name}' holds a tensor: put tensors in dicts, not lists")
    if isinstance(value, dict):
        for key, v in value.items():
            if not isinstance(key, str):
                raise TypeError(f"object '{name}' has key {key!r}: JSON keys are strings")
            _check_object(name, v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_object(name, v)


class Checkpointer:
    """Saves and loads this rank's state collectively with every process of the job.

    ``rank`` and ``world_size`` default to the launch variables (RANK, WORLD_SIZE, MASTER_ADDR,
    and Stagehand's own STAGEHAND_PORT, as scripts/launch-local.sh sets them; without WORLD_SIZE,
    one process). Every rank calls save, async_save, load and finalize with the same step, and
    every rank gets the same outcome: committed, or a ``stagehand.Error`` naming what failed.
    The GIL is released for the whole of every save, load and wait. Ctrl-C in
    ``PendingSave.wait()``, ``PendingSave.wait_staged()`` or ``fence()`` raises
    KeyboardInterrupt at once and leaves the save running: the next
    call, ``close()`` or the end of a ``with`` block finishes it, so the checkpoint is committed
    whole or not at all. In save, load, finalize and close, Ctrl-C takes effect when the call
    returns. ``write_rate_limit_mib_s`` paces this process's checkpoint writes (0: unlimited).
    ``max_to_keep`` > 0 removes the oldest committed steps beyond that many once a save commits;
    with ``reuse_files`` (the default) and a local root, the next saves write over their data
    files (kept in ``<root>/.spare_files`` until ``close()``) instead of creating new ones.
    ``uncached_writes`` (the default) writes new data files around the page cache (O_DIRECT)
    where the file system takes it; ``False`` writes them through the page cache.
    ``state``: the state the saves will take, known at construction; the Checkpointer then starts
    and reserves (and touches) the memory an async save copies into on a thread of its own while
    the constructor returns, so that the first ``async_save`` blocks for its copy alone, as later
    ones do (collective when the job spans processes: give it on every rank or on none).

    One Checkpointer serves one structure of state (the same tensor names and shapes each call).
    The arrays of the last call are kept referenced until the next call or ``close()``.
    """

    def __init__(self, root: str, *, rank: int | None = None, world_size: int | None = None,
                 master_addr: str | None = None, port: int | None = None, thread_count: int = 2,
                 load_thread_count: int = 4, staging_buckets: int = 0, timeout: float = 600.0,
                 join_timeout: float = 60.0, local_work_dir: str | None = None,
                 write_rate_limit_mib_s: float = 0.0, max_to_keep: int = 0, reuse_files: bool = True,
                 uncached_writes: bool = True, state: dict | None = None):
        self.root = os.fspath(root)
        if (rank is None) != (world_size is None):
            raise ValueError("Checkpointer: pass both rank and world_size, or neither (then RANK and WORLD_SIZE)")
        if rank is not None:
            # The rest of the launch still comes from the environment when not given.
            master_addr = master_addr or os.environ.get("MASTER_ADDR")
            if port is None and os.environ.get("STAGEHAND_PORT"):
                try:
                    port = int(os.environ["STAGEHAND_PORT"])
                except ValueError:
                    raise ValueError(f"Checkpointer: STAGEHAND_PORT={os.environ['STAGEHAND_PORT']!r} is not a port "
                                     "number") from None
        for label, seconds in (("timeout", timeout), ("join_timeout", join_timeout)):
            if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                    or not 0.001 <= seconds <= _MOST_TIMEOUT_S):
                raise ValueError(f"Checkpointer: {label} must be a number of seconds from 0.001 to "
                                 f"{_MOST_TIMEOUT_S} (7 days), not {seconds!r}")
        # Re-entrant: a signal handler (a preemption handler that saves or closes) runs in this
        # thread while a call holds the lock (fence() polls for signals; any call runs them as it
        # returns), and must not wait on it for ever. The C++ Checkpointer's own lock is not held
        # then.
        self._lock = threading.RLock()
        self._impl = _Checkpointer(
            self.root, rank=rank, world_size=world_size, master_addr=master_addr, port=port,
            thread_count=thread_count, load_thread_count=load_thread_count,
            staging_buckets=staging_buckets, timeout_s=timeout, join_timeout_s=join_timeout,
            local_work_dir=local_work_dir, write_rate_limit_mib_s=float(write_rate_limit_mib_s),
            max_to_keep=int(max_to_keep), reuse_files=bool(reuse_files),
            uncached_writes=bool(uncached_writes))
        self._bound: _Bound | None = None
        # The arrays of calls that failed: a failed call may leave an earlier save still reading
        # them (a finalize that timed out); they stay referenced until a call succeeds (saves run
        # one after the other, so none reads them then) or close().
        self._held: list[_Bound] = []
        if state is not None:
            # prepare(state) on a thread of the C++ Checkpointer's own: the constructor returns at
            # once; the first call waits for it (and raises its error, if it failed).
            bound = _Bound(state, writable=False)
            self._impl.prepare_in_background(bound.entries, bound.objects)
            self._bound = bound

    def _call(self, bound: _Bound, call):
        """Runs `call` with `bound` as the arrays of this call, keeping the previous call's
        arrays referenced through it (it first finishes a pending async save, which may still
        be staging from them), and, if it fails, until a later call succeeds."""
        previous, self._bound = self._bound, bound
        try:
            result = call()
        except BaseException:
            if previous is not None:
                self._held.append(previous)
            raise
        self._held.clear()
        del previous
        return result

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._impl.rank

    @property
    def world_size(self) -> int:
        """Ranks of the whole job."""
        return self._impl.world_size

    def prepare(self, state: dict, *, async_saves: bool = True) -> None:
        """Optional, as the first call (collective, as ``save``): starts the Checkpointer for
        ``state``'s structure now and, with ``async_saves``, reserves and touches the host memory
        an async save of it copies into, so that the first ``async_save`` blocks for its copy only
        instead of also allocating that memory (on a virtual machine up to seconds per GiB).
        Raises ``stagehand.Error`` after a call that started the Checkpointer (a save, async save,
        load or prepare)."""
        bound = _Bound(state, writable=False)
        with self._lock:
            # Refused after a call that started the Checkpointer, without finishing its save:
            # the arrays of that call stay referenced until the prepare has succeeded.
            self._impl.prepare(bound.entries, bound.objects, bool(async_saves))
            self._bound = bound

    def save(self, step: int, state: dict) -> None:
        """Saves ``step`` and returns once it is committed on every rank (no copy of host tensors)."""
        step = _step(step)
        bound = _Bound(state, writable=False)
        with self._lock:
            self._call(bound, lambda: self._impl.save(step, bound.entries, bound.objects))

    def async_save(self, step: int, state: dict) -> PendingSave:
        """Saves ``step`` in the background; returns once the tensors are copied (with
        ``staging_buckets`` > 0: the first buckets; ``PendingSave.staged()`` says when the tensors
        may change). The next save, load, finalize or close finishes it; if it failed, that call
        raises its error (naming its step) without doing its own work."""
        step = _step(step)
        bound = _Bound(state, writable=False)
        with self._lock:
            return self._call(bound, lambda: self._impl.async_save(step, bound.entries, bound.objects))

    def load(self, state: dict, path: str | None = None) -> dict:
        """Fills the tensors of ``state`` in place from ``path`` (default: this Checkpointer's root,
        at the step its tracker names; or one global_step_N folder), whatever the sharding it was
        saved with, and sets its objects to the saved values. Returns ``state``."""
        where = os.fspath(path) if path is not None else self.root
        bound = _Bound(state, writable=True)
        with self._lock:
            objects = self._call(bound, lambda: self._impl.load(bound.entries, bound.objects, where))
        for name, text in objects.items():
            _set_path(state, bound.object_paths[name], json.loads(text))
        return state

    def fence(self) -> float:
        """Returns once no save reads this process's tensors any more; the seconds waited."""
        with self._lock:
            return self._impl.fence()

    def finalize(self) -> None:
        """Finishes a pending async save (written on every rank and committed)."""
        with self._lock:
            self._impl.finalize()

    def close(self) -> None:
        """finalize(), then stops the Checkpointer (rank 0's process first waits for the others)."""
        with self._lock:
            if not self._impl.closed:
                try:
                    self._impl.finalize()
                finally:
                    self._impl.close()
                    self._bound = None
                    self._held.clear()

    def __del__(self) -> None:
        # Dropped without close(): its pending save is finished here as close() finishes it, with
        # the GIL released (the C++ destructor would finish it holding the GIL). At interpreter
        # exit the destructor does it.
        impl = getattr(self, "_impl", None)
        if impl is not None and not impl.closed and not sys.is_finalizing():
            try:
                impl.close()
            except Exception:  # noqa: BLE001 - a destructor must not raise; close() logs what failed
                pass

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _seconds(label: str, seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0.001 <= seconds <= _MOST_TIMEOUT_S:
        raise ValueError(f"{label} must be a number of seconds from 0.001 to {_MOST_TIMEOUT_S} (7 days), not {seconds!r}")
    return float(seconds)


class _Closing:
    """close() drops the C++ object (a publisher's segment is removed; receivers waiting on it are
    told so); usable in a ``with`` block."""

    _impl: Any = None

    def close(self) -> None:
        self._impl = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WeightPublisher(_Closing):
    """The trainer side of a weight-sync channel: one per trainer rank. ``channel`` is a name
    (shared memory, on one host) or ``"tcp://HOST:PORT"`` (TCP, between hosts: trainer rank 0
    listens at that address, the other ranks register with it, receivers connect to it).

    ``state`` gives this rank's tensors (numpy arrays, torch CPU tensors, ``Shard``s for blocks of
    a global tensor, with replica ids for data-parallel copies): the ranks' blocks are planned as
    a save plans them, so each distinct block is sent by one of its holders. Creating waits up to
    ``connect_timeout`` seconds for the other ``world_size - 1`` ranks. ``push(step, state)``
    sends ``state`` as version ``step`` to every receiver waiting in ``receive`` and returns a
    report: ``{"version", "step", "bytes", "delivered": [names], "dropped": [why]}``; a receiver
    that dies, or takes no bucket for ``receiver_timeout`` seconds, is dropped and named. Extra
    memory: ``buckets`` x ``bucket_bytes`` over shared memory; none over TCP (each rank sends
    straight from its tensors)."""

    def __init__(self, channel: str, state: dict, *, rank: int = 0, world_size: int = 1,
                 bucket_bytes: int = 64 << 20, buckets: int = 2, receiver_timeout: float = 10.0,
                 connect_timeout: float = 30.0):
        bound = _Bound(state, writable=False)
        self._impl = _WeightPublisher.create(
            channel, int(rank), int(world_size), bound.entries, int(bucket_bytes), int(buckets),
            _seconds("receiver_timeout", receiver_timeout), _seconds("connect_timeout", connect_timeout))

    def push(self, step: int, state: dict, *, wait_for: int = 0) -> dict:
        """Sends ``state`` (the structure given at construction; it must not change meanwhile) as
        version ``step``; with ``wait_for``, first waits (at most ``receiver_timeout``) until that
        many receivers wait. The GIL is released throughout."""
        bound = _Bound(state, writable=False)
        if isinstance(wait_for, bool) or not isinstance(wait_for, int) or wait_for < 0:
            raise ValueError(f"wait_for must be a count of receivers >= 0, not {wait_for!r}")
        return self._impl.push(_step(step), bound.entries, wait_for, False)

    def push_late(self, step: int, state: dict) -> dict:
        """Sends ``state`` as ``step`` again to the late receivers of ``step`` only (see
        ``late_receivers``); receivers that have it or wait for a later step take no part. Call it
        only while ``state`` still holds that version."""
        bound = _Bound(state, writable=False)
        return self._impl.push(_step(step), bound.entries, 0, True)

    @property
    def waiting_receivers(self) -> int:
        """Receivers waiting in ``receive`` now (the next push serves them)."""
        return self._impl.waiting_receivers

    def late_receivers(self, step: int) -> int:
        """Late receivers of ``step``: those waiting now for a step of at most ``step`` that have not
        got ``step`` from this rank (they joined after its push, or lost it); ``push_late`` serves
        them."""
        return self._impl.late_receivers(_step(step))

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank sends per version."""
        return self._impl.sent_bytes



class WeightReceiver(_Closing):
    """The inference side of a weight-sync channel (a name: shared memory; ``"tcp://HOST:PORT"``:
    trainer rank 0's address over TCP): ``state`` gives this receiver's
    tensors in its own layout (its blocks of each global tensor, any split). ``receive(state)``
    waits for the next version of at least ``min_step`` and fills the tensors in place;
    ``weights()`` returns ``[(name, tensor)]`` pairs in this receiver's layout instead (what vLLM's
    ``load_weights`` takes)."""

    def __init__(self, channel: str, state: dict, *, name: str | None = None, connect_timeout: float = 30.0):
        self.name = name or f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self._template = state
        bound = _Bound(state, writable=True)
        self._impl = _WeightReceiver.connect(channel, self.name, bound.entries,
                                             _seconds("connect_timeout", connect_timeout))
        self._own = None

    def receive(self, state: dict, *, min_step: int = -(1 << 62), timeout: float = 60.0) -> int:
        """Fills ``state`` (the structure given at construction) with the next version whose step is
        at least ``min_step``; returns its step. Raises ``stagehand.Error`` naming the trainer
        rank on a timeout, a drop (this receiver was too slow) or a closed channel."""
        bound = _Bound(state, writable=True)
        return self._impl.receive(bound.entries, int(min_step), _seconds("timeout", timeout))

    def weights(self, *, min_step: int = -(1 << 62), timeout: float = 60.0) -> tuple[int, list]:
        """Receives the next version into tensors of this receiver's own, made once like the
        construction's (numpy or torch); returns ``(step, [(name, tensor)])`` in this receiver's
        layout (a ``Shard``'s block for a sharded entry)."""
        if self._own is None:
            # Arrays like the template's (same type, dtype and shape), made once and reused.
            self._own = {}
            for name, value, is_tensor, _ in _flatten(self._template):
                if not is_tensor:
                    continue
                tensor = value.tensor if isinstance(value, Shard) else value
                made = np.empty_like(tensor) if isinstance(tensor, np.ndarray) else tensor.new_empty(tensor.shape)
                self._own[name] = (Shard(made, value.global_shape, value.offsets, value.replica_id)
                                   if isinstance(value, Shard) else made)
        step = self.receive(self._own, min_step=min_step, timeout=timeout)
        return step, [(n, v.tensor if isinstance(v, Shard) else v) for n, v in self._own.items()]

    @property
    def newest_pushed_step(self) -> int:
        """The newest step any trainer rank finished pushing (-1 before the first)."""
        return self._impl.newest_pushed_step

    def stop(self) -> None:
        """Ends a ``receive`` running on another thread at once (it raises), and every later one."""
        self._impl.stop()



def _set_path(state: dict, path: list, value: Any) -> None:
    node = state
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
