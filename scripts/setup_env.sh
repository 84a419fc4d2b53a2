# Sourced by run_tests.sh and demo.sh: creates .venv (once), installs GE2 and its test dependencies with every
# native module built (pip install -e ".[test,train]"), and activates it. Rebuilds when the sources are newer.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
source .venv/bin/activate
if [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
stamp=.venv/.ge2-installed
if [ ! -f "$stamp" ] || [ -n "$(find CMakeLists.txt cmake backends src pyproject.toml -newer "$stamp" -print -quit)" ]; then
  # The cudnn extra first: pip builds the project before it installs the extras, and CMake looks for the cuDNN
  # frontend headers (conv2d's cudnn_graph, attention's cudnn) in this environment at build time.
  # Python 3.10 has no tomllib: the build then goes on without the candidate (kernels() says why).
  cudnn_extra=$(python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["cudnn"]))' || true)
  [ -z "$cudnn_extra" ] || python -m pip install --quiet $cudnn_extra
  echo "building graph_executor_v2 (pip install -e .[test,train]) ..."
  python -m pip install --quiet -e ".[test,train]"
  touch "$stamp"
fi
