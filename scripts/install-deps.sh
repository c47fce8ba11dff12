#!/usr/bin/env bash
# Installs the Debian packages and Python test peers that Stagehand builds and tests with.
# Idempotent: skips apt when every package is already installed.
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config
  libcaf-dev libyaml-cpp-dev libboost-test-dev libxxhash-dev nlohmann-json3-dev
  libcurl4-openssl-dev libopenblas-dev libspdlog-dev libcli11-dev libpugixml-dev
  libgloo-dev             # collectives between processes (models/process_collectives)
  python3 python3-pip python3-dev python3-venv time   # venv: scripts/pip-check.sh
  iproute2                # ip netns and ss for scripts/two-host-check.sh (two_host_test)
  clang libclang-rt-dev   # libFuzzer for scripts/fuzz.sh (libclang-rt is only recommended by clang)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Independent readers of our files for the interop tests (ml_dtypes: BF16 and FP8 in numpy); an
# S3-compatible server (moto) and an independent S3 client (boto3) for the object-store tests;
# nanobind and scikit-build-core to build the Python package (python/), pytest to test it.
if ! python3 -c 'import safetensors, numpy, ml_dtypes, moto.server, boto3, flask, flask_cors, nanobind, scikit_build_core, pytest' 2>/dev/null; then
  pip_packages=(safetensors numpy ml_dtypes 'moto[server]' boto3 nanobind scikit-build-core pytest)
  python3 -m pip install --quiet --disable-pip-version-check "${pip_packages[@]}" ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "${pip_packages[@]}"
fi
