"""The AITER routes through the Python API, against the fake AITER that
meson builds for the C++ contract test (tests/cpp/fake_aiter.cpp).

Only possible on the CPU through the contract-test hook
MLACORE_AITER_CPU_CONTRACT=1, which lets the route's device gate accept CPU
tensors; both it and MLACORE_AITER_LIB are read once per process, so the
checks run in a fresh interpreter. The fake computes the split partials the
way AITER's stage-1 kernel leaves them, so this proves the wrapper and the
appends reach the route, pass the arguments it documents and get the native
results. tests/cpp/test_aiter_routes.cpp checks the routes in detail.
"""

import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import mlacore

REPO = pathlib.Path(__file__).resolve().parent.parent


def fake_aiter():
    """The good fake in the build directory tests/run.sh uses, if built there."""
    build = pathlib.Path(os.environ.get("MLACORE_BUILD_DIR", REPO / "build" / "wheel"))
    if not build.is_absolute():
        build = REPO / build
    lib = build / "tests" / "cpp" / "libfake_aiter_good.so"
    return lib if lib.is_file() else None


SCRIPT = r'''
import math, torch, mlacore

info = mlacore.backends()["aiter"]
assert info["available"] and info["abi_version"] == 1, info
assert info["entry_points"] == ["mla_decode_stage1_asm_fwd", "aiter_concat_and_cache_mla",
                                "aiter_reshape_and_cache_flash"], info

def batch(separate=False):
    g = torch.Generator().manual_seed(0)
    heads, page_size, kv_lens = 16, 16, [100, 37, 0, 300]
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + 2
    kv_indices = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    qo_indptr = torch.arange(len(kv_lens) + 1, dtype=torch.int32)
    kv_len = torch.tensor(kv_lens, dtype=torch.int32)
    q_nope = torch.randn(len(kv_lens), heads, 512, generator=g).bfloat16()
    q_pe = torch.randn(len(kv_lens), heads, 64, generator=g).bfloat16()
    buf = (torch.randn(num_pages, page_size, 576, generator=g) * 0.5).bfloat16()
    ckv, kpe = torch.split(buf, [512, 64], dim=-1)
    if separate:
        ckv, kpe = ckv.contiguous(), kpe.contiguous()
    return heads, page_size, qo_indptr, kv_indptr, kv_indices, kv_len, q_nope, q_pe, ckv, kpe

def decode(backend, separate=False):
    heads, page_size, qo, kvp, idx, kv_len, q_nope, q_pe, ckv, kpe = batch(separate)
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(64 << 20, dtype=torch.uint8), backend=backend)
    w.plan(qo, kvp, idx, kv_len, heads, 512, 64, page_size, True, 1 / math.sqrt(192), torch.bfloat16,
           torch.bfloat16)
    return w.run(q_nope, q_pe, ckv, kpe, return_lse=True)

out_n, lse_n = decode("native")
out_a, lse_a = decode("aiter")
out_auto, lse_auto = decode("auto")
assert torch.equal(out_a, out_auto) and torch.equal(lse_a, lse_auto)  # auto took the AITER route
assert (out_a.float() - out_n.float()).abs().max().item() < 8e-3
fin = torch.isfinite(lse_n)
assert torch.equal(fin, torch.isfinite(lse_a)) and (lse_a[~fin] == -math.inf).all()
assert (lse_a[fin] - lse_n[fin]).abs().max().item() < 1e-4  # base 2, like the native LSE
assert torch.equal(out_a[2], torch.zeros_like(out_a[2]))  # the request without KV
try:
    decode("aiter", separate=True)
    raise AssertionError("separate caches reached AITER")
except ValueError as e:
    assert "backend='aiter' cannot run this call: ckv_cache and kpe_cache are not the two halves" in str(e), e
out_s = decode("auto", separate=True)[0]  # native, silently
assert torch.equal(out_s, out_n)

# Cache writes: the routed append writes what the native one does.
g = torch.Generator().manual_seed(1)
ckv_src = torch.randn(5, 512, generator=g).bfloat16()
kpe_src = torch.randn(5, 64, generator=g).bfloat16()
bi = torch.tensor([0, 0, 1, 1, 9], dtype=torch.int32)   # the last token is out of range: skipped
pos = torch.tensor([0, 5, 1, 2, 0], dtype=torch.int32)
idx, ptr, last = (torch.tensor(v, dtype=torch.int32) for v in ([3, 1, 0], [0, 2, 3], [2, 3]))
caches = {}
for backend in ("native", "aiter"):
    buf = torch.zeros(4, 4, 576, dtype=torch.bfloat16)
    ckv, kpe = torch.split(buf, [512, 64], dim=-1)
    mlacore.append_paged_mla_kv_cache(ckv_src, kpe_src, bi, pos, ckv, kpe, idx, ptr, last, backend=backend)
    caches[backend] = buf
assert torch.equal(caches["native"], caches["aiter"]) and caches["aiter"].abs().sum() > 0
key = torch.randn(5, 2, 64, generator=g).half()
kv = {b: torch.zeros(4, 2, 4, 2, 64, dtype=torch.float16) for b in ("native", "aiter")}
for backend, cache in kv.items():
    mlacore.append_paged_kv_cache(key, key, bi, pos, cache, idx, ptr, last, backend=backend)
assert torch.equal(kv["native"], kv["aiter"]) and kv["aiter"].abs().sum() > 0
print("aiter route: ok")
'''


