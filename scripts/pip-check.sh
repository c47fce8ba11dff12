#!/usr/bin/env bash
# The Python package as a user installs it: `pip install .` from this checkout into a fresh
# virtual environment (the build requirements, scikit-build-core and nanobind, fetched by pip from
# PyPI), then the Python tests run against that installed package instead of build/python.
#   bash scripts/pip-check.sh [BUILD]   (BUILD: a build whose bin/ holds stagehand-ckpt and
#                                        py_peer, which the tests call; default build)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=$(realpath "${1:-build}")
for tool in stagehand-ckpt py_peer; do
  [ -x "$build/bin/$tool" ] || { echo "pip-check: $build/bin/$tool is missing (run scripts/test.sh first)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The venv sees the system's numpy, ml_dtypes, pytest and safetensors (scripts/install-deps.sh).
python3 -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
export CCACHE_BASEDIR="$PWD"
"$py" -m pip install --quiet --disable-pip-version-check .
# The package that imports is the installed one, not the checkout's python/ or build/python.
installed=$(cd "$work" && env -u PYTHONPATH "$py" -c 'import stagehand, os; print(os.path.dirname(stagehand.__file__))')
case "$installed" in
  "$work/venv/"*) echo "pip-check: stagehand installed at $installed" ;;
  *) echo "pip-check: 'import stagehand' found $installed, not the venv's package" >&2; exit 1 ;;
esac
cd "$work"
env -u PYTHONPATH STAGEHAND_BIN_DIR="$build/bin" "$py" -m pytest -q -p no:cacheprovider "$repo/tests/python"
