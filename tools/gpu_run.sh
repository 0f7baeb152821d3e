#!/usr/bin/env bash
# One run on a CUDA GPU machine without network access: install the build
# tools and peers carried as wheels in .whl/ (made beforehand with `pip wheel`),
# build mlacore with CUDA, then run the requested steps, writing logs under $OUT.
#   bash tools/gpu_run.sh "pytest mesontest bench:overhead,attn sanitizer"
#   bash tools/gpu_run.sh "plan-ab:.devsnap/base.tar"   (the plan bar against another tree)
#   bash tools/gpu_run.sh "decode-ab:seesaw"   (a decode kernel switch against the default, one build)
#   bash tools/gpu_run.sh "ncu-decode:seesaw,wgmma"   (where each decode kernel and FlashMLA wait, by ncu)
#   AB_TREES="x=.scratch/x.tar" bash tools/gpu_run.sh tree-ab   (decode variants built beside this tree)
#   FLASHMLA_KIT=kit.tar.gz bash tools/gpu_run.sh pair-timeline   (the seesaw's pair hand-offs beside FlashMLA's)
#   AB_TREES="base=.scratch/base.tar" bash tools/gpu_run.sh "land-check tree-ab"   (a kernel change's checks and A/B)
#   FLASHMLA_KIT=kit.tar.gz bash tools/gpu_run.sh grid   (the whole attn grid with the FlashMLA column)
#   OUT_PACK=1 bash tools/gpu_run.sh ...   (the logs come back as one file, $OUT/run0.tar.gz)
# Each step has its own time limit so one slow step cannot eat the call.
# No argument runs "pytest bench"; an empty one ("") builds and installs only.
set -uo pipefail
STEPS=${1-"pytest bench"}
OUT=${OUT:-/tmp/mlacore-out}
mkdir -p "$OUT"
# OUT_PACK=1: at exit (a failed build too), everything under $OUT goes into one archive,
# $OUT/runN.tar.gz (N counts the archives already there, so invocations in a row keep theirs),
# for a runner that brings back only a few files (tree-ab writes two a side a round). Not for
# invocations side by side that share $OUT (or a folder below it): the first to exit packs them all.
if [ "${OUT_PACK:-0}" = 1 ]; then
  pack_out() {
    local a n; a=$(mktemp /tmp/mlacore-run.XXXXXX); n=$(ls "$OUT" | grep -c '^run[0-9]*\.tar\.gz$')
    tar -czf "$a" -C "$OUT" --exclude='./run*.tar.gz' . && chmod 644 "$a" &&
      find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'run*.tar.gz' -exec rm -rf {} + && mv "$a" "$OUT/run$n.tar.gz"
  }
  trap pack_out EXIT
