#!/usr/bin/env bash
# The test command: sets up .venv, builds every native module through pip (scikit-build-core), runs pytest.
# On a machine with no GPU the GPU tests skip with a reason; GE2_REQUIRE_GPU=1 turns those skips into failures.
#   scripts/run_tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
python -m pytest "$@"
