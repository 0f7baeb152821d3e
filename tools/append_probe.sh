#!/usr/bin/env bash
# The append GPU probe (H200): builds and installs mlacore with tools/gpu_run.sh unless
# MLACORE_SKIP_BUILD=1, then writes under $OUT:
#   kernels.txt   every kernel one append launches in a decode step (torch.profiler), its device time,
#                 and the CUDA-event time per call, for the default choice and for each forced one
#   sweep-*.txt   device us per call over nnz for MLACORE_APPEND_KERNEL = auto, rows, fast, classic
#   bench.txt     python -m mlacore bench --mode append (bars in its notes), bench.json
#   pytest.txt    the append and concat_and_cache_mla tests
# and prints the compact tables. Usage: OUT=/some/dir bash tools/append_probe.sh [steps]
# steps (default "kernels sweep bench pytest").
set -uo pipefail
OUT=${OUT:-/tmp/mlacore-out}
mkdir -p "$OUT"
ROOT=$(pwd)
if [ "${MLACORE_SKIP_BUILD:-0}" != 1 ]; then
  bash tools/gpu_run.sh "" || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-/tmp/site} PYTHONUNBUFFERED=1
for step in ${1:-kernels sweep bench pytest}; do
  case $step in
    kernels)
      : > "$OUT/kernels.txt"
      for k in "" rows fast classic; do
        (cd /tmp && env ${k:+MLACORE_APPEND_KERNEL=$k} timeout 300 python3 "$ROOT/tools/append_probe.py" kernels) \
          >> "$OUT/kernels.txt" 2>&1
      done
      cat "$OUT/kernels.txt" ;;
    sweep)
      for k in auto rows fast classic; do
        (cd /tmp && env MLACORE_APPEND_KERNEL=$k timeout 400 python3 "$ROOT/tools/append_probe.py" sweep) \
          > "$OUT/sweep-$k.txt" 2>&1
        cat "$OUT/sweep-$k.txt"
      done ;;
    bench)
      (cd /tmp && timeout 580 python3 -m mlacore bench --mode append --json "$OUT/bench.json") > "$OUT/bench.txt" 2>&1
      cat "$OUT/bench.txt" ;;
    pytest)
      (cd /tmp && timeout 500 python3 -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/test_append.py" \
        "$ROOT/tests/test_concat_and_cache_mla.py") > "$OUT/pytest.txt" 2>&1
      tail -15 "$OUT/pytest.txt" ;;
  esac
done
