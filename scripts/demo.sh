#!/usr/bin/env bash
# The main job: sets up .venv with GE2 built (scripts/setup_env.sh), then runs the ExecutorV2 demo - an MLP through
# the passes and the kernel registry, on the GPU when there is one, else on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
python -m graph_executor_v2 demo "$@"
