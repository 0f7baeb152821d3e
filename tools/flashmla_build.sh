#!/usr/bin/env bash
# Builds FlashMLA (deepseek-ai/FlashMLA, sm_90a, bf16) for the FlashMLA column of
# `python -m mlacore bench --mode attn`, on the GPU machine, from a source kit
# unpacked at .peer/flashmla in the repository root (a directory holding build.sh
# and src/; never committed). The kit's build.sh compiles offline against the
# installed torch (about 2 minutes on 16 cores) and installs `flash_mla` into a
# site folder, here build/flashmla-site (under the git-ignored build/, so it
# stays out of the tree and a rerun is incremental from build/flashmla-build).
#
#   bash tools/flashmla_build.sh [KIT.tar.gz]     # KIT: unpacked into .peer/ first
#
# The last line of stdout is the PYTHONPATH entry to prepend, e.g.
#   export PYTHONPATH=$(bash tools/flashmla_build.sh | tail -1):$PYTHONPATH
#   python3 -m mlacore bench --mode attn
# Exit status: the kit's (non-zero: no FlashMLA; the bench then runs without the column).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIT="$ROOT/.peer/flashmla"
if [ $# -ge 1 ]; then
  mkdir -p "$ROOT/.peer" && tar -xzf "$1" -C "$ROOT/.peer" || { echo "flashmla_build: cannot unpack $1" >&2; exit 2; }
fi
if [ ! -f "$KIT/build.sh" ]; then
  echo "flashmla_build: no kit at .peer/flashmla (expected .peer/flashmla/build.sh and src/)" >&2
  exit 2
fi
export FLASHMLA_SITE="${FLASHMLA_SITE:-$ROOT/build/flashmla-site}"
export FLASHMLA_BUILD_DIR="${FLASHMLA_BUILD_DIR:-$ROOT/build/flashmla-build}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
t0=$(date +%s)
# The kit's log to stderr, so stdout carries only the path.
bash "$KIT/build.sh" 1>&2
rc=$?
if [ $rc -ne 0 ]; then
  echo "flashmla_build: the kit's build.sh exited $rc after $(( $(date +%s) - t0 )) s" >&2
  exit $rc
fi
echo "flashmla_build: built in $(( $(date +%s) - t0 )) s; prepend this to PYTHONPATH:" >&2
echo "$FLASHMLA_SITE"
