#!/usr/bin/env bash
# The main job: sets up .venv with GE2 built and its test and training extras (scripts/setup_env.sh), then trains an
# MLP on scikit-learn's handwritten digits with ge2.train (GPU if present, else the CPU backend): progress bar, test
# accuracy (>= 95% required, else exit 1) and the loss curve as digits_loss.png when matplotlib is installed (the
# [plot] extra). `scripts/demo.sh demo` runs the ExecutorV2 inference demo instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
if [ "${1:-}" = "demo" ]; then
  shift
  python -m graph_executor_v2 demo "$@"
else
  python -m graph_executor_v2 train-digits "$@"
fi
