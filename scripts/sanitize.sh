#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer: its own build folder
# (build-asan), every finding fatal. Run after scripts/test.sh (which installs the packages).
# It runs on the simulated GPU (STAGEHAND_SIMULATED_GPU=1; core/copy_engine.hpp): device memory
# and copies of every test go through the simulated device, which reports misuse, while
# scripts/test.sh runs the suite on plain host memory.
#
#   scripts/sanitize.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"
build=${1:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# GCC's -Wmaybe-uninitialized misfires on instrumented code (in libstdc++'s own <regex> here); the
# regular build keeps the warning.
warn="-Wno-maybe-uninitialized"
# Debug (the build type a user may pick, compiled here too) with -O1: quick to build, fast enough to
# run; line tables only (-g1), which is all the sanitizers' stack traces need and much quicker to
# build than full debug information.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DSTAGEHAND_WERROR=ON -DSTAGEHAND_BUILD_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="-O1 $flags $warn" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DPython3_EXECUTABLE="$(command -v python3)" \
  > /dev/null
cmake --build "$build" -j"$(nproc)"
# Leaks are not checked: CAF keeps process-wide singletons alive until exit by design.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export STAGEHAND_SIMULATED_GPU=1
cd "$build"
ctest --output-on-failure --timeout 900 -j2
