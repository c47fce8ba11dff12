"""A stagehand-ckpt export read by the independent safetensors and numpy packages.

Every tensor is assembled here, in numpy, from the checkpoint's own files (metadata.json's chunk
offsets and byte ranges), then compared with the export's: as saved byte for byte, converted to
BF16 or F32 against ml_dtypes (or numpy's own rounding where ml_dtypes is not installed).

Usage: export_interop_test.py PATH/TO/stagehand-bench PATH/TO/stagehand-ckpt
"""
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import safetensors
from safetensors import safe_open

try:
    import ml_dtypes
except ImportError:  # the numpy fallback below rounds the same way
    ml_dtypes = None

# Raw storage of each dtype: compare bits, never values (BF16 has no numpy dtype).
RAW = {"F64": np.uint64, "F32": np.uint32, "F16": np.uint16, "BF16": np.uint16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16,
       "U32": np.uint32, "U64": np.uint64, "BOOL": np.uint8, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}
# Dtypes safetensors' numpy backend loads.
NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
         "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
         "U64": np.uint64}
FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def assemble(policy: Path, metadata: dict) -> dict:
    """name -> (dtype, raw array of the global shape) from the checkpoint's chunks."""
    out = {}
    files = {}
    for name, tensor in metadata["tensors"].items():
        raw = RAW[tensor["dtype"]]
        full = np.zeros(tensor["shape"], dtype=raw)
        covered = 0
        for chunk in tensor["chunks"]:
            if chunk["file"] not in files:
                files[chunk["file"]] = (policy / chunk["file"]).read_bytes()
            begin, end = chunk["byte_range"]
            block = np.frombuffer(files[chunk["file"]][begin:end], dtype=raw).reshape(chunk["shape"])
            where = tuple(slice(o, o + s) for o, s in zip(chunk["offsets"], chunk["shape"]))
            full[where] = block
            covered += block.size
        assert covered == full.size, f"{name}: chunks cover {covered} of {full.size} elements"
        out[name] = (tensor["dtype"], full)
    return out


def to_float64(dtype: str, raw: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.view(NUMPY[dtype]).astype(np.float64)


def convert(dtype: str, raw: np.ndarray, target: str) -> np.ndarray:
    """The raw bits of `raw` (a `dtype` tensor) rounded to nearest even in `target`."""
    if dtype == target or dtype not in FLOATING:
        return raw
    if target == "F32":
        if dtype == "BF16":
            return (raw.astype(np.uint32) << 16)
        return raw.view(NUMPY[dtype]).astype(np.float32).view(np.uint32)
    assert target == "BF16", target
    if ml_dtypes is not None:
        source = raw.view(ml_dtypes.bfloat16 if dtype == "BF16" else NUMPY[dtype])
        return source.astype(ml_dtypes.bfloat16).view(np.uint16)
    bits = raw.view(NUMPY[dtype]).astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(raw.view(NUMPY[dtype]))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def same_values(target: str, got: np.ndarray, expected: np.ndarray) -> bool:
    """Bits equal, except that a NaN only needs to stay a NaN of the same sign."""
    if got.shape != expected.shape:
        return False
    equal = got == expected
    if target in FLOATING:
        g, e = to_float64(target, got), to_float64(target, expected)
        equal |= np.isnan(g) & np.isnan(e) & (np.signbit(g) == np.signbit(e))
    return bool(np.all(equal))


def read_header(raw: bytes) -> dict:
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + length])


def check_export(out: Path, tensors: dict, target: str, sharded: bool) -> int:
    files = sorted(p.name for p in out.glob("*.safetensors"))
    index_path = out / "model.safetensors.index.json"
    if sharded:
        assert len(files) > 1 and not (out / "model.safetensors").exists(), files
        index = json.loads(index_path.read_text())
        count = len(files)
        assert files == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)], files
        assert set(index["weight_map"]) == set(tensors), "the index does not list every tensor"
        assert set(index["weight_map"].values()) == set(files)
    else:
        assert files == ["model.safetensors"] and not index_path.exists(), files
        index = None
    seen = {}
    total = 0
    for file in files:
        path = out / file
        raw = path.read_bytes()
        header = read_header(raw)
        assert header["__metadata__"] == {"format": "pt"}, header.get("__metadata__")
        # safetensors' own parser checks the header and gives every dtype's bytes.
        entries = dict(safetensors.deserialize(raw))
        with safe_open(str(path), framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            names = list(f.keys())
            for name in names:
                entry = entries[name]
                dtype = entry["dtype"]
                array = np.frombuffer(bytes(entry["data"]), dtype=RAW[dtype]).reshape(entry["shape"])
                if dtype in NUMPY:
                    loaded = f.get_tensor(name)
                    assert loaded.dtype == NUMPY[dtype] and loaded.tobytes() == array.tobytes(), name
                seen[name] = (dtype, array, file)
                total += array.nbytes
    assert set(seen) == set(tensors), set(seen) ^ set(tensors)
    if index is not None:
        assert index["metadata"]["total_size"] == total, (index["metadata"]["total_size"], total)
        for name, (_, _, file) in seen.items():
            assert index["weight_map"][name] == file, name
    for name, (dtype, full) in tensors.items():
        got_dtype, got, _ = seen[name]
        want_dtype = target if target != "as-saved" and dtype in FLOATING else dtype
        assert got_dtype == want_dtype, (name, got_dtype, want_dtype)
        expected = convert(dtype, full, want_dtype)
        assert same_values(want_dtype, got, expected), f"{name}: {dtype} -> {want_dtype} differs"
    return len(seen)


def main() -> int:
    bench, ckpt_tool = sys.argv[1], sys.argv[2]
    # Random bits hold NaNs and infinities: casting them is expected, not worth a warning.
    warnings.simplefilter("ignore", RuntimeWarning)
    passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        subprocess.run([bench, "save", "--out", str(root), "--ranks", "2", "--bytes-per-rank", "2M",
                        "--tensors", "12", "--thread-count", "3"], check=True, stdout=subprocess.DEVNULL)
        policy = root / "global_step_1" / "policy"
        tensors = assemble(policy, json.loads((policy / "metadata.json").read_text()))
        for target, max_size in [("as-saved", "5GB"), ("as-saved", "1MB"), ("bf16", "700KB"),
                                 ("fp32", "5GB")]:
            out = Path(tmp) / f"export-{target}-{max_size}"
            subprocess.run([ckpt_tool, "export", str(root), str(out), "--what", "all", "--dtype", target,
                            "--max-shard-size", max_size], check=True, stdout=subprocess.DEVNULL)
            checked = check_export(out, tensors, {"bf16": "BF16", "fp32": "F32"}.get(target, target),
                                   sharded=max_size != "5GB")
            print(f"export {target} {max_size}: {checked} tensors equal the checkpoint's")
            passed += 1
    print(f"export interop (ml_dtypes {'used' if ml_dtypes else 'absent'}): {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
