"""Loads every chunk of a Stagehand checkpoint with torch + safetensors (onto the GPU when there is
one) and checks dtype, shape and bytes against metadata.json. Used by scripts/device-check.sh.

Usage: torch_interop_check.py CHECKPOINT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
          "U8": torch.uint8}


def main() -> int:
    policy = Path(sys.argv[1]) / "policy"
    metadata = json.loads((policy / "metadata.json").read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = {f: load_file(str(policy / f), device=device) for f in metadata["files"]}
    checked = 0
    for name, tensor in metadata["tensors"].items():
        for chunk in tensor["chunks"]:
            key = name + "@" + ",".join(str(o) for o in chunk["offsets"])
            t = loaded[chunk["file"]][key]
            assert t.dtype == DTYPES[tensor["dtype"]], (key, t.dtype)
            assert list(t.shape) == chunk["shape"], key
            raw = (policy / chunk["file"]).read_bytes()[chunk["byte_range"][0]:chunk["byte_range"][1]]
            host = t.cpu().contiguous().view(torch.uint8).numpy().tobytes()
            assert host == raw, key
            checked += 1
    print(f"torch interop on {device}: {checked} chunks match: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
