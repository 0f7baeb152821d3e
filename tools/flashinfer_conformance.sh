#!/usr/bin/env bash
# FlashInfer's own upstream tests for the APIs mlacore mirrors, run with
# mlacore substituted for the FlashInfer names they call and no other change
# to the tests.
#
# The upstream files are third-party and not part of this repository: put
# tests/attention/test_deepseek_mla.py, tests/attention/test_mla_page.py,
# tests/attention/test_page.py and tests/test_helpers/test_helpers.py of
# flashinfer-ai/flashinfer into $MLACORE_FLASHINFER_TESTS (default:
# .peer/flashinfer_tests, ignored by git). FlashInfer itself must be
# installed (its utilities and reference paths are used); mlacore too.
#
# The substitution is a conftest.py written next to the copied tests: it
# imports FlashInfer and rebinds, in the flashinfer, flashinfer.mla and
# flashinfer.page modules, the names mlacore implements
# (BatchMLAPagedAttentionWrapper, append_paged_kv_cache,
# append_paged_mla_kv_cache, get_batch_indices_positions, get_seq_lens)
# to mlacore's, before any test module is imported. Everything else stays
# FlashInfer's.
#
# Selected (the tests of those names): test_batch_mla_varlen_page_attention,
# test_batch_mla_oob_kv_nan, test_batch_mla_page_attention,
# test_append_mla_paged_kv_cache, test_append_paged_kv_cache*. Not selected,
# because they test FlashInfer features mlacore does not offer: prefill
# (test_single_prefill_with_kv_cache, test_batch_prefill_with_ragged_kv_cache),
# head_dim_kpe=0 (test_batch_mla_without_kpe), CUTLASS (test_cutlass_mla),
# FP8 / NVFP4 caches (test_*fp8*, test_nvfp4_*), trtllm decode
# (test_dense_mla_decode_rejects_packed_uint8_cache) and FlashInfer's
# internal page module (test_get_batch_indices_positions_page_module*, and
# test_append_paged_kv_cache_with_page_module_batch_indices_positions, which
# calls that module's get_batch_indices_positions: the stored test files are
# newer than FlashInfer 0.6.4, whose compiled page module lacks it).
#
# The decode grids are huge (tens of thousands of cases): by default a
# deterministic sample of MLACORE_CONFORMANCE_PER_TEST cases per test
# function (default 120; 0 = every case), seed MLACORE_CONFORMANCE_SEED.
# FlashInfer's JIT warm-up of its own prefill/MLA kernels (which no selected
# test runs once mlacore is substituted) is skipped unless
# MLACORE_CONFORMANCE_WARMUP=1.
#
# Usage: tools/flashinfer_conformance.sh [extra pytest args]
# Results: $OUT/conformance.txt (pytest output), $OUT/conformance.xml (junit).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=${MLACORE_FLASHINFER_TESTS:-$ROOT/.peer/flashinfer_tests}
OUT=${OUT:-$ROOT/build/conformance}
mkdir -p "$OUT"
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}

for f in test_deepseek_mla.py test_mla_page.py test_page.py test_helpers.py; do
  if [ ! -f "$SRC/$f" ]; then
    echo "missing $SRC/$f (the upstream FlashInfer test files; see the header of $0)" >&2
    exit 2
  fi
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/tests/attention" "$WORK/tests/test_helpers"
cp "$SRC/test_deepseek_mla.py" "$SRC/test_mla_page.py" "$SRC/test_page.py" "$WORK/tests/attention/"
cp "$SRC/test_helpers.py" "$WORK/tests/test_helpers/test_helpers.py"

cat >"$WORK/conftest.py" <<'EOF'
"""mlacore substituted for the FlashInfer names under test, and a deterministic sample."""
import collections
import importlib
import os
import random
import sys
import types

import flashinfer
import flashinfer.mla
import flashinfer.page
import flashinfer.utils

import mlacore
import mlacore.mla
import mlacore.page

SUBSTITUTED = {
    "BatchMLAPagedAttentionWrapper": (mlacore.mla.BatchMLAPagedAttentionWrapper, (flashinfer, flashinfer.mla)),
    "append_paged_kv_cache": (mlacore.page.append_paged_kv_cache, (flashinfer, flashinfer.page)),
    "append_paged_mla_kv_cache": (mlacore.page.append_paged_mla_kv_cache, (flashinfer, flashinfer.page)),
    "get_batch_indices_positions": (mlacore.page.get_batch_indices_positions, (flashinfer, flashinfer.page)),
    "get_seq_lens": (mlacore.page.get_seq_lens, (flashinfer, flashinfer.page)),
}
for name, (impl, modules) in SUBSTITUTED.items():
    for module in modules:
        setattr(module, name, impl)

# The stored test files may be newer than the installed FlashInfer: names that only tests outside
# the selection use are stubbed when this release lacks them (calling one raises).
def _stub(qualname, value=None):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{qualname} is not in this FlashInfer release; no selected test uses it")
    return unavailable if value is None else value


for module_name, names in {
    "flashinfer.fp4_quantization": {"e2m1_and_ufp8sf_scale_to_float": None},
    "flashinfer.page": {"get_page_module": None},
    "flashinfer.utils": {"is_sm110a_supported": lambda device=None: False,
                         "is_sm100a_supported": lambda device=None: False},
}.items():
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = types.ModuleType(module_name)
        sys.modules[module_name] = module
    for name, value in names.items():
        if not hasattr(module, name):
            setattr(module, name, _stub(f"{module_name}.{name}", value))

if os.environ.get("MLACORE_CONFORMANCE_WARMUP") != "1":
    # The warm-up fixture compiles FlashInfer's own kernels; the selected tests run mlacore's.
    flashinfer.utils.has_flashinfer_jit_cache = lambda: True


def pytest_report_header(config):
    return [f"mlacore {mlacore.__version__} substituted for: {', '.join(SUBSTITUTED)} "
            f"(flashinfer {getattr(flashinfer, '__version__', '?')})"]


def pytest_collection_modifyitems(config, items):
    per_test = int(os.environ.get("MLACORE_CONFORMANCE_PER_TEST", "120"))
    if per_test <= 0:
        return
    rng = random.Random(int(os.environ.get("MLACORE_CONFORMANCE_SEED", "0")))
    groups = collections.OrderedDict()
    for item in items:
        groups.setdefault(item.nodeid.split("[")[0], []).append(item)
    keep, drop = [], []
    for group in groups.values():
        chosen = set(id(i) for i in (group if len(group) <= per_test else rng.sample(group, per_test)))
        for item in group:
            (keep if id(item) in chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
EOF

SELECT_DECODE="test_batch_mla_varlen_page_attention or test_batch_mla_oob_kv_nan or test_batch_mla_page_attention"
cd "$WORK"
set +e
PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -p no:cacheprovider -q -rfEs \
  --junitxml="$OUT/conformance.xml" \
  "tests/attention/test_deepseek_mla.py" -k "$SELECT_DECODE" \
  "$@" 2>&1 | tee "$OUT/conformance.txt"
rc1=${PIPESTATUS[0]}
PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -p no:cacheprovider -q -rfEs \
  --junitxml="$OUT/conformance_page.xml" \
  "tests/attention/test_mla_page.py" "tests/attention/test_page.py" \
  -k "(test_append_mla_paged_kv_cache or test_append_paged_kv_cache) and not page_module" \
  "$@" 2>&1 | tee "$OUT/conformance_page.txt"
rc2=${PIPESTATUS[0]}
set -e
echo "decode tests: exit $rc1; append tests: exit $rc2 (results in $OUT)"
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]
