#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU machine with no network (everything builds from source):
#   scripts/gpu_check.sh OUT_DIR [build] [test] [sanitize] [bench]      (no stage named: all four)
# build:    CMake + Ninja build of _runtime and every _ops_<op> module into python/graph_executor_v2
#           (GE2_ONLY_OPS="gemm;softmax" builds a subset; GE2_CMAKE_ARGS adds configure arguments, e.g.
#           GE2_CMAKE_ARGS="-DGE2_CUDNN_FRONTEND_DIR=$PWD/.gpu/cudnn_frontend" for headers carried to a machine
#           with no network; the environment variable GE2_CUDNN_FRONTEND_DIR works too)
# test:     the whole pytest suite with GPU tests required (a skip for lack of a GPU is a failure)
# sanitize: compute-sanitizer memcheck over every GPU test file, racecheck over the shared-memory kernels' tests
# bench:    every benchmarks/bench_*.py (GE2_BENCHES="gemm ops" narrows the list, GE2_BENCH_TIMEOUT caps each, in
#           seconds; bench_data_parallel's 2-GPU rows need 2 visible GPUs; tables also under OUT_DIR)
# Logs land in OUT_DIR: build.log, pytest.log, sanitizer.log (+ sanitizer_logs.tar.gz), bench.log, results.tar.gz,
# summary.txt.
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
  # The cuDNN frontend headers carried to a machine with no network (see GE2_CMAKE_ARGS above).
  [ -z "${GE2_CUDNN_FRONTEND_DIR:-}" ] && [ -d .gpu/cudnn_frontend ] && export GE2_CUDNN_FRONTEND_DIR=$PWD/.gpu/cudnn_frontend
  # CUTLASS's headers, carried the same way (CMake reads the environment variable GE2_CUTLASS_DIR too).
  [ -z "${GE2_CUTLASS_DIR:-}" ] && [ -d .gpu/cutlass ] && export GE2_CUTLASS_DIR=$PWD/.gpu/cutlass
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" -DGE2_ONLY_OPS="${GE2_ONLY_OPS:-}" ${GE2_CMAKE_ARGS:-} \
    >"$OUT/build.log" 2>&1 &&
    cmake --build build/gpu -j "$(nproc)" >>"$OUT/build.log" 2>&1
  code=$?
  echo "build took $((SECONDS - start)) s" >>"$SUMMARY"
  grep -E "^-- (cuDNN|CUTLASS)" "$OUT/build.log" >>"$SUMMARY"  # which cuDNN and CUTLASS candidates this build has
  record build $code
  [ $code -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
fi

if [[ " $STAGES " == *" test "* ]]; then
  GE2_REQUIRE_GPU=1 "$PYTHON" -m pytest tests -q -ra -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25
  record test "${PIPESTATUS[0]}"
  grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$OUT/pytest.log" | tail -1 >>"$SUMMARY"
fi

if [[ " $STAGES " == *" sanitize "* ]]; then
  # One sanitizer process per test file, four at a time (each kernel runs ~10-100x slower under the sanitizer, so
  # the "large" tests are left out). memcheck over every GPU test file, racecheck over the files whose kernels use
  # shared memory. A file passes when pytest passes and the sanitizer reports 0 errors.
  mkdir -p "$OUT/sanitizer"
  sanitize_file() {  # sanitize_file <tool> <test file>
    local log="$OUT/sanitizer/$1-$(basename "$2" .py).log"
    GE2_REQUIRE_GPU=1 timeout "${GE2_SANITIZE_TIMEOUT:-500}" compute-sanitizer --tool "$1" --error-exitcode 9 \
      "$PYTHON" -m pytest -q -x -p no:cacheprovider -m gpu -k "not large" "$2" >"$log" 2>&1
    local code=$?  # 9: the sanitizer found errors; otherwise pytest's own exit code (124: timed out)
    echo "$1 $(basename "$2"): exit $code | $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) |" \
      "$(grep -E "passed|failed" "$log" | tail -1)"
  }
  export -f sanitize_file
  export OUT PYTHON
  # GE2_SANITIZE_TOOLS (memcheck, racecheck) and GE2_SANITIZE_FILES (test files) narrow a re-check. The GPT
  # parity file (hundreds of training steps) is left out: its kernels are the ones the op test files check.
  gpu_files=$(echo ${GE2_SANITIZE_FILES:-$(grep -l "mark.gpu" tests/test_*.py | grep -v -E "test_executor|test_registry|test_gpt_parity_gpu")})
  shared_memory_files="tests/test_softmax.py tests/test_reduce.py tests/test_layernorm.py tests/test_rmsnorm.py
    tests/test_attention.py tests/test_cross_entropy.py tests/test_transpose.py tests/test_embedding.py
    tests/test_optimizer.py tests/test_pool2d.py tests/test_batch_norm.py tests/test_conv2d.py tests/test_codegen.py
    tests/test_quantize_fp8.py"
  tools=" ${GE2_SANITIZE_TOOLS:-memcheck racecheck} "
  { [[ $tools == *" memcheck "* ]] && for f in $gpu_files; do echo "memcheck $f"; done
    [[ $tools == *" racecheck "* ]] && for f in $shared_memory_files; do
      [[ " $gpu_files " == *" $f "* ]] && echo "racecheck $f"; done; } |
    xargs -P 4 -L 1 bash -c 'sanitize_file "$0" "$1"' | sort | tee "$OUT/sanitizer.log"
  ! grep -q -v ": exit 0 |" "$OUT/sanitizer.log"
  record "sanitize (memcheck all GPU test files, racecheck shared-memory kernels)" $?
  tar czf "$OUT/sanitizer_logs.tar.gz" -C "$OUT" sanitizer && rm -rf "$OUT/sanitizer"
fi

if [[ " $STAGES " == *" bench "* ]]; then
  export GE2_BENCH_OUT="$OUT/tables"
  benches=${GE2_BENCHES:-$(ls benchmarks/bench_*.py | sed -E 's|benchmarks/bench_(.*)[.]py|\1|')}
  for name in $benches; do
    bench=benchmarks/bench_$name.py
    [ -f "$bench" ] || continue
    echo "=== $bench" >>"$OUT/bench.log"
    timeout "${GE2_BENCH_TIMEOUT:-1800}" "$PYTHON" "$bench" >>"$OUT/bench.log" 2>&1
    record "bench $(basename "$bench")" $?
  done
  tar czf "$OUT/results.tar.gz" -C benchmarks results
  cat "$OUT"/tables/*.md 2>/dev/null
fi

cat "$SUMMARY"
exit $status
