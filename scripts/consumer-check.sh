#!/usr/bin/env bash
# Builds tests/consumer (an outside project) against Stagehand two ways and runs it each time:
# find_package(Stagehand) after `cmake --install` of BUILD_DIR, and add_subdirectory of this source;
# runs its SPMD program in 4 processes, and builds tests/consumer/engine (Stagehand::checkpoint
# alone) with CAF, Gloo, curl, pugixml and CUDA made unfindable.
# Also checks that the add_subdirectory build built nothing of Stagehand's beyond what the consumer
# links (no tests, no programs) and never looked for Boost.
#
#   scripts/consumer-check.sh [BUILD_DIR]     (default: build, as scripts/test.sh leaves it)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=$(realpath "${1:-build}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== consumer against an installed prefix (find_package)"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/stagehand/actors/checkpointer.hpp"
test -f "$work/prefix/lib/cmake/Stagehand/StagehandConfig.cmake"
cmake -S tests/consumer -B "$work/installed" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/installed.log"
cmake --build "$work/installed" -j"$(nproc)" > "$work/installed-build.log"
"$work/installed/consumer" "$work/ckpt-installed"
echo "== the SPMD consumer in 4 processes"
GRACE_S=10 TIMEOUT_S=300 scripts/launch-local.sh 4 "$work/installed/consumer_spmd" "$work/ckpt-spmd"

echo "== the engine alone (COMPONENTS checkpoint), with CAF, Gloo, curl, pugixml and CUDA unfindable"
cmake -S tests/consumer/engine -B "$work/engine" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CAF=ON -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON -DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_pugixml=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON > "$work/engine.log"
cmake --build "$work/engine" -j"$(nproc)" > "$work/engine-build.log"
"$work/engine/engine_consumer" "$work/ckpt-engine"

echo "== consumer with add_subdirectory"
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S tests/consumer -B "$work/subdir" -DSTAGEHAND_SOURCE="$src" "${launcher[@]}" > "$work/subdir.log"
cmake --build "$work/subdir" -j"$(nproc)" > "$work/subdir-build.log"
"$work/subdir/consumer" "$work/ckpt-subdir"
GRACE_S=10 TIMEOUT_S=300 scripts/launch-local.sh 2 "$work/subdir/consumer_spmd" "$work/ckpt-subdir-spmd"

built=$(find "$work/subdir" -type f \( -name '*_test' -o -name 'stagehand-*' -o -name 'libstagehand_models.a' \
  -o -name 'libstagehand_trainers.a' \) | wc -l)
if [ "$built" -ne 0 ]; then
  echo "consumer-check: the add_subdirectory build built Stagehand tests, programs or the reference model" >&2
  exit 1
fi
if grep -q '^Boost_DIR\|^CLI11_DIR\|^BLAS' "$work/subdir/CMakeCache.txt"; then
  echo "consumer-check: the add_subdirectory build looked for Boost, CLI11 or BLAS" >&2
  exit 1
fi
echo "consumer-check: passed (find_package and add_subdirectory)"
