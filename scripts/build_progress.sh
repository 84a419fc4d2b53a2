#!/usr/bin/env bash
# A filter for pip's and CMake's build output (scripts/setup_env.sh pipes `pip install -v` through it): every line
# goes to the log file LOG; on the terminal, ninja's "[N/M]" lines become "step N of M: compiling <module> (<file>)"
# or "linking <module>", with pip's "Collecting" and "Successfully installed" lines and every error line, each after
# the elapsed time.
#   ... 2>&1 | scripts/build_progress.sh LOG
set -uo pipefail
log=$1
start=$SECONDS
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$log"
  what=""
  if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]]; then
    # "[17/105] Building CUDA object CMakeFiles/_ops_gemm.dir/backends/cuda/ops/gemm/launcher.cu.o"
    what="step ${BASH_REMATCH[1]} of ${BASH_REMATCH[2]}: ${BASH_REMATCH[3]}"
    if [[ $line =~ CMakeFiles/([^/]+)\.dir/(.*/)?([^/]+)\.o$ ]]; then
      what="${what%%:*}: compiling ${BASH_REMATCH[1]} (${BASH_REMATCH[3]})"
    elif [[ $line =~ Linking.*/([A-Za-z0-9_]+)\.[^/]*$ ]]; then
      what="${what%%:*}: linking ${BASH_REMATCH[1]}"
    fi
  elif [[ $line == *rror* || $line == Collecting* || $line == "Successfully installed"* ]]; then
    what=$line
  fi
  [ -z "$what" ] || printf '  [%3dm%02ds] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$what"
done
