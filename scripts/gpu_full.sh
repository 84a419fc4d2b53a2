#!/usr/bin/env bash
# One GPU-machine call within the device tool's 10-minute limit: build, then the whole suite file by file (GPU tests
# required), then the benchmarks named in GE2_BENCHES, with every log packed so that at most a few files come back.
#   scripts/gpu_full.sh OUT_DIR [build] [zoo] [test] [bench]       (no stage named: build and test)
# zoo: the model zoo (python -m graph_executor_v2 zoo) beside the tests: every model, GE2_ZOO_GROUPS (default 5) at a
# time (the slowest first), float32 and float16, ONNX and torch.export, the two-sizes check, no torch.compile: its
# import and error columns are what it is for there (its times share the GPU with the tests). GE2_ZOO_SECONDS
# (default 320) is its deadline: a model's time limit shrinks to what is left, and zoo.md is rewritten after every
# model, so a cut run keeps what it did. GE2_ZOO_ARGS replaces its frontend/dtype/time-limit arguments.
# GE2_DEADLINE_S (default 570) bounds the whole call: the test stage gets what the build left, so the logs always
# come back. GE2_TEST_ARGS passes extra pytest arguments (e.g. "-k 'not large'"). Headers carried under .gpu/
# (cudnn_frontend, cutlass) are picked up by scripts/gpu_check.sh.
# What comes back: summary.txt (stages, build time, per-file pytest lines), failures.txt (FAILED lines and crashes),
# logs.tar.gz (build.log, every test file's log, bench.log, tables).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_full.sh OUT_DIR [build] [test] [bench]}
shift
STAGES=${*:-build test}
cd "$(dirname "$0")/.."
start=$SECONDS
deadline=${GE2_DEADLINE_S:-570}
mkdir -p "$OUT/work"
[ -d .gpu/cutlass ] && export GE2_CUTLASS_DIR=${GE2_CUTLASS_DIR:-$PWD/.gpu/cutlass}

[[ " $STAGES " == *" build "* ]] && scripts/gpu_check.sh "$OUT/work" build >/dev/null 2>&1
if [[ " $STAGES " == *" zoo "* ]]; then
  zoo_left=${GE2_ZOO_SECONDS:-320}  # done before the suite's exclusive_gpu tests, which read device-wide free memory
  PYTHONPATH=python timeout $((zoo_left + 15)) python3 -m graph_executor_v2 zoo --jobs "${GE2_ZOO_GROUPS:-5}" \
    --deadline "$zoo_left" ${GE2_ZOO_ARGS:---frontend onnx,torch --dtype float32,float16 --no-compile --time-limit 200} \
    --out "$OUT/work/zoo.md" >"$OUT/work/zoo.log" 2>&1 &
fi
if [[ " $STAGES " == *" test "* ]]; then
  left=$((deadline - (SECONDS - start) - 25))
  timeout "$left" scripts/gpu_test_files.sh "$OUT/work/tests" ${GE2_TEST_ARGS:-} >/dev/null 2>&1
  echo "tests: exit $? after $((SECONDS - start)) s (124: cut at the deadline)" >>"$OUT/work/summary.txt"
  cat "$OUT/work/tests/files_summary.txt" "$OUT/work/tests/tuning_summary.txt" >>"$OUT/work/summary.txt" 2>/dev/null
  cp "$OUT/work/tests/failures.txt" "$OUT/failures.txt" 2>/dev/null
  rm -f "$OUT/work/tests/all_test_logs.txt"
fi
wait  # the zoo groups
if [[ " $STAGES " == *" bench "* ]]; then
  left=$((deadline - (SECONDS - start) - 20))
  GE2_BENCH_TIMEOUT=${GE2_BENCH_TIMEOUT:-$left} timeout "$left" scripts/gpu_check.sh "$OUT/work" bench >/dev/null 2>&1
  cp "$OUT/work/tables"/*.md "$OUT/work/" 2>/dev/null
fi
mv "$OUT/work/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" work && rm -rf "$OUT/work"
cat "$OUT/summary.txt"
head -60 "$OUT/failures.txt" 2>/dev/null
