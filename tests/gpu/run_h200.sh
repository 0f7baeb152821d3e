#!/usr/bin/env bash
# One device call on the lent H200: install the build tools carried as wheels
# in .whl/ (../shared/gpu/stage-wheels.sh --peers), build mlacore with CUDA,
# then run the requested steps, writing logs under $OUT.
#   bash tests/gpu/run_h200.sh "pytest mesontest bench:overhead,attn sanitizer"
# Each step has its own time limit so one slow step cannot eat the call.
set -uo pipefail
STEPS=${1:-"pytest bench"}
OUT=${OUT:-/tmp/mlacore-out}
mkdir -p "$OUT"
ROOT=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
if ! python3 -m pip install -q --no-build-isolation --no-deps -Csetup-args=-Dsm_targets=90a \
     -Cbuild-dir=build/gpu . > "$OUT/build.txt" 2>&1; then
  tail -60 "$OUT/build.txt"; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    pytest)
      # One process per file: a crash in one file cannot hide the others' results.
      : > "$OUT/pytest.txt"
      for f in "$ROOT"/tests/test_*.py; do
        case " ${PYTEST_SKIP:-} " in *" $(basename "$f") "*) echo "$(basename "$f"): skipped this run"; continue ;; esac
        (cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider "$f" 2>&1) > /tmp/one.txt
        rc=$?; cat /tmp/one.txt >> "$OUT/pytest.txt"
        echo "$(basename "$f"): rc=$rc $(tail -1 /tmp/one.txt)"
      done
      grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -30 ;;
    pytest:*)
      (cd /tmp && timeout 300 python3 -m pytest -q -rs -p no:cacheprovider "$ROOT/tests" -k "${step#pytest:}" 2>&1) \
        > "$OUT/pytest.txt"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest.txt" | tail -30 ;;
    gdb:*)
      # A host-side backtrace of a crashing test (cuda-gdb debugs host code; there is no gdb).
      (cd /tmp && timeout 240 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 -m pytest \
        -x -q -p no:cacheprovider "$ROOT/tests" -k "${step#gdb:}" 2>&1) > "$OUT/gdb.txt"
      grep -A25 -m1 "SIGSEGV\|signal" "$OUT/gdb.txt" | head -40 ;;
    mesontest)
      meson test -C build/gpu --print-errorlogs 2>&1 | grep -E "Ok:|Fail:|FAIL" ;;
    sanitizer:*)
      for tool in memcheck racecheck; do
        # MLACORE_PLAN_SYNC: the sanitizer serializes launches, which the plan's handshake cannot survive.
        (cd /tmp && MLACORE_PLAN_SYNC=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x \
          -p no:cacheprovider "$ROOT/tests" -k "${step#sanitizer:}" 2>&1) > "$OUT/sanitizer-$tool.txt"
        echo "sanitizer $tool rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer-$tool.txt" | tail -3
      done ;;
    bench:*)
      modes=""; for m in $(echo "${step#bench:}" | tr ',' ' '); do modes="$modes --mode $m"; done
      timeout 420 python3 -m mlacore bench $modes --json "$OUT/bench.json" \
        > "$OUT/bench.txt" 2> "$OUT/bench-err.txt"; echo "bench rc=$?"; tail -3 "$OUT/bench-err.txt" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
