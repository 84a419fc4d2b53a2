# Sourced by run_tests.sh and demo.sh: creates .venv (once), installs GE2 with every native module built and the
# extras the scripts use (pip install -e ".[test,train,plot]"), and activates it. Rebuilds when the sources are newer.
# The build is long (README.md, "Quick start", has the times): it reports each module as it compiles it, with the
# elapsed time; the full log is .venv/build.log.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $("$PYTHON" --version) ..."
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
  echo "building graph_executor_v2 (pip install -e .[test,train,plot]) with $CMAKE_BUILD_PARALLEL_LEVEL parallel" \
       "jobs: every CUDA op as its own module; the steps below count the compiled files (log: .venv/build.log)"
  : > .venv/build.log
  started=$SECONDS
  if ! python -m pip install -v --progress-bar off -e ".[test,train,plot]" 2>&1 | scripts/build_progress.sh .venv/build.log
  then
    echo "the build failed after $((SECONDS - started)) s; the end of .venv/build.log:" >&2
    tail -n 40 .venv/build.log >&2
    exit 1
  fi
  echo "built and installed in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
  touch "$stamp"
fi
