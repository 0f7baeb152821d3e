#!/usr/bin/env bash
# The whole test suite, against the installed mlacore and the build directory
# that `pip install -Cbuild-dir=build/wheel .` left behind:
#   pytest, meson test (C++ tests), a C++ consumer through pkg-config and
#   through CMake, the C++ tests under ASan+UBSan, and the HIP compile check.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD=${MLACORE_BUILD_DIR:-build/wheel}
step() { printf '\n=== %s\n' "$*"; }

step "pytest"
$PY -m pytest -q tests

step "meson test ($BUILD)"
meson test -C "$BUILD" --print-errorlogs

step "C++ consumer via pkg-config"
mkdir -p build/consumer
PKG_CONFIG_PATH="$($PY -m mlacore --pkgconfigdir)" \
  sh -c 'c++ -std=c++17 tests/consumer/consumer.cpp $(pkg-config --cflags --libs mlacore) -o build/consumer/consumer-pc'
build/consumer/consumer-pc

step "C++ consumer via CMake"
cmake -S tests/consumer -B build/consumer/cmake -Dmlacore_DIR="$($PY -m mlacore --cmakedir)" >/dev/null
cmake --build build/consumer/cmake >/dev/null
build/consumer/cmake/consumer

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU paths)"
if [ ! -d build/asan ]; then
  meson setup build/asan -Dgpu=none -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized >/dev/null
fi
ninja -C build/asan >/dev/null
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 meson test -C build/asan --print-errorlogs

step "HIP compile check"
if command -v hipcc >/dev/null; then
  [ -d build/hip ] || meson setup build/hip -Dgpu=hip -Dtests=false | tail -4
  ninja -C build/hip
  echo "HIP build of libmlacore: ok ($(hipcc --version | head -1))"
else
  echo "skipped: hipcc not found (apt-get install hipcc libamdhip64-dev rocm-device-libs)"
fi
echo
echo "tests/run.sh: all steps passed"
