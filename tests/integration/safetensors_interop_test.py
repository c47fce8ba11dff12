"""Our bucket files read by the independent safetensors and numpy packages.

Usage: safetensors_interop_test.py PATH/TO/stagehand-bench
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors
from safetensors import safe_open

NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "U8": np.uint8}


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([bench, "save", "--out", out, "--ranks", "2", "--bytes-per-rank", "2M",
                        "--tensors", "12", "--thread-count", "3", "--staging-buckets", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        policy = Path(out) / "global_step_1" / "policy"
        metadata = json.loads((policy / "metadata.json").read_text())
        assert metadata["format"] == "stagehand-dist-ckpt" and metadata["version"] == 1
        checked = 0
        for name, tensor in metadata["tensors"].items():
            for chunk in tensor["chunks"]:
                path = policy / chunk["file"]
                raw = path.read_bytes()
                header_len = int.from_bytes(raw[:8], "little")
                assert (8 + header_len) % 4096 == 0, f"{path}: data does not start at 4096"
                key = name + "@" + ",".join(str(o) for o in chunk["offsets"])
                # Every dtype, including BF16, through safetensors' own parser.
                entries = dict(safetensors.deserialize(raw))
                entry = entries[key]
                assert entry["dtype"] == tensor["dtype"], (entry["dtype"], tensor["dtype"])
                assert list(entry["shape"]) == chunk["shape"]
                begin, end = chunk["byte_range"]
                assert bytes(entry["data"]) == raw[begin:end], f"{key}: bytes differ"
                if tensor["dtype"] in NUMPY_DTYPES:
                    with safe_open(str(path), framework="numpy") as f:
                        array = f.get_tensor(key)
                    assert array.dtype == NUMPY_DTYPES[tensor["dtype"]]
                    assert array.tobytes() == raw[begin:end]
                checked += 1
        assert checked > 0
        sizes = {f: (policy / f).stat().st_size for f in metadata["files"]}
        for f, meta in metadata["files"].items():
            assert sizes[f] == meta["size"], f
    print(f"safetensors interop: {checked} chunks read independently: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
