import gc
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

import mlacore

HAS_CUDA = torch.cuda.is_available() and mlacore.built_with("cuda")
CUDA_SKIP_REASON = (
    "no CUDA device" if not torch.cuda.is_available() else "mlacore built without CUDA"
)

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=requires_cuda)])
def device(request):
    """Runs a test on the CPU and, where available, on the GPU."""
    return torch.device(request.param)


# --- hypothesis profiles ---------------------------------------------------------------
# MLACORE_HYPOTHESIS_PROFILE=sanitizer (set by the sanitizer-all step of
# tools/gpu_run.sh): under compute-sanitizer every launch costs
# milliseconds, so every property test runs at most this many examples, its
# own @settings(max_examples=...) notwithstanding (see
# pytest_collection_modifyitems), with no deadline and no example database
# shared between the parallel processes.
settings.register_profile("sanitizer", max_examples=15, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HYPOTHESIS_PROFILE = os.environ.get("MLACORE_HYPOTHESIS_PROFILE")
if HYPOTHESIS_PROFILE:
    settings.load_profile(HYPOTHESIS_PROFILE)  # an unknown name raises


# Under the sanitizer profile the threaded tests keep their shape (as many
# threads at once, each with its own plan, wrapper or op) but repeat less:
# each launch costs milliseconds there, and 18 threads x 3 rounds of plan +
# decode overran 200-450 s per process.
UNDER_SANITIZER = HYPOTHESIS_PROFILE == "sanitizer"


def repeats(normal: int, sanitizer: int = 1) -> int:
    """How many times a threaded test repeats its work: fewer under the sanitizer."""
    return sanitizer if UNDER_SANITIZER else normal


def pytest_report_header(config):
    if HYPOTHESIS_PROFILE:
        return (f"mlacore: hypothesis profile {HYPOTHESIS_PROFILE!r}: at most "
                f"{settings.default.max_examples} examples per property test")
    return None


def pytest_collection_modifyitems(config, items):
    if not HYPOTHESIS_PROFILE:
        return
    # A test's explicit @settings override any profile, so the profile's
    # max_examples is applied as a cap to the settings @given stored on the test.
    cap = settings.default.max_examples
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if getattr(test, "hypothesis", None) is None or not isinstance(own, settings):
            continue
        if own.max_examples > cap or own.deadline is not None:
            test._hypothesis_internal_use_settings = settings(own, max_examples=min(own.max_examples, cap),
                                                              deadline=None)


# --- what still holds plans after the last test ------------------------------------------
# MLACORE_LEAK_REPORT=1 (set by sanitizer-all): nanobind's exit check says only
# that Plan instances outlived the interpreter ("nanobind: leaked N
# instances!"); this lists the MlaPlan / wrapper objects still alive once the
# session is over, and a chain of referrers of each: who kept them.

def pytest_terminal_summary(terminalreporter):
    if os.environ.get("MLACORE_LEAK_REPORT") == "1":
        for line in _live_plan_report():
            terminalreporter.write_line(line)


def _live_plan_report(limit=5, depth=8):
    from mlacore import _mlacore

    gc.collect()
    objects = gc.get_objects()
    before = {id(o) for o in objects}  # referrers made by this report itself are not in it
    watched = (mlacore.MlaPlan, mlacore.BatchMLAPagedAttentionWrapper)
    live = [o for o in objects if issubclass(type(o), watched)]
    # _mlacore.Plan is not tracked by the cycle collector: count the ones tracked objects hold.
    cores = len({id(r) for o in objects for r in gc.get_referents(o) if type(r) is _mlacore.Plan})
    del objects
    lines = [f"mlacore leak report: {len(live)} MlaPlan/wrapper objects and {cores} Plan cores alive after the "
             "last test"]
    for obj in live[:limit]:
        chain, seen = [_describe(obj)], {id(obj)}
        for _ in range(depth):
            refs = [r for r in gc.get_referrers(obj) if id(r) in before and id(r) not in seen]
            if not refs:
                break
            obj = refs[0]
            seen.add(id(obj))
            chain.append(_describe(obj))
            if isinstance(obj, dict) and "__builtins__" in obj:
                break  # a module's globals
        if len(chain) == 1:
            chain.append("nothing the collector sees (a C extension's reference)")
        lines.append("  " + " <- ".join(chain))
    return lines


def _describe(obj):
    if type(obj).__name__ == "frame":
        return f"frame {obj.f_code.co_name} ({obj.f_code.co_filename}:{obj.f_lineno})"
    if isinstance(obj, dict) and "__builtins__" in obj:
        return f"globals of {obj.get('__name__')}"
    if isinstance(obj, dict):
        return f"dict with keys {sorted(map(str, obj))[:6]}"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def kernels_in_fresh_process(script: str, switch: str, value, ignore=()) -> set:
    """The kernel kinds a test script's "kernels:" line names, run in a fresh interpreter.

    Kernel switches (MLACORE_DECODE_KERNEL, MLACORE_APPEND_KERNEL) are read once per process,
    so each setting needs its own: `switch` is set to `value` (removed when None), and
    MLACORE_TESTS_DIR tells the script where to import the tests from. The script checks its
    own results; `ignore` drops kinds the caller does not assert on. Skips when the profiler
    saw no kernels because compute-sanitizer hides them from CUPTI."""
    env = dict(os.environ, MLACORE_TESTS_DIR=os.path.dirname(os.path.abspath(__file__)))
    env.pop(switch, None)
    if value is not None:
        env[switch] = value
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         check=False, env=env, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("kernels:")]  # the profiler logs too
    assert len(line) == 1, res.stdout + res.stderr
    ran = set(line[0].split()[1:]) - set(ignore)
    if UNDER_SANITIZER and not ran:
        pytest.skip("results checked; under compute-sanitizer the profiler sees no kernels to name")
    return ran