fi
ROOT=$(pwd)
# MLACORE_SITE_FIRST: a directory searched before /tmp/site (another build of mlacore, e.g. the racecheck build).
export PYTHONPATH=${MLACORE_SITE_FIRST:+$MLACORE_SITE_FIRST:}/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
# MLACORE_SKIP_BUILD=1: an earlier invocation on this machine installed everything
# (lets two invocations run side by side, e.g. the sanitizer next to pytest).
if [ "${MLACORE_SKIP_BUILD:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
  t0=$(date +%s)
  if ! python3 -m pip install -q --no-build-isolation --no-deps -Csetup-args=-Dsm_targets=90a \
       -Csetup-args=-Dtests=true -Cbuild-dir=build/gpu . > "$OUT/build.txt" 2>&1; then
    tail -60 "$OUT/build.txt"; exit 1
  fi
  echo "build: $(( $(date +%s) - t0 )) s"
fi
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    pytest)
      # One process per file (PYTEST_TIMEOUT s each, default 200): a crash in one file cannot hide the others' results.
      : > "$OUT/pytest.txt"
      for f in "$ROOT"/tests/test_*.py; do
        case " ${PYTEST_SKIP:-} " in *" $(basename "$f") "*) echo "$(basename "$f"): skipped this run"; continue ;; esac
        (cd /tmp && timeout "${PYTEST_TIMEOUT:-200}" python3 -m pytest -q -rs -p no:cacheprovider "$f" 2>&1) > /tmp/one.txt
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
    cpp_decode)
      # examples/cpp_decode built with the installed package's flags (CI builds it
      # through CMake and pkg-config), then run: 16 and 128 heads (the mma.sync
      # and wgmma kernels), 6 steps each.
      cuda_home=${CUDA_HOME:-${CUDA_PATH:-}}
      [ -n "$cuda_home" ] || cuda_home=/usr/local/cuda
      [ -f "$cuda_home/include/cuda_runtime.h" ] || cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
      { mkdir -p build/cpp_decode &&
        c++ -std=c++17 -O2 examples/cpp_decode/main.cpp $(python3 -m mlacore --cflags --libs) \
          -I"$cuda_home/include" -L"$cuda_home/lib64" -Wl,-rpath,"$cuda_home/lib64" -lcudart -o build/cpp_decode/cpp_decode &&
        build/cpp_decode/cpp_decode 16 6 && build/cpp_decode/cpp_decode 128 6
      } > "$OUT/cpp_decode.txt" 2>&1
      echo "cpp_decode: rc=$? $(tail -1 "$OUT/cpp_decode.txt")"; grep -E "step|out|lse|ref|cache|skipped" "$OUT/cpp_decode.txt" | tail -40 ;;
    mesontest)
      meson test -C build/gpu --print-errorlogs 2>&1 | grep -E "Ok:|Fail:|FAIL" ;;
    sanitizer-all|sanitizer-all:*)
      # Every test file under compute-sanitizer, one process per (file, tool, chunk), SAN_JOBS
      # (default 8) at a time: the sanitizer is CPU-bound (16 cores) and the processes share
      # the one GPU. SAN_SPLIT=N (default 1) splits each file's tests into N chunks of test ids,
      # one process each, for files too slow for one process. SAN_TIMEOUT (s, default 420)
      # bounds each process. SAN_FILES="test_a.py test_b.py" runs some files only.
      # MLACORE_HYPOTHESIS_PROFILE caps property
      # tests (tests/conftest.py); MLACORE_LEAK_REPORT lists what still holds plans at the end.
      # --show-backtrace device: collecting host backtraces keeps the Python frames of the calls
      # that launched alive (and the plans in them), so nanobind's exit check would report
      # leaks that do not exist (the exitleak step shows it); device backtraces are kept.
      # SAN_K passes pytest -k (racecheck adds "not concurrent", see san_one). A test still running SAN_TIMEOUT-60 s in dumps every thread's
      # stack (faulthandler_timeout): a hang shows where it waits, a slow test does not.
      tools="memcheck racecheck"; [ "$step" = sanitizer-all ] || tools=$(echo "${step#sanitizer-all:}" | tr ',' ' ')
      san_dir="$OUT/sanitizer"; rm -rf "$san_dir" "$san_dir.progress.txt"; mkdir -p "$san_dir"
      san_one() {  # tool file [ids-file]: one sanitizer process; log and exit status in $san_dir
        local base="$san_dir/$(basename "$(basename "${3:-$2}" .ids)" .py).$1" targets=("$2")
        [ -n "${3:-}" ] && mapfile -t targets < "$3"  # ids may hold spaces: one argument per line
        # Racecheck itself stalls, now and then, when several host threads launch at once
        # (research/probes/racecheck_threads_probe.cu, no mlacore involved): the threaded tests
        # ("concurrent" in their names or marks) run under memcheck only; their kernels are
        # racechecked by the single-threaded tests.
        local k="${SAN_K:-}"
        [ "$1" = racecheck ] && k="${k:+($k) and }not concurrent"
        (cd /tmp && MLACORE_HYPOTHESIS_PROFILE=sanitizer MLACORE_LEAK_REPORT=1 \
          timeout -k 30 "${SAN_TIMEOUT:-420}" compute-sanitizer --tool "$1" --error-exitcode 9 --show-backtrace device \
          python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=$(( ${SAN_TIMEOUT:-420} - 60 )) \
          ${k:+-k "$k"} "${targets[@]}") > "$base.log" 2>&1
        echo $? > "$base.rc"
        # One line per finished process, outside the directory the final tar takes: a call that
        # ends before the step does still brings these back.
        echo "$(basename "$base"): rc=$(cat "$base.rc") | $(grep -E "[0-9]+ (passed|failed)" "$base.log" | tail -1) |" \
          "$(grep -E "(ERROR|RACECHECK) SUMMARY" "$base.log" | tail -1 | sed 's/^=* *//')" >> "$san_dir.progress.txt"
      }
      export -f san_one; export san_dir
      # The slowest files first, so they do not start in the last wave.
      pick=$(echo "${SAN_FILES:-test_.*\.py}" | sed -E 's/ +/|/g')
      files=$(ls "$ROOT"/tests/test_*.py | awk '{ print ($0 ~ /test_(decode|append|plan|edge_cases)\.py$/) ? 0 : 1, $0 }' \
        | sort -s -k1,1n | cut -d' ' -f2- | grep -E "/($pick)\$")
      split=${SAN_SPLIT:-1}
      for f in $files; do
        # SAN_SPLIT_ONLY="test_a.py ...": split only these files (the small ones start faster whole).
        case " ${SAN_SPLIT_ONLY:-$(basename "$f")} " in *" $(basename "$f") "*) ;; *) continue ;; esac
        if [ "$split" -gt 1 ]; then
          # Round-robin over the collected test ids, so each chunk gets a share of every kind.
          (cd /tmp && python3 -m pytest -q --collect-only -p no:cacheprovider "$f" 2>/dev/null) | grep "::" \
            | awk -v n="$split" -v d="$san_dir" -v b="$(basename "$f" .py)" -v r="$ROOT/" \
                '{ print r $0 > (d "/" b ".c" (NR % n) ".ids") }'
        fi
      done
      jobs() {
        for f in $files; do for tool in $tools; do
          ids=$(ls "$san_dir/$(basename "$f" .py)".c*.ids 2>/dev/null)
          if [ -n "$ids" ]; then for i in $ids; do echo "$tool $f $i"; done; else echo "$tool $f"; fi
        done; done
      }
      jobs | xargs -P "${SAN_JOBS:-8}" -L 1 bash -c 'san_one "$@"' san_one
      for rcf in $(ls "$san_dir"/*.rc | sort); do
        base=${rcf%.rc}; rc=$(cat "$rcf")
        case $rc in 124|137) rc="$rc(timeout ${SAN_TIMEOUT:-420}s)" ;; esac
        last=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|deselected|error|errors|xfailed|xpassed)|no tests ran" \
          "$base.log" | tail -1)
        summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$base.log" | tail -1 | sed 's/^=* *//')
        # Child interpreters (subprocess tests) are sanitized too and print their own summaries.
        nsum=$(grep -cE "(ERROR|RACECHECK) SUMMARY" "$base.log")
        bad=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$base.log" \
          | grep -cvE "ERROR SUMMARY: 0 errors|0 hazards displayed \(0 errors, 0 warnings\)")
        extra=""; [ "$nsum" -le 1 ] && [ "$bad" -eq 0 ] || extra=" ($nsum summaries, $bad not clean)"
        leak=$(grep -E "^nanobind: leaked [0-9]+ instances" "$base.log" | head -1)
        held=$(grep -E "^mlacore leak report: [1-9]|^mlacore leak report: 0 .* and [1-9]" "$base.log" | head -1)
        echo "$(basename "$base"): rc=$rc | ${last:-no pytest summary} | ${summary:-no sanitizer summary}$extra${leak:+ | $leak}${held:+ | $held}"
      done | tee "$OUT/sanitizer-summary.txt"
      tar -czf "$OUT/sanitizer-logs.tar.gz" -C "$OUT" sanitizer && rm -rf "$san_dir"
      echo "logs: sanitizer-logs.tar.gz ($(wc -c < "$OUT/sanitizer-logs.tar.gz") bytes)" ;;
    land-check)
      # A decode kernel change's GPU checks before it lands: test_decode whole, alone on the GPU
      # (LAND_TEST_S s, default 240), while the racecheck build (-Dracecheck_barriers=true) builds
      # into /tmp/rc-site; then memcheck (5 processes) and racecheck (10, that build first on the
      # path) side by side over test_decode's tests picked by LAND_K (default "gpu and (64 or
      # seesaw)"), LAND_SAN_S s a process (default 300). Beside 15 sanitizer processes the plain
      # run crawls, hence the order. Follow with tree-ab for the A/B against the base tree.
      rm -rf /tmp/rc-site  # never racecheck an earlier invocation's build
      python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/rc-site -Csetup-args=-Dsm_targets=90a \
        -Csetup-args=-Dracecheck_barriers=true -Cbuild-dir=build/gpu-rc . > "$OUT/build-rc.txt" 2>&1 &
      rc_pid=$!
      (cd /tmp && timeout "${LAND_TEST_S:-240}" python3 -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/test_decode.py" 2>&1) \
        > "$OUT/land-test_decode.txt"
      echo "test_decode: rc=$? $(tail -1 "$OUT/land-test_decode.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/land-test_decode.txt" | head
      tools="memcheck racecheck"
      wait "$rc_pid" || { tools=memcheck; echo "land-check: the racecheck build failed (build-rc.txt): no racecheck"; }
      for tool in $tools; do
        mkdir -p "$OUT/land-$tool"
        n=$([ $tool = memcheck ] && echo 5 || echo 10)
        env OUT="$OUT/land-$tool" OUT_PACK=0 MLACORE_SKIP_BUILD=1 SAN_FILES=test_decode.py SAN_K="${LAND_K:-gpu and (64 or seesaw)}" \
          SAN_SPLIT=$n SAN_JOBS=$n SAN_TIMEOUT="${LAND_SAN_S:-300}" \
          $([ $tool = racecheck ] && echo MLACORE_SITE_FIRST=/tmp/rc-site) bash "$ROOT/tools/gpu_run.sh" "sanitizer-all:$tool" \
          > "$OUT/land-$tool.txt" 2>&1 &
      done
      wait
      cat "$OUT"/land-memcheck.txt "$OUT"/land-racecheck.txt 2>/dev/null | grep -v "^logs:" ;;
    sanitizer:*)
      for tool in memcheck racecheck; do
        (cd /tmp && timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --show-backtrace device python3 -m pytest -q -x \
          -p no:cacheprovider "$ROOT/tests" -k "${step#sanitizer:}" 2>&1) > "$OUT/sanitizer-$tool.txt"
        echo "sanitizer $tool rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/sanitizer-$tool.txt" | tail -3
      done ;;
    exitleak)
      # Who holds plans at exit under the sanitizer (research/probes/exit_leak_probe.py): without
      # it, under memcheck, and under memcheck with its host backtraces off (does collecting
      # them keep Python frames alive?). The probe's findings go to stdout.
      for mode in "plain" "memcheck" "memcheck --show-backtrace device" "memcheck --show-backtrace no"; do
        set -- $mode; pre=""; [ "$1" = plain ] || pre="compute-sanitizer --tool $*"
        echo "== $mode"
        (cd /tmp && timeout 200 $pre python3 "$ROOT/research/probes/exit_leak_probe.py" 2>&1) \
          | grep -E "^probe: (threads|[0-9]|after)|nanobind: leaked [0-9]+ instances|ERROR SUMMARY" | cut -c1-200
      done ;;
    plan-ab:*)
      # The plan bar's A/B in one run: the tree in the tarball (e.g. `git archive main -o
      # .devsnap/base.tar`, carried) built beside this one, then `bench --mode plan` five
      # times alternating (this tree first and last) and plan_latency.cu once each, so both
      # sides meet the same stretches of the machine. Worst ratios to stdout, tables in $OUT.
      base=/tmp/ab-base; rm -rf "$base" /tmp/ab-site; mkdir -p "$base"; tar -xf "${step#plan-ab:}" -C "$base"
      (cd "$base" && python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/ab-site \
        -Csetup-args=-Dsm_targets=90a -Cbuild-dir=build/gpu . > "$OUT/build-base.txt" 2>&1) || tail -20 "$OUT/build-base.txt"
      for side in new base new base new; do
        site=/tmp/site; [ $side = base ] && site=/tmp/ab-site:/tmp/site
        PYTHONPATH=$site timeout 100 python3 -m mlacore bench --mode plan >> "$OUT/plan-ab-$side.txt" 2>&1
        echo "$side: $(grep -E "bar:" "$OUT/plan-ab-$side.txt" | tail -1)"
      done
      for side in base new; do
        site=/tmp/site; [ $side = base ] && site=/tmp/ab-site:/tmp/site
        PYTHONPATH=$site nvcc -O2 -std=c++17 $(PYTHONPATH=$site python3 -m mlacore --cflags) "$ROOT/research/probes/plan_latency.cu" \
          $(PYTHONPATH=$site python3 -m mlacore --libs | sed 's/-Wl,/-Xlinker /g') -lcuda -o /tmp/pl-$side \
          && timeout 60 /tmp/pl-$side > "$OUT/plan-latency-$side.txt" 2>&1
        echo "$side plan_latency: $(grep -E "^ +[0-9]+ +[0-9.]+ " "$OUT/plan-latency-$side.txt" | awk '{printf "%s:%s ", $1, $5}')"
      done ;;
    decode-ab:*)
      # A decode kernel switch against the default in one build: `bench --mode attn` (each row
      # against fa3 in its own process) with MLACORE_DECODE_KERNEL=<value>, without, and with it
      # again, so both sides meet the same stretches of the machine. ATTN_SHAPES picks the rows
      # (default bar,long,large,multi,ragged). Geomeans to stdout, tables and JSON in $OUT.
      kernel=${step#decode-ab:}
      for side in "$kernel" default "$kernel"; do
        n=$(ls "$OUT" | grep -c "^attn-ab-$side" || true)
        env $([ "$side" = default ] && echo -u MLACORE_DECODE_KERNEL || echo MLACORE_DECODE_KERNEL=$side) \
          timeout 300 python3 -m mlacore bench --mode attn --shapes "${ATTN_SHAPES:-bar,long,large,multi,ragged}" \
          --json "$OUT/attn-ab-$side-$n.json" > "$OUT/attn-ab-$side-$n.txt" 2>&1
        echo "$side: rc=$? $(grep -E "x fa3: geomean" "$OUT/attn-ab-$side-$n.txt")"
      done ;;
    tree-ab)
      # Decode variants built as trees of their own, against this one, in one run:
      # AB_TREES="name=tarball ..." (e.g. `git archive wip/x -o .scratch/x.tar`, carried),
      # each built into /tmp/site-<name> after this tree's install (which put the build
      # wheels on the path), then `bench --mode attn --shapes $ATTN_SHAPES` (or
      # `--mode $AB_MODE`, e.g. append) alternating this tree and every variant for
      # AB_ROUNDS rounds (default 2), with MLACORE_DECODE_KERNEL=$AB_KERNEL (unset: the
      # default kernel). A variant that does not build is left out and said so, never
      # replaced by this tree. AB_THIS_KERNELS="wgmma ..." adds this tree with each of
      # those kernels as sides of its own ("this@wgmma", files tree-ab-this-at-wgmma-*: a
      # name with "@" does not come back from the device); AB_TREE_KERNELS does the same
      # for every variant ("name@seesaw").
      sides="this"
      for k in ${AB_THIS_KERNELS:-}; do sides="$sides this@$k"; done
      # The variants build side by side (a build's time is mostly its longest nvcc
      # job, so several at once fill the cores better than one after the other).
      for spec in ${AB_TREES:-}; do
        name=${spec%%=*}; tarball=${spec#*=}
        rm -rf "/tmp/src-$name" "/tmp/site-$name" "/tmp/src-$name.rc"; mkdir -p "/tmp/src-$name"; tar -xf "$tarball" -C "/tmp/src-$name"
        (cd "/tmp/src-$name" && python3 -m pip install -q --no-build-isolation --no-deps --target "/tmp/site-$name" \
           -Csetup-args=-Dsm_targets=90a -Cbuild-dir=build/gpu . > "$OUT/build-$name.txt" 2>&1
         echo $? > "/tmp/src-$name.rc") &
      done
      wait
      echo "variants built in $(( $(date +%s) - t0 )) s"
      for spec in ${AB_TREES:-}; do
        name=${spec%%=*}
        if [ "$(cat "/tmp/src-$name.rc" 2>/dev/null)" = 0 ]; then
          sides="$sides $name"
          for k in ${AB_TREE_KERNELS:-}; do sides="$sides $name@$k"; done
        else
          echo "$name: did not build ($(tail -1 "$OUT/build-$name.txt")); left out"
        fi
      done
      for r in $(seq 1 "${AB_ROUNDS:-2}"); do
        for side in $sides; do
          site=/tmp/site; kernel=${AB_KERNEL:-}
          case $side in
            this) ;;
            this@*) kernel=${side#this@} ;;
            *@*) site="/tmp/site-${side%@*}:/tmp/site"; kernel=${side#*@} ;;
            *) site="/tmp/site-$side:/tmp/site" ;;
          esac
          mode=${AB_MODE:-attn}; shapes=(); [ "$mode" = attn ] && shapes=(--shapes "${ATTN_SHAPES:-bar,long,large,multi,ragged}")
          env PYTHONPATH="$site" ${kernel:+MLACORE_DECODE_KERNEL=$kernel} timeout 300 python3 -m mlacore bench --mode "$mode" \
            "${shapes[@]}" --json "$OUT/tree-ab-${side/@/-at-}-$r.json" > "$OUT/tree-ab-${side/@/-at-}-$r.txt" 2>&1
          echo "$side ($r): rc=$? $(grep -E "x fa3: geomean|DIFFERS" "$OUT/tree-ab-${side/@/-at-}-$r.txt")"
        done
      done ;;
    ncu-decode|ncu-decode:*)
      # Where the decode kernels' warps wait: one launch each at NCU_SHAPE (default
      # "32 8192 128 64") under ncu --set full, for every MLACORE_DECODE_KERNEL value listed
      # (default "seesaw wgmma") and FlashMLA when importable, each grouped by
      # research/decode/ncu_stalls.py into $OUT/ncu-<kernel>.txt, the whole details page
      # in $OUT/ncu-<kernel>-details.txt.
      # FlashMLA: MLACORE_SITE_FIRST=$(bash tools/flashmla_build.sh | tail -1) puts it on the path.
      shape=${NCU_SHAPE:-32 8192 128 64}; kernels=${step#ncu-decode}; kernels=${kernels#:}
      for k in $(echo "${kernels:-seesaw,wgmma}" | tr ',' ' ') flashmla; do
        if [ "$k" = flashmla ]; then kind=decode-flashmla; regex="regex:splitkv_mla"; env_k=
        else kind=decode; regex="regex:mla_decode_$k"; env_k=$k; fi
        (cd "$ROOT" && MLACORE_DECODE_KERNEL=$env_k PYTHONPATH="$PYTHONPATH:$ROOT" timeout 180 ncu -k "$regex" \
          --launch-skip 2 --launch-count 1 --set full --import-source yes --clock-control none -f -o "/tmp/ncu-$k" \
          python3 research/decode/profile_cases.py $kind $shape) > "$OUT/ncu-$k-run.txt" 2>&1
        if [ -f "/tmp/ncu-$k.ncu-rep" ]; then
          ncu -i "/tmp/ncu-$k.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu-$k.csv" 2>&1
          ncu -i "/tmp/ncu-$k.ncu-rep" --page details > "$OUT/ncu-$k-details.txt" 2>&1
          { grep -E "Duration|Elapsed Cycles|Issue Slots Busy|Executed Ipc|No Eligible|Registers Per|highest-utilized|Grid Size" \
              "$OUT/ncu-$k-details.txt"
            python3 "$ROOT/research/decode/ncu_stalls.py" "/tmp/ncu-$k.csv" 16; } > "$OUT/ncu-$k.txt" 2>&1
          # NCU_KEEP_CSV=1: the per-instruction SASS table comes back too (gzipped).
          [ "${NCU_KEEP_CSV:-0}" = 1 ] && gzip -c "/tmp/ncu-$k.csv" > "$OUT/ncu-$k-sass.csv.gz"
          rm -f "/tmp/ncu-$k.ncu-rep" "/tmp/ncu-$k.csv"
          echo "ncu $k: $(grep -m1 Duration "$OUT/ncu-$k.txt" | tr -s ' ')"
        else
          echo "ncu $k: no report ($(tail -1 "$OUT/ncu-$k-run.txt"))"
        fi
      done ;;
    pair-timeline)
      # The seesaw's pair marks beside FlashMLA's (research/decode/pair_timeline.py): a timeline
      # build into /tmp/tl-site; with FLASHMLA_KIT (the kit's .tar.gz), the kit unpacked into .peer,
      # research/decode/variants/flashmla-pair-marks.patch applied and FlashMLA built beside it.
      # PAIR_SHAPES: BATCH KV HEADS triples (default "8 32768 128 32 8192 128"), page 64.
      fm=""
      if [ -n "${FLASHMLA_KIT:-}" ]; then
        rm -rf "$ROOT/.peer/flashmla" "$ROOT/build/flashmla-build"; mkdir -p "$ROOT/.peer"
        if tar -xzf "$FLASHMLA_KIT" -C "$ROOT/.peer" &&
           patch -p1 -d "$ROOT/.peer" < "$ROOT/research/decode/variants/flashmla-pair-marks.patch" > "$OUT/fm-patch.txt"; then
          (bash "$ROOT/tools/flashmla_build.sh" > /tmp/fm-pairs.out 2> "$OUT/fm-build.txt"; echo $? > /tmp/fm-pairs.rc) &
          fm_pid=$!
        else
          echo "pair-timeline: the FlashMLA kit or its patch did not apply (fm-patch.txt)"
        fi
      fi
      python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/tl-site -Csetup-args=-Dsm_targets=90a \
        -Csetup-args=-Ddecode_timeline=true -Cbuild-dir=build/gpu-timeline "$ROOT" > "$OUT/tl-build.txt" 2>&1 ||
        { echo "pair-timeline: the timeline build failed"; tail -20 "$OUT/tl-build.txt"; }
      if [ -n "${fm_pid:-}" ]; then
        wait "$fm_pid"
        [ "$(cat /tmp/fm-pairs.rc)" = 0 ] && fm=$(tail -1 /tmp/fm-pairs.out) || echo "pair-timeline: FlashMLA did not build (fm-build.txt)"
      fi
      (cd "$ROOT" && PYTHONPATH="/tmp/tl-site${fm:+:$fm}:$PYTHONPATH:$ROOT" timeout 240 python3 research/decode/pair_timeline.py \
        ${PAIR_SHAPES:-8 32768 128 32 8192 128}) > "$OUT/pair-timeline.txt" 2>&1
      echo "pair-timeline rc=$?"; tail -40 "$OUT/pair-timeline.txt" ;;
    grid)
      # The whole attn grid as docs/PERFORMANCE.md's table takes it: `bench --mode attn` over every
      # row, fa3 in the same process, GRID_ROUNDS processes (default 2), with the FlashMLA column
      # when FLASHMLA_KIT (the kit's .tar.gz) is given and builds (tools/flashmla_build.sh).
      fm=""
      if [ -n "${FLASHMLA_KIT:-}" ]; then
        if bash "$ROOT/tools/flashmla_build.sh" "$FLASHMLA_KIT" > /tmp/fm-grid.out 2> "$OUT/fm-build.txt"; then
          fm=$(tail -1 /tmp/fm-grid.out)
        else
          echo "grid: FlashMLA did not build (fm-build.txt): no FlashMLA column"
        fi
      fi
      for r in $(seq 1 "${GRID_ROUNDS:-2}"); do
        PYTHONPATH="${fm:+$fm:}$PYTHONPATH" timeout 300 python3 -m mlacore bench --mode attn --json "$OUT/grid-$r.json" \
          > "$OUT/grid-$r.txt" 2>&1
        echo "grid ($r): rc=$? $(grep -E "x fa3: geomean|x FlashMLA: geomean|DIFFERS" "$OUT/grid-$r.txt" | tr '\n' ' ')"
      done ;;
    bench:*)
      modes=""; for m in $(echo "${step#bench:}" | tr ',' ' '); do modes="$modes --mode $m"; done
      timeout 420 python3 -m mlacore bench $modes --json "$OUT/bench.json" \
        > "$OUT/bench.txt" 2> "$OUT/bench-err.txt"; echo "bench rc=$?"; tail -3 "$OUT/bench-err.txt" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
