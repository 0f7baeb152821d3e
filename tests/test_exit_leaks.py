"""Nothing of mlacore's outlives the interpreter.

nanobind checks at exit that every instance of a bound class (here
`mlacore._mlacore.Plan`, the core of `MlaPlan`) was freed, and prints
"nanobind: leaked N instances!" otherwise. A fresh interpreter builds and uses
plans and wrappers the ways engines and tests do (module globals, locals,
failed calls, threads, a reference cycle, a torch.Tensor subclass and a wrong
argument's class, the __dlpack__ fallback), on every device there is, then
leaks one sentinel Plan on purpose: the report must name exactly that one,
which also proves the check is live.
"""

import os
import re
import subprocess
import sys

import pytest

SCRIPT = r'''
import ctypes, gc, threading
import numpy as np
import torch
import mlacore

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and mlacore.built_with("cuda") else [])


class Indices(torch.Tensor):
    """A tensor subclass defined here: its type enters the binding's exchange-API cache,
    and its methods' __globals__ are this module's, which hold plans."""

    def plans(self):
        return PLANS


class NotATensor:
    def plans(self):
        return PLANS


def batch(device):
    qo = torch.tensor([0, 1, 3], dtype=torch.int32, device=device)
    kv = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    kv_len = torch.tensor([20, 5], dtype=torch.int32, device=device)
    return qo, kv, kv_len


def use_wrapper(device):
    qo, kv, kv_len = batch(device)
    idx = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(8 << 20, dtype=torch.uint8, device=device))
    w.plan(qo, kv, idx, kv_len, 2, 512, 64, 16, True, 0.1, torch.bfloat16, torch.bfloat16)
    q = torch.randn(3, 2, 576, device=device).to(torch.bfloat16)
    cache = torch.randn(3, 16, 576, device=device).to(torch.bfloat16)
    out, lse = w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], return_lse=True)
    try:
        w.run(q[..., :512], q[..., 512:], cache[..., :512].float(), cache[..., 512:])
    except ValueError:
        pass
    return w, out


PLANS, WRAPPERS = [], []  # module globals hold plans and wrappers, as an engine's modules do
for device in DEVICES:
    plan = mlacore.MlaPlan(device, max_batch=4)
    qo, kv, kv_len = batch(device)
    plan.build(qo.as_subclass(Indices), kv, kv_len, 16, 16)
    assert plan.info.batch == 2 and plan.stats is not None
    try:
        plan.build(NotATensor(), kv, kv_len, 16, 16)
    except TypeError:
        pass
    try:
        plan.build(qo, kv, torch.tensor([-1, 5], dtype=torch.int32, device=device), 16, 16)
    except ValueError:
        pass
    if device == "cpu":  # the __dlpack__ fallback (numpy has no exchange API)
        plan.build(qo.numpy(), kv.numpy(), np.array([20, 5], dtype=np.int32), 16, 16)
    PLANS.append(plan)
    WRAPPERS.append(use_wrapper(device))
    cycle = {"plan": mlacore.MlaPlan(device, max_batch=2)}
    cycle["self"] = cycle  # only the cycle collector frees it

    def work():
        p = mlacore.MlaPlan(device, max_batch=4)
        for _ in range(3):
            p.build(*batch(device), 16, 16)
        use_wrapper(device)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del cycle

SENTINEL = mlacore.MlaPlan("cpu", max_batch=3)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(SENTINEL._plan))  # the one leak the report must show
print("devices:", " ".join(DEVICES), flush=True)
'''


# The script's threads launch kernels at once: racecheck stalls on that (RELIABILITY.md).
@pytest.mark.concurrent
def test_no_plan_outlives_the_interpreter():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ), cwd="/")
    assert res.returncode == 0 and "devices: cpu" in res.stdout, res.stdout + res.stderr
    report = res.stderr
    # nanobind's report, printed after Python has shut down: exactly the sentinel.
    counts = re.findall(r"nanobind: leaked (\d+) instances!", report)
    assert counts == ["1"], f"expected only the sentinel Plan to leak, nanobind says:\n{report}"
    leaked = re.findall(r'leaked instance \S+ of type "([^"]+)"', report)
    assert leaked == ["mlacore._mlacore.Plan"], report
    assert "keep_alive" not in report, report
