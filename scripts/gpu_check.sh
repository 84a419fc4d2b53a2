#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU machine with no network (everything builds from source):
#   scripts/gpu_check.sh OUT_DIR [build] [test] [sanitize] [bench]      (no stage named: all four)
# build:    CMake + Ninja build of _runtime and every _ops_<op> module into python/graph_executor_v2
#           (GE2_ONLY_OPS="gemm;softmax" builds a subset)
# test:     the whole pytest suite with GPU tests required (a skip for lack of a GPU is a failure)
# sanitize: compute-sanitizer memcheck over the gemm tests and memcheck + racecheck over the op tests
# bench:    benchmarks/bench_gemm.py, bench_ops.py, bench_mlp_inference.py (tables also under OUT_DIR)
# Logs land in OUT_DIR: build.log, pytest.log, sanitizer.log, bench.log, results.tar.gz, summary.txt.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [build] [test] [sanitize] [bench]}
shift
STAGES=${*:-build test sanitize bench}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
status=0

record() {  # record <stage> <exit code>
  echo "$1: $([ "$2" -eq 0 ] && echo ok || echo "FAILED (exit $2)")" | tee -a "$SUMMARY"
  [ "$2" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$SUMMARY" 2>&1

if [[ " $STAGES " == *" build "* ]]; then
  start=$SECONDS
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" -DGE2_ONLY_OPS="${GE2_ONLY_OPS:-}" >"$OUT/build.log" 2>&1 &&
    cmake --build build/gpu -j "$(nproc)" >>"$OUT/build.log" 2>&1
  code=$?
  echo "build took $((SECONDS - start)) s" >>"$SUMMARY"
  record build $code
  [ $code -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
fi

if [[ " $STAGES " == *" test "* ]]; then
  GE2_REQUIRE_GPU=1 "$PYTHON" -m pytest tests -q -ra -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25
  record test "${PIPESTATUS[0]}"
  grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$OUT/pytest.log" | tail -1 >>"$SUMMARY"
fi

if [[ " $STAGES " == *" sanitize "* ]]; then
  sanitize() {  # sanitize <tool> <pytest args...>
    local tool=$1
    shift
    echo "=== compute-sanitizer --tool $tool: $*" >>"$OUT/sanitizer.log"
    GE2_REQUIRE_GPU=1 compute-sanitizer --tool "$tool" --error-exitcode 9 --target-processes all \
      "$PYTHON" -m pytest -q -x -p no:cacheprovider "$@" >>"$OUT/sanitizer.log" 2>&1
    local code=$?
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -2
    return $code
  }
  # Small shapes only: the sanitizer runs every kernel ~100x slower.
  sanitize memcheck tests/test_gemm.py -k "not 4096 and not edge_shapes" -m gpu
  record "sanitize memcheck gemm" $?
  op_tests=$(ls tests/test_*.py | grep -v -E "test_gemm|test_executor|test_ir|test_passes|test_registry|test_train" | tr '\n' ' ')
  if [ -n "$op_tests" ]; then
    sanitize memcheck $op_tests -m gpu -k "not large and not bench"
    record "sanitize memcheck ops" $?
    sanitize racecheck $op_tests -m gpu -k "not large and not bench"
    record "sanitize racecheck ops" $?
  fi
fi

if [[ " $STAGES " == *" bench "* ]]; then
  export GE2_BENCH_OUT="$OUT/tables"
  for bench in benchmarks/bench_gemm.py benchmarks/bench_ops.py benchmarks/bench_mlp_inference.py; do
    [ -f "$bench" ] || continue
    echo "=== $bench" >>"$OUT/bench.log"
    "$PYTHON" "$bench" >>"$OUT/bench.log" 2>&1
    record "bench $(basename "$bench")" $?
  done
  tar czf "$OUT/results.tar.gz" -C benchmarks results
  cat "$OUT"/tables/*.md 2>/dev/null
fi

cat "$SUMMARY"
exit $status
