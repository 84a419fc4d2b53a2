#!/usr/bin/env bash
# The main job: sets up .venv with GE2 built and its test, training and plot extras (scripts/setup_env.sh, which
# reports the build's progress), then trains an MLP on scikit-learn's handwritten digits with ge2.train (GPU if
# present, else the CPU backend): progress bar, test accuracy (>= 95% required, else exit 1) and the loss curve,
# written to runs/digits_loss.png (runs/ is git-ignored; the job prints where each file went).
# `scripts/demo.sh demo` runs the ExecutorV2 inference demo instead.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
source scripts/setup_env.sh
echo "set-up done in $((SECONDS - started)) s"
if [ "${1:-}" = "demo" ]; then
  shift
  python -m graph_executor_v2 demo "$@"
else
  python -m graph_executor_v2 train-digits --plot runs/digits_loss.png "$@"
fi