def test_python_layer_reaches_the_aiter_routes():
    lib = fake_aiter()
    if lib is None:
        pytest.skip("the fake AITER is built by meson with the C++ tests (set MLACORE_BUILD_DIR to the build "
                    "directory of the installed mlacore, default build/wheel)")
    env = dict(os.environ, MLACORE_AITER_LIB=str(lib), MLACORE_AITER_CPU_CONTRACT="1")
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env,
                         cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "aiter route: ok" in res.stdout


def test_without_the_hook_cpu_tensors_never_reach_aiter():
    lib = fake_aiter()
    if lib is None:
        pytest.skip("the fake AITER is built by meson with the C++ tests")
    script = r'''
import torch, mlacore
assert mlacore.backends()["aiter"]["available"]
buf = torch.zeros(4, 4, 576, dtype=torch.bfloat16)
ckv, kpe = torch.split(buf, [512, 64], dim=-1)
i32 = lambda v: torch.tensor(v, dtype=torch.int32)
args = (torch.ones(1, 512).bfloat16(), torch.ones(1, 64).bfloat16(), i32([0]), i32([0]), ckv, kpe, i32([0]),
        i32([0, 1]), i32([1]))
mlacore.append_paged_mla_kv_cache(*args)  # auto: native
try:
    mlacore.append_paged_mla_kv_cache(*args, backend="aiter")
    raise AssertionError("a CPU tensor reached AITER")
except ValueError as e:
    assert "not a HIP device (the cache is on cpu)" in str(e), e
print("ok")
'''
    env = dict(os.environ, MLACORE_AITER_LIB=str(lib))
    env.pop("MLACORE_AITER_CPU_CONTRACT", None)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr


# --- on an AMD GPU with a real AITER (never run here: no AMD GPU) ------------------------
# A ROCm build of mlacore (-Dgpu=hip), ROCm torch, and MLACORE_AITER_LIB
# pointing at the shim of docs/AITER.md. ROCm torch calls its GPUs "cuda".

HAS_ROCM_AITER = (torch.version.hip is not None and torch.cuda.is_available() and mlacore.built_with("hip")
                  and mlacore.backends()["aiter"]["available"])
requires_rocm_aiter = pytest.mark.skipif(
    not HAS_ROCM_AITER, reason="needs a ROCm GPU, a -Dgpu=hip build and an AITER library (MLACORE_AITER_LIB, "
                               "docs/AITER.md); AITER: " + mlacore.backends()["aiter"].get("reason", "available"))


