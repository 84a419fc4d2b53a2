#!/usr/bin/env bash
# The test command: sets up .venv, builds every native module through pip (scikit-build-core), builds and installs
# the out-of-tree example op (examples/custom_op) against that GE2, runs pytest (tests/test_scaffold.py runs the
# example's own tests in a process of their own, so its ops never join GE2's registry in this one).
# On a machine with no GPU the GPU tests skip with a reason; GE2_REQUIRE_GPU=1 turns those skips into failures.
#   scripts/run_tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
example_stamp=.venv/.ge2-custom-op-installed
if [ ! -f "$example_stamp" ] || [ -n "$(find examples/custom_op cmake backends/cuda/ops/_common src/bindings/common \
    -newer "$example_stamp" -not -path '*/build/*' -print -quit)" ]; then
  echo "building the out-of-tree example examples/custom_op against the installed GE2 ..."
  python -m pip install --quiet --no-build-isolation --no-deps ./examples/custom_op
  touch "$example_stamp"
fi
python -m pytest "$@"
