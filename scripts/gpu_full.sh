#!/usr/bin/env bash
# One GPU-machine call within the device tool's 10-minute limit: build, then the whole suite file by file (GPU tests
# required), then the benchmarks named in GE2_BENCHES, with every log packed so that at most a few files come back.
#   scripts/gpu_full.sh OUT_DIR [build] [test] [bench]       (no stage named: build and test)
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
if [[ " $STAGES " == *" test "* ]]; then
  left=$((deadline - (SECONDS - start) - 25))
  timeout "$left" scripts/gpu_test_files.sh "$OUT/work/tests" ${GE2_TEST_ARGS:-} >/dev/null 2>&1
  echo "tests: exit $? after $((SECONDS - start)) s (124: cut at the deadline)" >>"$OUT/work/summary.txt"
  cat "$OUT/work/tests/files_summary.txt" >>"$OUT/work/summary.txt" 2>/dev/null
  cp "$OUT/work/tests/failures.txt" "$OUT/failures.txt" 2>/dev/null
  rm -f "$OUT/work/tests/all_test_logs.txt"
fi
if [[ " $STAGES " == *" bench "* ]]; then
  left=$((deadline - (SECONDS - start) - 20))
  GE2_BENCH_TIMEOUT=${GE2_BENCH_TIMEOUT:-$left} timeout "$left" scripts/gpu_check.sh "$OUT/work" bench >/dev/null 2>&1
  cp "$OUT/work/tables"/*.md "$OUT/work/" 2>/dev/null
fi
mv "$OUT/work/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" work && rm -rf "$OUT/work"
cat "$OUT/summary.txt"
head -60 "$OUT/failures.txt" 2>/dev/null
