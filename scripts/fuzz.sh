#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, ASan and UBSan in build-fuzz/ and runs
# each for SECONDS_PER_TARGET seconds (default 20), starting from its seed corpus in
# tests/fuzz/corpus/<target>/. Exits non-zero when a target crashes, leaks or times out; the input
# that did it is kept in build-fuzz/crashes/<target>/ (make it a regression test).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]     (FUZZ_JOBS: parallel compile jobs, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ is missing (apt-get install -y clang)" >&2
  exit 2
fi

# target:max_len:dictionary, where max_len is the largest input worth mutating (a data file's
# header page, a metadata.json of a few dozen tensors, a tracker line, a trainer state with a few
# pending batches, a config, a few overrides)
# and the dictionary in tests/fuzz/ lists the tokens of its format.
targets=(safetensors_header_fuzz:16384:json.dict metadata_fuzz:16384:json.dict tracker_fuzz:64:
         trainer_state_fuzz:16384:json.dict
         config_yaml_fuzz:8192:config.dict config_set_fuzz:1024:config.dict)

export CCACHE_BASEDIR="$PWD"
# -O1 with line tables: quick to build; coverage feedback and the sanitizers do not need more.
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DSTAGEHAND_BUILD_FUZZERS=ON -DSTAGEHAND_BUILD_TESTS=OFF -DSTAGEHAND_BUILD_PROGRAMS=OFF \
  -DSTAGEHAND_BUILD_REFERENCE=OFF -DSTAGEHAND_INSTALL=OFF -DSTAGEHAND_WITH_CUDA=OFF -DSTAGEHAND_BUILD_PYTHON=OFF >/dev/null
cmake --build build-fuzz -j"${FUZZ_JOBS:-2}" --target "${targets[@]%%:*}"

failed=()
for entry in "${targets[@]}"; do
  IFS=: read -r name max_len dict <<<"$entry"
  # New inputs go to the first folder, so the seeds in the tree stay as they are.
  work="build-fuzz/corpus/$name"
  crashes="build-fuzz/crashes/$name"
  mkdir -p "$work" "$crashes"
  echo "== $name: ${seconds}s, inputs up to $max_len bytes"
  if ! "build-fuzz/bin/$name" "$work" "tests/fuzz/corpus/$name" -max_total_time="$seconds" \
      -max_len="$max_len" ${dict:+-dict="tests/fuzz/$dict"} -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/" -print_final_stats=1 2>"build-fuzz/$name.log"; then
    tail -n 40 "build-fuzz/$name.log" >&2
    failed+=("$name")
  else
    grep -E '^stat::number_of_executed_units|^Done' "build-fuzz/$name.log" || true
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz.sh: ${failed[*]} failed; inputs in build-fuzz/crashes/" >&2
  exit 1
fi
echo "fuzz.sh: every target ran ${seconds}s without a crash"
