#!/usr/bin/env bash
# Builds Stagehand (Release, -O3, warnings as errors) and runs its whole test suite (ctest over the
# Boost.Test executables).
# Sets up a fresh machine first: Debian packages and the Python test peers.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# ccache (when present) shares objects between checkouts in other folders.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTAGEHAND_WERROR=ON -DSTAGEHAND_BUILD_PYTHON=ON \
  -DPython3_EXECUTABLE="$(command -v python3)" -DPython_EXECUTABLE="$(command -v python3)"
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure --timeout 600 -j2