@requires_rocm_aiter
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads,qo_lens", [(16, [1, 1, 1, 1]), (128, [1, 1, 1]), (16, [2, 1, 2]), (128, [4, 4])])
def test_rocm_aiter_decode_matches_reference(page_size, heads, qo_lens):
    from test_decode import check, make_batch, run_wrapper

    kv_lens = [70, 5, 513, 2000][: len(qo_lens)]  # at least qo_len: no query sees no key
    d = make_batch(kv_lens, qo_lens, page_size, heads, torch.bfloat16, "cuda", seed=heads + page_size)
    causal = True  # AITER masks causally inside a request; with one token it makes no difference
    (out, lse), scale = run_wrapper(d, causal=causal, backend="aiter")
    err = check(d, out, lse, scale, causal, what=f"aiter h={heads} qo={qo_lens} page={page_size}")
    (out_n, lse_n), _ = run_wrapper(d, causal=causal, backend="native")
    print(f"aiter h={heads} qo={qo_lens} page={page_size}: max err {err:.3e}, "
          f"max |aiter - native| {(out.float() - out_n.float()).abs().max().item():.3e}")


@requires_rocm_aiter
def test_rocm_aiter_decode_no_allocation_and_graph_replay():
    from test_decode import make_batch

    d = make_batch([300, 40], [1, 1], 16, 16, torch.bfloat16, "cuda")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = mlacore.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, backend="aiter")
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True,
           1 / math.sqrt(192), torch.bfloat16, torch.bfloat16)
    out = torch.empty_like(d["q_nope"])
    lse = torch.empty(d["q_nope"].shape[:2], dtype=torch.float32, device="cuda")
    w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], out=out, lse=lse)  # warm-up
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], out=out, lse=lse)
    expect = out.clone()
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    assert torch.cuda.memory_allocated() == before


@requires_rocm_aiter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rocm_aiter_cache_writes_match_native(dtype):
    info = mlacore.backends()["aiter"]
    if "aiter_concat_and_cache_mla" not in info["entry_points"]:
        pytest.skip("the AITER library exports no cache writes (a shim's, docs/AITER.md)")
    g = torch.Generator().manual_seed(0)
    n = 300
    bi = torch.randint(0, 4, (n,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, 64, (n,), generator=g, dtype=torch.int32)
    pos[::7] = 1000  # past the pages: skipped by both
    idx = torch.randperm(40, generator=g)[:16].to(torch.int32)
    ptr = torch.tensor([0, 4, 8, 12, 16], dtype=torch.int32)
    last = torch.full((4,), 16, dtype=torch.int32)
    # Distinct (request, position) pairs, so the result does not depend on write order.
    pairs = sorted(set(zip(bi.tolist(), pos.tolist())))
    bi = torch.tensor([b for b, _ in pairs], dtype=torch.int32)
    pos = torch.tensor([p for _, p in pairs], dtype=torch.int32)
    bi, pos, idx, ptr, last = (t.cuda() for t in (bi, pos, idx, ptr, last))
    src = torch.randn(len(pairs), 576, device="cuda").to(dtype)
    caches = {}
    for backend in ("native", "aiter"):
        buf = torch.zeros(40, 16, 576, dtype=dtype, device="cuda")
        ckv, kpe = torch.split(buf, [512, 64], dim=-1)
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last,
                                          backend=backend)
        caches[backend] = buf
    assert torch.equal(caches["native"], caches["aiter"])
    key = torch.randn(len(pairs), 8, 128, device="cuda").to(dtype)
    kv = {b: torch.zeros(40, 2, 16, 8, 128, dtype=dtype, device="cuda") for b in ("native", "aiter")}
    for backend, cache in kv.items():
        mlacore.append_paged_kv_cache(key, key * 2, bi, pos, cache, idx, ptr, last, backend=backend)
    assert torch.equal(kv["native"], kv["aiter"])
