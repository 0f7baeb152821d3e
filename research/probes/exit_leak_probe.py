"""Who holds plans at exit? A diagnostic for the sanitizer-only leak report.

Runs test_exit_leaks' script (with --no-threads: its thread workers called
from the main thread instead), then lists every live MlaPlan / wrapper beyond
the ones the script keeps in module globals, and for each the chain of
referrers the cycle collector can see (types, frame names, whether a frame is
still executing), plus the threads Python still knows of. Without the
sanitizer only the script's own globals hold plans; under compute-sanitizer
nanobind reports more at exit. Run it both ways:
  python3 research/probes/exit_leak_probe.py [--no-threads]
  compute-sanitizer --tool memcheck python3 research/probes/exit_leak_probe.py [--no-threads]
"""
import gc
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from test_exit_leaks import SCRIPT  # noqa: E402

script = SCRIPT
if "--no-threads" in sys.argv:
    script = script.replace("for t in threads:\n        t.start()", "for _ in threads:\n        work()")
    script = script.replace("for t in threads:\n        t.join()", "pass")
    assert script != SCRIPT
exec(compile(script, "<test_exit_leaks.SCRIPT>", "exec"), globals())  # noqa: S102

import mlacore  # noqa: E402


def describe(o):
    if type(o).__name__ == "frame":
        try:
            o.clear()
            state = "not executing"
        except RuntimeError:
            state = "EXECUTING"
        return f"frame {o.f_code.co_name}:{o.f_lineno} ({state})"
    if isinstance(o, dict):
        return f"dict{sorted(map(str, o))[:5]}"
    if isinstance(o, (list, tuple)):
        return f"{type(o).__name__}[{len(o)}]"
    return type(o).__qualname__


gc.collect()
watched = (mlacore.MlaPlan, mlacore.BatchMLAPagedAttentionWrapper)
kept = {id(x) for x in PLANS} | {id(x) for pair in WRAPPERS for x in pair} | {id(SENTINEL)}  # noqa: F821
kept |= {id(w._plan) for w, _ in WRAPPERS if getattr(w, "_plan", None) is not None}  # noqa: F821
objs = gc.get_objects()
extra = [o for o in objs if issubclass(type(o), watched) and id(o) not in kept]
print(f"probe: threads alive {[t.name for t in threading.enumerate()]}, "
      f"current frames of {len(sys._current_frames())} threads, gc.garbage {len(gc.garbage)}")
print(f"probe: {len(extra)} plans/wrappers beyond the script's globals")
skip = {id(objs), id(extra)}
for o in extra[:6]:
    chain, cur, seen = [describe(o)], o, {id(o)}
    for _ in range(6):
        refs = [r for r in gc.get_referrers(cur) if id(r) not in skip and id(r) not in seen]
        if not refs:
            chain.append(f"(no tracked referrer; refcount {sys.getrefcount(cur) - 1})")
            break
        chain.append(" | ".join(describe(r) for r in refs[:3]))
        cur = refs[0]
        seen.add(id(cur))
    print("probe:   " + " <- ".join(chain))
del objs, extra
gc.collect()
left = sum(issubclass(type(o), watched) and id(o) not in kept for o in gc.get_objects())
print(f"probe: after clearing those frames: {left} beyond the globals", flush=True)
