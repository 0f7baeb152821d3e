"""Who holds plans at exit? A diagnostic for the sanitizer-only leak report.

Runs test_exit_leaks' script, then lists every live MlaPlan / wrapper and,
for each frame that refers to one, whether that frame is still executing
(frame.clear() refuses an executing frame), which thread runs it, its
reference count and the types of the referrers the collector can see.
Under compute-sanitizer, nanobind reports plans alive at exit that frames of
returned calls hold; without it nothing leaks. Run it both ways:
  python3 tests/gpu/exit_leak_probe.py
  compute-sanitizer --tool memcheck python3 tests/gpu/exit_leak_probe.py
"""
import gc
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from test_exit_leaks import SCRIPT  # noqa: E402

exec(compile(SCRIPT, "<test_exit_leaks.SCRIPT>", "exec"), globals())

import mlacore  # noqa: E402

gc.collect()
watched = (mlacore.MlaPlan, mlacore.BatchMLAPagedAttentionWrapper)
objs = gc.get_objects()
live = [o for o in objs if issubclass(type(o), watched)]
frames = [o for o in objs if type(o).__name__ == "frame"]
running = {}
for tid, top in sys._current_frames().items():
    f = top
    while f is not None:
        running[id(f)] = tid
        f = f.f_back
names = {t.ident: t.name for t in threading.enumerate()}
print(f"probe: {len(live)} live plans/wrappers, {len(frames)} frames tracked, threads {sorted(names.values())}")
for o in live[:8]:
    holders = [r for r in gc.get_referrers(o) if r is not objs and r is not live]
    print(f"probe: {type(o).__name__} refcount={sys.getrefcount(o)} held by {[type(r).__name__ for r in holders]}")
    for r in holders:
        if type(r).__name__ == "dict":
            for rr in gc.get_referrers(r):
                if type(rr).__name__ == "frame":
                    r = rr
        if type(r).__name__ != "frame":
            continue
        code = r.f_code
        try:
            r.clear()
            state = "cleared (was suspended or returned)"
        except RuntimeError as e:
            state = f"executing ({e})"
        owners = [type(x).__name__ for x in gc.get_referrers(r) if x is not objs and x is not frames and x is not holders]
        print(f"probe:   frame {code.co_name} ({code.co_filename}:{r.f_lineno}) refcount={sys.getrefcount(r)} "
              f"thread={names.get(running.get(id(r)), running.get(id(r)))} {state} referrers={owners}")
del objs, frames, live
gc.collect()
print("probe: after clearing frames:",
      sum(issubclass(type(o), watched) for o in gc.get_objects()), "plans/wrappers live", flush=True)
