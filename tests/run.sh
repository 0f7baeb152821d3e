#!/usr/bin/env bash
# The whole test suite, against the installed mlacore and the build directory
# that `pip install -Cbuild-dir=build/wheel -Csetup-args=-Dtests=true .` left
# behind: pytest, meson test (C++ tests), a type check of an example against
# the installed stubs, a C++ consumer through pkg-config and through CMake, the
# C++ decode example (examples/cpp_decode, when nvcc is present), the C++ tests
# under ASan+UBSan, and the HIP compile check.
#
# Every tool comes from the Python that has mlacore installed (PYTHON, default
# python3): meson, ninja, nanobind and mypy from the test extra, whatever other
# meson is on PATH. A failing step prints its name, the command and its output.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD=${MLACORE_BUILD_DIR:-build/wheel}
STEP="start"
LOGS=build/test-logs
mkdir -p "$LOGS"
step() { STEP="$*"; printf '\n=== %s\n' "$*"; }
trap 'rc=$?; printf "\ntests/run.sh: FAILED at step \"%s\" (exit status %d)\n" "$STEP" "$rc" >&2' ERR
die() { printf 'tests/run.sh: %s\n' "$*" >&2; exit 1; }
# quiet NAME CMD...: runs CMD with its output in build/test-logs/NAME.log,
# shown only when CMD fails.
quiet() {
  local log="$LOGS/$1.log"; shift
  if ! "$@" > "$log" 2>&1; then
    printf 'tests/run.sh: command failed: %s\n--- last lines of %s:\n' "$*" "$log" >&2
    tail -n 60 "$log" >&2
    return 1
  fi
}

step "preflight: tools of $PY"
command -v "$PY" >/dev/null || die "no Python '$PY' on PATH (set PYTHON=/path/to/python)"
# The test extra's console scripts (meson, ninja) sit next to this Python's
# other scripts: put them first, so a meson or ninja of another Python on PATH
# is never the one used.
SCRIPTS=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$SCRIPTS:$(dirname "$(command -v "$PY")"):$PATH"
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"mlacore": "mlacore itself", "pytest": "pytest", "hypothesis": "hypothesis", "mesonbuild": "meson",
        "ninja": "ninja", "nanobind": "nanobind", "mypy": "mypy"}
print(" ".join(f"{mod}({what})" for mod, what in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
[ -z "$missing" ] || die "$PY lacks: $missing. Install the test extra into it: pip install -Cbuild-dir=$BUILD -Csetup-args=-Dtests=true \".[test]\""
MESON=("$PY" -m mesonbuild.mesonmain)
echo "python $("$PY" -c 'import sys; print(sys.executable)'), meson $("${MESON[@]}" --version), ninja $(ninja --version)"

step "pytest"
"$PY" -m pytest -q tests

step "meson test ($BUILD)"
[ -f "$BUILD/build.ninja" ] || die "$BUILD is not a meson build directory: install with -Cbuild-dir=$BUILD (see the README's test command)"
grep -q "^build tests/cpp/test_runtime" "$BUILD/build.ninja" ||
  die "$BUILD has no C++ tests: install with -Csetup-args=-Dtests=true (see the README's test command)"
"${MESON[@]}" test -C "$BUILD" --print-errorlogs

step "type check of an example against the installed stubs (mypy)"
"$PY" -m mypy --config-file pyproject.toml tests/typing/example.py

step "C++ consumer via pkg-config"
mkdir -p build/consumer
PCDIR=$("$PY" -m mlacore --pkgconfigdir)
quiet consumer-pc sh -c "c++ -std=c++17 tests/consumer/consumer.cpp \$(PKG_CONFIG_PATH='$PCDIR' pkg-config --cflags --libs mlacore) -o build/consumer/consumer-pc"
build/consumer/consumer-pc

step "C++ consumer via CMake"
CMAKEDIR=$("$PY" -m mlacore --cmakedir)
quiet consumer-cmake-configure cmake -S tests/consumer -B build/consumer/cmake -Dmlacore_DIR="$CMAKEDIR"
quiet consumer-cmake-build cmake --build build/consumer/cmake
build/consumer/cmake/consumer

step "C++ decode example (examples/cpp_decode)"
if command -v nvcc >/dev/null; then
  quiet cpp-decode-pc env PKG_CONFIG_PATH="$PCDIR" make -B -C examples/cpp_decode BUILD="$PWD/build/cpp_decode"
  quiet cpp-decode-cmake-configure cmake -S examples/cpp_decode -B build/cpp_decode/cmake -Dmlacore_DIR="$CMAKEDIR"
  quiet cpp-decode-cmake-build cmake --build build/cpp_decode/cmake
  echo "built through pkg-config and CMake"
  # --host: the program's whole flow with both sides on the CPU. Then the GPU
  # run, which exits 77 without a CUDA device (the GPU suite runs it there).
  quiet cpp-decode-host build/cpp_decode/cpp_decode --host 16 2
  echo "--host run: ok"
  rc=0; build/cpp_decode/cmake/cpp_decode || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || { STEP="C++ decode example: GPU run"; false; }
else
  echo "skipped: nvcc not found (the example needs the CUDA toolkit to compile)"
fi

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU paths)"
# A build directory is reused only when this script set it up completely with
# this meson; anything else (half made, another meson) is set up again.
ASAN=build/asan
ASAN_ARGS=(-Dgpu=none -Dtests=true -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized)
stamp="$("$PY" -c 'import sys; print(sys.executable)') meson $("${MESON[@]}" --version) ${ASAN_ARGS[*]}"
if [ ! -f "$ASAN/.run-sh-stamp" ] || [ "$(cat "$ASAN/.run-sh-stamp")" != "$stamp" ]; then
  rm -rf "$ASAN"
  quiet asan-setup "${MESON[@]}" setup "$ASAN" "${ASAN_ARGS[@]}"
  echo "$stamp" > "$ASAN/.run-sh-stamp"
fi
quiet asan-build ninja -C "$ASAN"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  "${MESON[@]}" test -C "$ASAN" --print-errorlogs

step "HIP compile check"
if command -v hipcc >/dev/null; then
  if [ ! -f build/hip/.run-sh-stamp ]; then
    rm -rf build/hip
    quiet hip-setup "${MESON[@]}" setup build/hip -Dgpu=hip -Dtests=false
    touch build/hip/.run-sh-stamp
  fi
  quiet hip-build ninja -C build/hip core/libmlacore.so.0
  echo "HIP build of libmlacore: ok ($(hipcc --version | head -1))"
else
  echo "skipped: hipcc not found (apt-get install hipcc libamdhip64-dev rocm-device-libs)"
fi
echo
echo "tests/run.sh: all steps passed"
