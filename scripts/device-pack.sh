#!/usr/bin/env bash
# Packs what the GPU check needs into build/devpack.tar.gz: stripped test and tool binaries, the
# shared libraries they use from this machine (the device machine has no package access), and
# scripts/device-check.sh. Run after building; carry build/devpack.tar.gz to the device.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=build/devpack
rm -rf "$pack" && mkdir -p "$pack/bin" "$pack/lib"
bins=(core_test copy_engine_test load_test save_engine_test async_save_test bandit_mlp_test dispatch_test train_test
      stagehand-bench stagehand-ckpt stagehand-train)
for b in "${bins[@]}"; do
  cp "build/bin/$b" "$pack/bin/" && strip "$pack/bin/$b"
done
for b in "${bins[@]}"; do
  ldd "build/bin/$b" | awk '/=>/ {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|libcublas|libcublasLt)\.so' | xargs -I{} cp -L {} "$pack/lib/"
cp scripts/device-check.sh tests/integration/torch_interop_check.py tests/python/device_worker.py "$pack/"
# The Python package, where it was built (its module is for this machine's Python version).
if [ -d build/python/stagehand ]; then
  mkdir -p "$pack/python" && cp -r build/python/stagehand "$pack/python/"
fi
mkdir -p "$pack/examples" && cp -r examples/configs "$pack/examples/"
tar czf build/devpack.tar.gz -C build devpack
ls -la build/devpack.tar.gz
