#!/usr/bin/env bash
# Runs each tests/test_*.py in its own pytest process (GE2_TEST_JOBS at a time, default 6), GPU tests required, so a
# crash in one file cannot hide the results of the others; then the exclusive_gpu tests (they read device-wide free
# memory) alone. The longest files (GE2_SHARDED_FILES, default test_attention, test_attention_sm90,
# test_attention_window, test_conv_epilogue, test_onnx_frontend, test_codegen and test_fp8_conv: 4-9 minutes each,
# whole, under 12 jobs on the H200) are split into GE2_SHARDS (default 3) processes, round-robin over their collected
# tests (GE2_SHARD, tests/conftest.py), so no one file sets the wall time.
# GE2_TEST_FILES narrows the run to some files (a re-check after fixes).
# Every visible GPU takes jobs: job slot i runs on GPU i mod (the GPU count), so more jobs can run without crowding one
# GPU (GE2_TEST_GPUS sets the count; nvidia-smi's count by default; session 35: 20 jobs on 2 H200s, about 11 minutes). The multi-GPU files (GE2_ALL_GPU_FILES,
# default test_distributed and test_readme) see every GPU.
# GE2_CACHE_DIR (default: a new directory) holds the kernel and autotune caches that the run's processes share, as
# processes on a user's machine do: each distinct problem is timed once per run, by the first test that meets it. Its
# autotune journal comes back as OUT_DIR/autotune.jsonl, with OUT_DIR/tuning_summary.txt (problems timed, seconds
# spent timing them, per op, and the costliest).
# Usage: scripts/gpu_test_files.sh OUT_DIR [pytest args...]
set -uo pipefail
OUT=${1:?usage: scripts/gpu_test_files.sh OUT_DIR [pytest args...]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT/files"
export PYTHONPATH=$PWD/python GE2_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 PYTEST_ARGS="$*" OUT
if [ -z "${GE2_CACHE_DIR:-}" ]; then
  GE2_CACHE_DIR=$(mktemp -d -t ge2_test_cache.XXXXXX)
  trap 'rm -rf "$GE2_CACHE_DIR"' EXIT
fi
export GE2_CACHE_DIR
default_sharded="tests/test_attention.py tests/test_attention_sm90.py tests/test_attention_window.py
  tests/test_conv_epilogue.py tests/test_onnx_frontend.py tests/test_codegen.py tests/test_fp8_conv.py"
sharded=" $(echo ${GE2_SHARDED_FILES:-$default_sharded}) "  # echo: any whitespace (newlines too) separates the names
shards=${GE2_SHARDS:-3}
visible_gpus=${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | paste -sd,)}
export ALL_GPU_FILES=" $(echo ${GE2_ALL_GPU_FILES:-tests/test_distributed.py tests/test_readme.py}) "
export GPU_LIST=${visible_gpus:-0} GPU_COUNT=${GE2_TEST_GPUS:-$(echo "${visible_gpus:-0}" | tr ',' '\n' | grep -c .)}

# One job per line: "<log name> <test file> [<shard>/<shards>]" (a sharded file runs as GE2_SHARD=i/n, see conftest).
# The sharded (longest) files' shards come first, so no long shard starts in the run's last minutes.
jobs=$(for f in ${GE2_TEST_FILES:-tests/test_*.py}; do
  [[ $sharded == *" $f "* ]] || continue
  for ((shard = 0; shard < shards; shard++)); do echo "$(basename "$f" .py).$shard $f $shard/$shards"; done
done
for f in ${GE2_TEST_FILES:-tests/test_*.py}; do
  [[ $sharded == *" $f "* ]] || echo "$(basename "$f" .py) $f"
done)

run_job() {  # run_job <log name> <test file> [<shard>/<shards>]; XARGS_SLOT picks the GPU
  local gpus=(${GPU_LIST//,/ }) visible=$GPU_LIST
  [[ $ALL_GPU_FILES == *" $2 "* ]] || visible=${gpus[$((XARGS_SLOT % GPU_COUNT))]}
  CUDA_VISIBLE_DEVICES=$visible GE2_SHARD=${3:-} python3 -m pytest "$2" -q -p no:cacheprovider -rf \
    -m "not exclusive_gpu" $PYTEST_ARGS >"$OUT/files/$1.log" 2>&1
  local code=$?
  [ $code -eq 5 ] && code=0  # a file with no test selected
  echo "$1 exit=$code"
}
export -f run_job
echo "$jobs" | xargs -P "${GE2_TEST_JOBS:-6}" --process-slot-var=XARGS_SLOT -L 1 bash -c 'run_job "$0" "$1" "${2:-}"' | sort >"$OUT/files_summary.txt"
python3 -m pytest tests -q -p no:cacheprovider -rf -m exclusive_gpu $PYTEST_ARGS >"$OUT/files/exclusive_gpu.log" 2>&1
echo "exclusive_gpu exit=$?" >>"$OUT/files_summary.txt"
for log in "$OUT"/files/*.log; do
  echo "== $(basename "$log" .log): $(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$log" | tail -1)"
done | tee -a "$OUT/files_summary.txt"
grep -h -E "^FAILED|Fatal Python error|Segmentation" "$OUT"/files/*.log | cut -c1-240 >"$OUT/failures.txt"
cp "$GE2_CACHE_DIR/autotune.jsonl" "$OUT/autotune.jsonl" 2>/dev/null
python3 -c "from graph_executor_v2.runtime.autotune import AutotuneCache, summarize
print(summarize(AutotuneCache().entries()))" >"$OUT/tuning_summary.txt" 2>&1
cat "$OUT"/files/*.log >"$OUT/all_test_logs.txt"
! grep -q "exit=[^0]" "$OUT/files_summary.txt"
