"""append_paged_mla_kv_cache and append_paged_kv_cache against a pure-torch
reference: every layout the engines use (split halves of a 576 buffer, layer
slices, separate caches, NHD/HND, tuple and 5-D), out-of-range tokens skipped
with nothing else written, strict mode, validation, backend routing,
torch.compile, and on a GPU: bitwise equality with the CPU path, the caller's
stream and CUDA-graph capture."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlacore
from mlacore import _mlacore

from conftest import kernels_in_fresh_process, requires_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
INDEX_DTYPES = [torch.int32, torch.int64]
PAGE_SIZES = [1, 16, 64]
POISON = -3.25  # exactly representable in every dtype; no appended value equals it


# --- problem setup and references ---------------------------------------------

class Table:
    """A FlashInfer page table for `batch` requests that already hold `old[b]`
    tokens and append `new[b]`; pages drawn at random from a pool of `pages`."""

    def __init__(self, old, new, page_size, pages=None, index_dtype=torch.int32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.page_size = page_size
        lens = [o + n for o, n in zip(old, new)]
        need = [(n + page_size - 1) // page_size for n in lens]
        self.pages = pages if pages is not None else sum(need) + 3
        assert self.pages >= sum(need)
        perm = torch.randperm(self.pages, generator=g)[: sum(need)]
        indptr = [0]
        for n in need:
            indptr.append(indptr[-1] + n)
        bi, pos = [], []
        for b, (o, n) in enumerate(zip(old, new)):
            bi += [b] * n
            pos += list(range(o, o + n))
        self.batch_indices = torch.tensor(bi, dtype=index_dtype)
        self.positions = torch.tensor(pos, dtype=index_dtype)
        self.kv_indices = perm.to(index_dtype)
        self.kv_indptr = torch.tensor(indptr, dtype=index_dtype)
        self.kv_last_page_len = torch.tensor([(n - 1) % page_size + 1 if n else 0 for n in lens], dtype=index_dtype)
        self.nnz = len(bi)

    def args(self, device="cpu"):
        return [t.to(device) for t in (self.batch_indices, self.positions)], \
               [t.to(device) for t in (self.kv_indices, self.kv_indptr, self.kv_last_page_len)]

    def targets(self):
        """(token, page, offset) of every token the append must write."""
        bi, pos = self.batch_indices.tolist(), self.positions.tolist()
        idx, ptr = self.kv_indices.tolist(), self.kv_indptr.tolist()
        out = []
        for i, (b, p) in enumerate(zip(bi, pos)):
            if not 0 <= b < len(ptr) - 1 or p < 0:
                continue
            begin, end = ptr[b], ptr[b + 1]
            if not 0 <= begin <= end <= len(idx) or p // self.page_size >= end - begin:
                continue
            page = idx[begin + p // self.page_size]
            if 0 <= page < self.pages:
                out.append((i, page, p % self.page_size))
        return out


def ref_write(cache, src, targets, hnd=False):
    """cache[page, off] = src[i] (NHD or 3-D), cache[page, :, off] = src[i] (HND)."""
    if not targets:
        return
    i, page, off = (torch.tensor(c) for c in zip(*targets))
    if hnd:
        cache[page, :, off] = src[i].to(cache.device)
    else:
        cache[page, off] = src[i].to(cache.device)


def rand(shape, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def mla_caches(layout, pages, page_size, dtype, device="cpu", dims=(512, 64)):
    """(whole buffer to compare, ckv_cache, kpe_cache) for a cache layout."""
    dc, dp = dims
    if layout == "split":  # vLLM / SGLang: one [P, S, 576] buffer, two views
        buf = torch.full((pages, page_size, dc + dp), POISON, dtype=dtype, device=device)
        ckv, kpe = torch.split(buf, [dc, dp], -1)
        return buf, ckv, kpe
    if layout == "layer":  # one layer of a [L, P, S, 576] buffer
        buf = torch.full((3, pages, page_size, dc + dp), POISON, dtype=dtype, device=device)
        ckv, kpe = torch.split(buf[1], [dc, dp], -1)
        return buf, ckv, kpe
    if layout == "separate":
        ckv = torch.full((pages, page_size, dc), POISON, dtype=dtype, device=device)
        kpe = torch.full((pages, page_size, dp), POISON, dtype=dtype, device=device)
        return (ckv, kpe), ckv, kpe
    if layout == "padded":  # row stride 640, not 576: written through the strides all the same
        buf = torch.full((pages, page_size, 640), POISON, dtype=dtype, device=device)
        return buf, buf[..., :dc], buf[..., dc + 32: dc + 32 + dp]
    raise AssertionError(layout)


def clone_whole(whole):
    return tuple(t.clone() for t in whole) if isinstance(whole, tuple) else whole.clone()


def assert_same(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    # Bitwise: view as integers, so -0.0 vs 0.0 or NaN payloads would show.
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    assert torch.equal(a.cpu().view(ints), b.cpu().view(ints))


def run_mla(table, layout, dtype, device="cpu", dims=(512, 64), src_stride=None, seed=1, **kw):
    """Appends through mlacore and through the reference; returns both whole buffers."""
    dc, dp = dims
    whole, ckv, kpe = mla_caches(layout, table.pages, table.page_size, dtype, device, dims)
    expect = clone_whole(whole)
    e_ckv, e_kpe = _views(layout, expect, dims)
    width = src_stride or (dc + dp)
    fused = rand((table.nnz, width), dtype, seed, device)
    a_ckv, a_kpe = fused[:, :dc], fused[:, width - dp:]
    (bi, pos), (idx, ptr, last) = table.args(device)
    mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, bi, pos, ckv, kpe, idx, ptr, last, **kw)
    targets = table.targets()
    ref_write(e_ckv, a_ckv.cpu(), targets)
    ref_write(e_kpe, a_kpe.cpu(), targets)
    return whole, expect


def _views(layout, whole, dims):
    dc, dp = dims
    if layout == "split":
        return torch.split(whole, [dc, dp], -1)
    if layout == "layer":
        return torch.split(whole[1], [dc, dp], -1)
    if layout == "separate":
        return whole
    if layout == "padded":
        return whole[..., :dc], whole[..., dc + 32: dc + 32 + dp]
    raise AssertionError(layout)


def kv_caches(form, layout, pages, page_size, heads, dim, dtype, device="cpu"):
    """(whole, paged_kv_cache argument, k view, v view) for a K/V cache form."""
    inner = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    if form == "tuple":
        k = torch.full((pages, *inner), POISON, dtype=dtype, device=device)
        v = torch.full((pages, *inner), POISON, dtype=dtype, device=device)
        return (k, v), (k, v), k, v
    if form == "5d":
        buf = torch.full((pages, 2, *inner), POISON, dtype=dtype, device=device)
        return buf, buf, buf[:, 0], buf[:, 1]
    if form == "layer5d":  # one layer of [L, P, 2, ...]
        buf = torch.full((2, pages, 2, *inner), POISON, dtype=dtype, device=device)
        return buf, buf[1], buf[1][:, 0], buf[1][:, 1]
    if form == "strided_tuple":  # K and V views of one [P, S, 2, H, D] (or [P, H, 2, S, D]) buffer
        shape = (pages, page_size, 2, heads, dim) if layout == "NHD" else (pages, heads, 2, page_size, dim)
        buf = torch.full(shape, POISON, dtype=dtype, device=device)
        return buf, (buf[:, :, 0], buf[:, :, 1]), buf[:, :, 0], buf[:, :, 1]
    raise AssertionError(form)


def run_kv(table, form, layout, dtype, heads, dim, device="cpu", seed=2, **kw):
    whole, arg, _, _ = kv_caches(form, layout, table.pages, table.page_size, heads, dim, dtype, device)
    expect = clone_whole(whole)
    # K and V as slices of a fused [nnz, 3, H, D] qkv output: strided on dim 0.
    qkv = rand((table.nnz, 3, heads, dim), dtype, seed, device)
    key, value = qkv[:, 1], qkv[:, 2]
    (bi, pos), (idx, ptr, last) = table.args(device)
    mlacore.append_paged_kv_cache(key, value, bi, pos, arg, idx, ptr, last, kv_layout=layout, **kw)
    _, _, e_k, e_v = _kv_views(form, layout, expect)
    targets = table.targets()
    ref_write(e_k, key.cpu(), targets, hnd=layout == "HND")
    ref_write(e_v, value.cpu(), targets, hnd=layout == "HND")
    return whole, expect


def _kv_views(form, layout, whole):
    if form == "tuple":
        return whole, whole, whole[0], whole[1]
    if form == "5d":
        return whole, whole, whole[:, 0], whole[:, 1]
    if form == "layer5d":
        return whole, whole[1], whole[1][:, 0], whole[1][:, 1]
    return whole, None, whole[:, :, 0], whole[:, :, 1]


def with_bad_tokens(table):
    """Corrupts some tokens in every way the kernels must survive."""
    bi, pos = table.batch_indices.clone(), table.positions.clone()
    n = table.nnz
    bi[0] = len(table.kv_indptr) - 1          # batch index == batch
    bi[n // 3] = -1                           # negative batch index
    pos[n // 2] = -5                          # negative position
    pos[n - 1] = pos[n - 1] + 10 * table.page_size * 64  # past the request's pages
    table.batch_indices, table.positions = bi, pos
    idx = table.kv_indices.clone()
    idx[len(idx) // 2] = table.pages          # a page id outside the pool
    idx[len(idx) - 1] = -2
    table.kv_indices = idx
    return table


# --- MLA on the CPU -------------------------------------------------------------

@pytest.mark.parametrize("layout", ["split", "layer", "separate", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_matches_reference(layout, dtype, page_size):
    table = Table(old=[0, 5, 17, 1], new=[3, 1, 9, 4], page_size=page_size, seed=page_size)
    whole, expect = run_mla(table, layout, dtype)
    assert_same(whole, expect)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_mla_int64_indices_match_int32(index_dtype):
    base = Table(old=[3, 40], new=[7, 2], page_size=16)
    table = Table(old=[3, 40], new=[7, 2], page_size=16, index_dtype=index_dtype)
    whole, expect = run_mla(table, "split", torch.bfloat16)
    assert_same(whole, expect)
    assert_same(whole, run_mla(base, "split", torch.bfloat16)[0])


def test_mla_sources_strided_on_dim0_and_strided_indices():
    table = Table(old=[2, 9], new=[5, 6], page_size=16)
    # Index tensors as every-other-element views.
    for name in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"):
        t = getattr(table, name)
        wide = torch.full((2 * len(t),), 12345, dtype=t.dtype)
        wide[::2] = t
        setattr(table, name, wide[::2])
    whole, expect = run_mla(table, "split", torch.float16, src_stride=1000)
    assert_same(whole, expect)


def test_mla_other_head_dims():
    # Any widths whose rows the caches can hold, aligned or not.
    table = Table(old=[1, 3], new=[4, 5], page_size=16)
    for dims in [(256, 32), (8, 8), (3, 5)]:
        whole, expect = run_mla(table, "split", torch.bfloat16, dims=dims)
        assert_same(whole, expect)


@pytest.mark.parametrize("layout", ["split", "separate"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_out_of_range_tokens_write_nothing(layout, page_size):
    table = with_bad_tokens(Table(old=[0, 30, 2], new=[6, 7, 8], page_size=page_size))
    assert len(table.targets()) < table.nnz - 3
    whole, expect = run_mla(table, layout, torch.bfloat16)
    assert_same(whole, expect)  # poisoned cache: every untouched element is still POISON


def test_mla_empty_append_and_empty_requests():
    table = Table(old=[0, 0, 4], new=[0, 0, 0], page_size=16)
    assert table.nnz == 0
    whole, expect = run_mla(table, "split", torch.bfloat16)
    assert_same(whole, expect)
    table = Table(old=[0, 0, 4], new=[0, 3, 0], page_size=1)
    whole, expect = run_mla(table, "split", torch.bfloat16)
    assert_same(whole, expect)


# --- K/V (MHA) on the CPU -------------------------------------------------------

@pytest.mark.parametrize("form", ["tuple", "5d", "layer5d", "strided_tuple"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_matches_reference(form, layout, dtype):
    table = Table(old=[0, 7, 20], new=[5, 2, 6], page_size=16)
    whole, expect = run_kv(table, form, layout, dtype, heads=4, dim=128)
    assert_same(whole, expect)


@pytest.mark.parametrize("dim", [64, 128, 256, 12])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_kv_head_dims_and_page_sizes(dim, page_size, layout):
    table = Table(old=[1, 66], new=[3, 4], page_size=page_size, index_dtype=torch.int64)
    whole, expect = run_kv(table, "tuple", layout, torch.bfloat16, heads=2, dim=dim)
    assert_same(whole, expect)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_kv_out_of_range_tokens_write_nothing(layout):
    table = with_bad_tokens(Table(old=[0, 30, 2], new=[6, 7, 8], page_size=16))
    whole, expect = run_kv(table, "5d", layout, torch.float16, heads=2, dim=64)
    assert_same(whole, expect)


# --- hypothesis ------------------------------------------------------------------

@st.composite
def problems(draw):
    batch = draw(st.integers(1, 5))
    page_size = draw(st.sampled_from([1, 2, 5, 16, 64]))
    old = draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    new = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    spare = draw(st.integers(0, 4))
    index_dtype = draw(st.sampled_from(INDEX_DTYPES))
    seed = draw(st.integers(0, 2**16))
    table = Table(old, new, page_size, index_dtype=index_dtype, seed=seed)
    table.pages += spare
    if table.nnz and draw(st.booleans()):
        # Random corruption of indices: arbitrary values, the reference decides.
        for name in ("batch_indices", "positions", "kv_indices"):
            t = getattr(table, name).clone()
            if len(t):
                j = draw(st.integers(0, len(t) - 1))
                t[j] = draw(st.integers(-3, 200))
                setattr(table, name, t)
        # Corrupted tokens may now collide with good ones; keep the first writer only.
        seen, keep = set(), []
        for i, page, off in table.targets():
            if (page, off) in seen:
                keep.append(i)
            seen.add((page, off))
        for i in keep:
            table.batch_indices[i] = -1
    return table


@settings(max_examples=60, deadline=None)
@given(table=problems(), dtype=st.sampled_from(DTYPES), layout=st.sampled_from(["split", "separate", "layer"]),
       kv_layout=st.sampled_from(["NHD", "HND"]), form=st.sampled_from(["tuple", "5d", "strided_tuple"]))
def test_property_both_appends_match_reference(table, dtype, layout, kv_layout, form):
    whole, expect = run_mla(table, layout, dtype, dims=(64, 16))
    assert_same(whole, expect)
    whole, expect = run_kv(table, form, kv_layout, dtype, heads=2, dim=16)
    assert_same(whole, expect)


# --- strict mode -------------------------------------------------------------------

STRICT_CASES = [
    ("batch_indices", 2, 2, "batch index 2, position 2", "outside [0, 2)"),
    ("batch_indices", 1, -1, "batch index -1, position 1", "outside [0, 2)"),
    ("positions", 3, -4, "batch index 0, position -4", "negative"),
    ("positions", 4, 1000, "batch index 1, position 1000", "has 2 pages"),
]


@pytest.mark.parametrize("field,token,value,names,why", STRICT_CASES)
def test_strict_names_the_first_bad_token_and_writes_nothing(field, token, value, names, why):
    table = Table(old=[0, 20], new=[4, 4], page_size=16)
    t = getattr(table, field).clone()
    t[token] = value
    setattr(table, field, t)
    whole, ckv, kpe = mla_caches("split", table.pages, 16, torch.bfloat16)
    before = whole.clone()
    src = rand((table.nnz, 576), torch.bfloat16, 0)
    (bi, pos), (idx, ptr, last) = table.args()
    with pytest.raises(ValueError, match=rf"token {token} \({names}\) cannot be written") as info:
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last,
                                          strict=True)
    assert why in str(info.value)
    assert_same(whole, before)
    # Without strict the same call skips the token and writes the rest.
    mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
    assert not torch.equal(whole, before)


def test_strict_bad_page_id_and_bad_indptr():
    table = Table(old=[0, 20], new=[4, 4], page_size=16)
    table.kv_indices = table.kv_indices.clone()
    table.kv_indices[0] = 999
    (bi, pos), (idx, ptr, last) = table.args()
    whole, arg, _, _ = kv_caches("tuple", "NHD", table.pages, 16, 2, 64, torch.float32)
    kv = rand((table.nnz, 2, 64), torch.float32, 0)
    with pytest.raises(ValueError, match=r"token 0 \(batch index 0, position 0\).*kv_indices\[0\]=999"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, arg, idx, ptr, last, strict=True)
    bad_ptr = ptr.clone()
    bad_ptr[1] = 100
    with pytest.raises(ValueError, match=r"token 0 .*kv_indptr\[0\]=0 and kv_indptr\[1\]=100"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, arg, idx, bad_ptr, last, strict=True)


def test_strict_from_environment(monkeypatch):
    table = Table(old=[0], new=[3], page_size=16)
    table.positions = torch.tensor([0, 1, -1], dtype=torch.int32)
    whole, ckv, kpe = mla_caches("split", table.pages, 16, torch.bfloat16)
    src = rand((3, 576), torch.bfloat16, 0)
    (bi, pos), (idx, ptr, last) = table.args()
    args = (src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
    monkeypatch.setenv("MLACORE_STRICT", "1")
    with pytest.raises(ValueError, match=r"token 2 \(batch index 0, position -1\)"):
        mlacore.append_paged_mla_kv_cache(*args)
    monkeypatch.setenv("MLACORE_STRICT", "0")
    mlacore.append_paged_mla_kv_cache(*args)


# --- validation -----------------------------------------------------------------------

def _mla_args(nnz=4, dtype=torch.bfloat16, index_dtype=torch.int32):
    table = Table(old=[0], new=[nnz], page_size=16, index_dtype=index_dtype)
    _, ckv, kpe = mla_caches("split", table.pages, 16, dtype)
    src = rand((nnz, 576), dtype, 0)
    (bi, pos), (idx, ptr, last) = table.args()
    return dict(append_ckv=src[:, :512], append_kpe=src[:, 512:], batch_indices=bi, positions=pos,
                ckv_cache=ckv, kpe_cache=kpe, kv_indices=idx, kv_indptr=ptr, kv_last_page_len=last)


MLA_BAD = [
    ("append_ckv", lambda a: a["append_ckv"].float(), ValueError, "append_ckv: expected bfloat16 \\(the dtype of ckv_cache\\)"),
    ("append_ckv", lambda a: a["append_ckv"][:, :256], ValueError, "append_ckv: expected size 512"),
    ("append_kpe", lambda a: a["append_kpe"][:3], ValueError, "append_kpe: expected size 4 \\(rows of append_ckv\\)"),
    ("append_kpe", lambda a: a["append_kpe"].t().contiguous().t(), ValueError,
     "append_kpe: expected a contiguous last dimension"),
    ("ckv_cache", lambda a: a["ckv_cache"][0], ValueError, "ckv_cache: expected 3-D tensor"),
    ("ckv_cache", lambda a: a["ckv_cache"].double(), ValueError, "ckv_cache: expected bfloat16 or float16 or float32"),
    ("kpe_cache", lambda a: a["kpe_cache"][:2], ValueError, "kpe_cache: expected size .* \\(pages of ckv_cache\\)"),
    ("kpe_cache", lambda a: a["kpe_cache"].half(), ValueError, "kpe_cache: expected bfloat16 \\(the dtype of ckv_cache\\)"),
    ("batch_indices", lambda a: a["batch_indices"][:2], ValueError, "batch_indices: expected 1-D int32 or int64 of length nnz=4"),
    ("positions", lambda a: a["positions"].float(), ValueError, "positions: expected 1-D int32 or int64"),
    # The batch is len(kv_indptr)-1 (FlashInfer): kv_last_page_len is checked against it.
    ("kv_indptr", lambda a: a["kv_indptr"][:0], ValueError, "kv_indptr: expected at least 1 element \\(batch\\+1\\)"),
    ("kv_last_page_len", lambda a: a["kv_last_page_len"][:0], ValueError,
     "kv_last_page_len: expected 1-D int32 or int64 of length len\\(kv_indptr\\)-1=1"),
    ("kv_indices", lambda a: a["kv_indices"].long(), ValueError, "kv_indices: expected int32 \\(the dtype of kv_indptr\\)"),
    ("kv_last_page_len", lambda a: a["kv_last_page_len"].view(1, 1), ValueError, "kv_last_page_len: expected 1-D"),
    ("kv_indices", lambda a: None, TypeError, "kv_indices: expected a tensor, got None"),
    ("ckv_cache", lambda a: [1, 2], TypeError, "ckv_cache: expected a tensor"),
]


@pytest.mark.parametrize("name,bad,exc,match", MLA_BAD)
def test_mla_validation_names_the_argument(name, bad, exc, match):
    args = _mla_args()
    args[name] = bad(args)
    with pytest.raises(exc, match=match):
        mlacore.append_paged_mla_kv_cache(**args)


def test_mla_validation_page_size_zero_and_bad_options():
    args = _mla_args()
    args["ckv_cache"] = torch.zeros(3, 0, 512, dtype=torch.bfloat16)
    args["kpe_cache"] = torch.zeros(3, 0, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ckv_cache: expected a page size of at least 1"):
        mlacore.append_paged_mla_kv_cache(**args)
    with pytest.raises(ValueError, match="backend: expected 'auto', 'native' or 'aiter', got 'cuda'"):
        mlacore.append_paged_mla_kv_cache(**_mla_args(), backend="cuda")


def test_kv_validation():
    table = Table(old=[0], new=[4], page_size=16)
    (bi, pos), (idx, ptr, last) = table.args()
    kv = rand((4, 2, 64), torch.float16, 0)
    k = torch.zeros(table.pages, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="paged_kv_cache: expected 5-D tensor"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, k, idx, ptr, last)
    with pytest.raises(ValueError, match="expected a \\(k_cache, v_cache\\) pair, got 3 items"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, (k, k, k), idx, ptr, last)
    with pytest.raises(TypeError, match="paged_kv_cache: expected a \\(k_cache, v_cache\\) tuple"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, "cache", idx, ptr, last)
    with pytest.raises(ValueError, match="paged_kv_cache\\[1\\]: expected size 16 \\(as paged_kv_cache\\[0\\]\\) in dim 1"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, (k, k[:, :8]), idx, ptr, last)
    with pytest.raises(ValueError, match="append_key: expected size 16 \\(heads of the cache\\) in dim 1"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, (k, k), idx, ptr, last, kv_layout="HND")
    with pytest.raises(ValueError, match="append_value: expected size 4 \\(rows of append_key\\)"):
        mlacore.append_paged_kv_cache(kv, kv[:2], bi, pos, (k, k), idx, ptr, last)
    with pytest.raises(ValueError, match="kv_layout: expected 'NHD' or 'HND', got 'NDH'"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, (k, k), idx, ptr, last, kv_layout="NDH")
    with pytest.raises(ValueError, match="paged_kv_cache\\[1\\]: expected float16"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, (k, k.float()), idx, ptr, last)


# --- backends and routing ------------------------------------------------------------

def test_backends_report():
    info = mlacore.backends()
    assert info["native"]["available"] is True and "cpu" in info["native"]["devices"]
    assert info["aiter"]["available"] is False
    assert info["aiter"]["reason"]
    assert info == mlacore.backends()  # probed once, stable


def route(backend="auto", op="append_paged_mla_kv_cache", device="rocm", dtype="bfloat16", layout="NHD",
          page_size=1, dims=(512, 64), adjacent=True):
    return _mlacore.route(op, device, dtype, layout, page_size, dims[0], dims[1], adjacent, backend)


def test_route_native_always_runs_native():
    assert route("native", device="cpu") == ("native", "native: requested")
    assert route("native")[0] == "native"


def test_route_auto_falls_back_silently_and_says_why():
    chosen, why = route("auto", device="cuda")
    assert chosen == "native" and "not a HIP device" in why
    chosen, why = route("auto")  # every gate passes on ROCm: only availability is missing
    assert chosen == "native" and "AITER unavailable" in why and mlacore.backends()["aiter"]["reason"] in why
    chosen, why = route("auto", layout="HND", op="append_paged_kv_cache", dims=(128, 0))
    assert chosen == "native" and "layout HND" in why


@pytest.mark.parametrize("kw,match", [
    (dict(device="cpu"), "not a HIP device \\(the cache is on cpu\\)"),
    (dict(device="cuda"), "not a HIP device \\(the cache is on cuda\\)"),
    (dict(dtype="float32"), "dtype float32"),
    (dict(page_size=48), "page_size 48 is not a power of two"),
    (dict(dims=(256, 64)), "head dims 256\\+64"),
    (dict(adjacent=False), "not the two halves of one"),
    (dict(op="append_paged_kv_cache", layout="HND", dims=(128, 0)), "layout HND"),
    (dict(op="append_paged_kv_cache", adjacent=False, dims=(128, 0)), "token stride is not dense"),
])
def test_route_explicit_aiter_gate_failures_are_value_errors(kw, match):
    with pytest.raises(ValueError, match="backend='aiter' cannot run this call: .*" + match):
        route("aiter", **kw)


def test_route_explicit_aiter_unavailable_is_runtime_error():
    with pytest.raises(RuntimeError, match="AITER unavailable: "):
        route("aiter")
    with pytest.raises(RuntimeError, match="AITER unavailable: "):
        route("aiter", op="append_paged_kv_cache", dims=(128, 0), page_size=16)


def test_ops_route_like_the_router():
    args = _mla_args()
    with pytest.raises(ValueError, match="append_paged_mla_kv_cache: backend='aiter' cannot run this call: not a HIP"):
        mlacore.append_paged_mla_kv_cache(**args, backend="aiter")
    mlacore.append_paged_mla_kv_cache(**args, backend="native")
    table = Table(old=[0], new=[2], page_size=16)
    (bi, pos), (idx, ptr, last) = table.args()
    kv = rand((2, 2, 64), torch.float16, 0)
    cache = torch.zeros(table.pages, 2, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="append_paged_kv_cache: backend='aiter' cannot run this call"):
        mlacore.append_paged_kv_cache(kv, kv, bi, pos, cache, idx, ptr, last, backend="aiter")


# --- torch.compile ----------------------------------------------------------------------

def test_torch_compile_fullgraph_matches_eager():
    table = Table(old=[0, 9], new=[3, 5], page_size=16)
    (bi, pos), (idx, ptr, last) = table.args()
    src = rand((table.nnz, 576), torch.bfloat16, 3)
    kv = rand((table.nnz, 2, 2, 64), torch.bfloat16, 4)

    def step(src, kv, buf, kv_cache, k, v):
        ckv, kpe = torch.split(buf, [512, 64], -1)
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
        mlacore.append_paged_kv_cache(kv[:, 0], kv[:, 1], bi, pos, kv_cache, idx, ptr, last, kv_layout="HND")
        mlacore.append_paged_kv_cache(kv[:, 1], kv[:, 0], bi, pos, (k, v), idx, ptr, last)
        return buf.float().sum() + kv_cache.float().sum() + k.float().sum()

    def fresh():
        return (torch.full((table.pages, 16, 576), POISON, dtype=torch.bfloat16),
                torch.full((table.pages, 2, 2, 16, 64), POISON, dtype=torch.bfloat16),
                torch.full((table.pages, 16, 2, 64), POISON, dtype=torch.bfloat16),
                torch.full((table.pages, 16, 2, 64), POISON, dtype=torch.bfloat16))

    eager = fresh()
    total_eager = step(src, kv, *eager)
    compiled = fresh()
    total_compiled = torch.compile(step, fullgraph=True)(src, kv, *compiled)
    assert_same(eager, compiled)
    torch.testing.assert_close(total_compiled, total_eager)  # the returned sum saw the mutations


def test_custom_ops_declare_their_mutations():
    mla = torch.ops.mlacore.append_paged_mla_kv_cache.default._schema
    kv = torch.ops.mlacore.append_paged_kv_cache.default._schema
    assert [a.name for a in mla.arguments if a.alias_info and a.alias_info.is_write] == ["ckv_cache", "kpe_cache"]
    assert [a.name for a in kv.arguments if a.alias_info and a.alias_info.is_write] == ["k_cache", "v_cache"]


# --- GPU: bitwise vs CPU, streams, graphs -----------------------------------------------------

def _mla_on(device, table, layout, dtype, dims=(512, 64), **kw):
    whole, _ = run_mla(table, layout, dtype, device=device, dims=dims, **kw)
    return whole


@requires_cuda
@pytest.mark.parametrize("layout", ["split", "layer", "separate", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_gpu_mla_bitwise_equal_to_cpu(layout, dtype, page_size):
    table = with_bad_tokens(Table(old=[0, 33, 100, 7], new=[40, 1, 70, 9], page_size=page_size, seed=5))
    assert_same(_mla_on("cuda", table, layout, dtype), _mla_on("cpu", table, layout, dtype))


@requires_cuda
@pytest.mark.parametrize("dims", [(512, 64), (256, 32), (12, 4), (3, 5)])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gpu_mla_narrow_and_unaligned_rows(dims, index_dtype):
    # 24-byte and 6-byte rows force 8- and 2-byte accesses; results are the same.
    table = Table(old=[2, 50], new=[30, 20], page_size=16, index_dtype=index_dtype)
    for layout in ("split", "padded"):
        assert_same(_mla_on("cuda", table, layout, torch.bfloat16, dims),
                    _mla_on("cpu", table, layout, torch.bfloat16, dims))


@requires_cuda
@pytest.mark.parametrize("form", ["tuple", "5d", "layer5d", "strided_tuple"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_gpu_kv_bitwise_equal_to_cpu(form, layout, dtype, dim):
    table = with_bad_tokens(Table(old=[0, 33, 5], new=[20, 3, 40], page_size=16, seed=dim))
    gpu, _ = run_kv(table, form, layout, dtype, heads=8, dim=dim, device="cuda")
    cpu, _ = run_kv(table, form, layout, dtype, heads=8, dim=dim, device="cpu")
    assert_same(gpu, cpu)


@requires_cuda
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_gpu_large_append_matches_reference(page_size):
    # Enough tokens for many blocks and a grid that loops.
    n = 4096
    table = Table(old=[0] * 8, new=[n // 8] * 8, page_size=page_size, seed=page_size, index_dtype=torch.int64)
    whole, expect = run_mla(table, "split", torch.bfloat16, device="cuda")
    assert_same(whole, expect)
    whole, expect = run_kv(table, "5d", "NHD", torch.bfloat16, heads=8, dim=128, device="cuda")
    assert_same(whole, expect)


@requires_cuda
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gpu_many_batches_per_block(index_dtype):
    # The kernel's grid is the blocks resident at once (a few hundred on any
    # current GPU), so 300k tokens give every block several batches of
    # lookups, the last one partial; 10 and 32 accesses per row (MLA 64+16,
    # HND K/V of 2 heads of 64) are no power of two and take both the flat and
    # the segmented copy; skipped tokens land in different batches, and
    # positions of 2^32 and more take the kernel's 64-bit division.
    n = 300_001
    new = [n // 7 + (1 if b < n % 7 else 0) for b in range(7)]
    table = with_bad_tokens(Table(old=[3] * 7, new=new, page_size=16, seed=9, index_dtype=index_dtype))
    if index_dtype == torch.int64:
        pos = table.positions.clone()
        pos[n // 5] = 2**33 + 5
        pos[2 * n // 3] = 2**40
        table.positions = pos
    whole, expect = run_mla(table, "split", torch.bfloat16, device="cuda", dims=(64, 16))
    assert_same(whole, expect)
    whole, expect = run_kv(table, "tuple", "HND", torch.bfloat16, heads=2, dim=64, device="cuda")
    assert_same(whole, expect)


# --- GPU: the kernels ------------------------------------------------------------------
# core/src/append/append_launch.cu (launch_gpu) picks, for a page-table append:
#   append_rows_kernel: appends of at most 4 MiB of source rows (a decode step), 16-byte accesses,
#     batch_indices and positions of one dtype: one lean launch;
#   on a CUDA build holding sm_90 code for the device (an H200 with the default sm_targets), above
#     that: MLA rows of 1024 + 128 bytes (512 + 64 in bf16/fp16) to append_bulk_kernel
#     (cp.async.bulk) at page sizes >= 16 and to append_warp_kernel below, K/V rows of 2048 bytes a
#     stream (8 heads x 128 in bf16/fp16, 8 x 64 in fp32; NHD or HND) to append_warp_kernel
#     (double-buffered);
#   everything else: append_kernel (the classic kernel).
# MLACORE_APPEND_KERNEL, read once per process: "classic" forces append_kernel, "fast" the choice
# above without the rows kernel, "rows" the rows kernel wherever it fits.

def _odd_table(nnz, page_size, index_dtype, seed):
    """nnz tokens over 7 requests (uneven, most starting mid-page); from 10 tokens on, corrupted
    in every way with_bad_tokens knows and, with int64 indices, positions of 2^32 and more."""
    new = [nnz // 7 + (1 if b < nnz % 7 else 0) for b in range(7)]
    table = Table(old=[3, 0, 17, 1, 64, 5, 2], new=new, page_size=page_size, seed=seed, index_dtype=index_dtype)
    if nnz < 10:
        return table
    table = with_bad_tokens(table)
    if index_dtype == torch.int64:
        pos = table.positions.clone()
        pos[nnz // 5] = 2**33 + 5
        pos[2 * nnz // 3] = 2**40
        table.positions = pos
    return table


def _fast_shapes_match_reference(table):
    # MLA: token-major bulk copies (split, layer), stream-major (separate, padded), a merged
    # and a strided source; fp32 rows are too long for either fast kernel.
    for layout, dtype, stride in [("split", torch.bfloat16, None), ("layer", torch.float16, None),
                                  ("separate", torch.bfloat16, None), ("padded", torch.bfloat16, None),
                                  ("split", torch.bfloat16, 640), ("split", torch.float32, None)]:
        whole, expect = run_mla(table, layout, dtype, device="cuda", src_stride=stride)
        assert_same(whole, expect)
    # K/V: flat (NHD) and per-head (HND) rows, K/V interleaved caches, fp32 with 64-wide heads.
    for form, layout, dtype, dim in [("tuple", "NHD", torch.bfloat16, 128), ("5d", "HND", torch.float16, 128),
                                     ("layer5d", "NHD", torch.bfloat16, 128),
                                     ("strided_tuple", "HND", torch.bfloat16, 128),
                                     ("strided_tuple", "NHD", torch.float32, 64)]:
        whole, expect = run_kv(table, form, layout, dtype, heads=8, dim=dim, device="cuda")
        assert_same(whole, expect)


@requires_cuda
@pytest.mark.parametrize("nnz", [1, 3, 37, 3001])
@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gpu_fast_kernel_shapes_at_odd_sizes(nnz, page_size, index_dtype):
    # Tails of every kind: the rows kernel's blocks cut short, a last warp group of 1-3 MLA
    # tokens, bulk-copy stages of fewer than 8 tokens, 32-token lookup tiles cut short, warps
    # with nothing to do.
    _fast_shapes_match_reference(_odd_table(nnz, page_size, index_dtype, seed=nnz + page_size))


@requires_cuda
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_fast_kernel_shapes_many_tokens(page_size):
    # Enough tokens for every resident warp to loop (the warp kernels' persistent grid) and for
    # every bulk-copy warp to cycle its ring of stages many times.
    _fast_shapes_match_reference(_odd_table(20_011, page_size, torch.int64, seed=page_size))


@requires_cuda
def test_gpu_mixed_index_dtypes_and_long_rows():
    # batch_indices int64 with positions int32 (the classic kernel), and K/V rows of 32 heads x
    # 256 fp32 (32 KiB a stream: several row chunks a token in the rows kernel).
    table = with_bad_tokens(Table(old=[0, 33, 5], new=[20, 3, 40], page_size=16, seed=4))
    table.batch_indices = table.batch_indices.to(torch.int64)
    assert_same(*run_mla(table, "split", torch.bfloat16, device="cuda"))
    table = with_bad_tokens(Table(old=[0, 3], new=[5, 4], page_size=4, seed=6))
    gpu, expect = run_kv(table, "tuple", "NHD", torch.float32, heads=32, dim=256, device="cuda")
    assert_same(gpu, expect)
    gpu, expect = run_kv(table, "5d", "HND", torch.float32, heads=32, dim=256, device="cuda")
    assert_same(gpu, expect)


@requires_cuda
@pytest.mark.parametrize("batch", [1, 7, 300])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gpu_decode_step_guess_hits_and_misses(batch, page_size, index_dtype):
    # A decode step: token i is request i's, which the rows kernel guesses (kv_indptr[i] loaded
    # before batch_indices[i] is known). Hits, and misses where a token names another request
    # (swapped pairs), an out-of-range request, a bad position or a bad page id, all match the
    # reference; the guessed entries past the batch are never read (memcheck runs this file).
    g = random.Random(batch * 31 + page_size)
    table = Table(old=[g.randint(0, 70) for _ in range(batch)], new=[1] * batch, page_size=page_size,
                  index_dtype=index_dtype, seed=batch)
    if batch > 1:
        bi, pos = table.batch_indices.clone(), table.positions.clone()
        for i in range(0, batch - 1, 5):  # swap tokens i and i + 1 (both their request and position)
            bi[i], bi[i + 1] = bi[i + 1].clone(), bi[i].clone()
            pos[i], pos[i + 1] = pos[i + 1].clone(), pos[i].clone()
        table.batch_indices, table.positions = bi, pos
        table = with_bad_tokens(table)
    whole, expect = run_mla(table, "split", torch.bfloat16, device="cuda")
    assert_same(whole, expect)
    gpu, expect = run_kv(table, "tuple", "NHD", torch.bfloat16, heads=8, dim=128, device="cuda")
    assert_same(gpu, expect)


KERNEL_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, os.environ["MLACORE_TESTS_DIR"])
from test_append import Table, with_bad_tokens, run_mla, run_kv, assert_same, _odd_table, _fast_shapes_match_reference
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for page_size in (1, 16):
        # A small append (64 tokens), then a large one (9010 tokens); rows of 12 + 4 bf16
        # (8-byte accesses) only the classic kernel takes.
        for new in ([16, 16, 16, 16], [5000, 1, 4000, 9]):
            table = with_bad_tokens(Table(old=[0, 33, 100, 7], new=new, page_size=page_size, seed=3))
            for dims in ((512, 64), (12, 4)):
                whole, expect = run_mla(table, "split", torch.bfloat16, device="cuda", dims=dims)
                assert_same(whole, expect)
            for layout in ("NHD", "HND"):
                whole, expect = run_kv(table, "tuple", layout, torch.bfloat16, heads=8, dim=128, device="cuda")
                assert_same(whole, expect)
    if os.environ.get("ODD_SIZES"):
        for nnz in (1, 37, 3001):
            for page_size in (1, 16):
                for index_dtype in (torch.int32, torch.int64):
                    _fast_shapes_match_reference(_odd_table(nnz, page_size, index_dtype, seed=nnz + page_size))
    torch.cuda.synchronize()
kinds = {"append_rows_kernel": "rows", "append_warp_kernel": "warp", "append_bulk_kernel": "bulk",
         "append_kernel": "classic"}
ran = {kind for e in prof.events() for name, kind in kinds.items() if name in e.name}  # none holds another
print("kernels:", " ".join(sorted(ran)), flush=True)
"""


@requires_cuda
@pytest.mark.parametrize("kernel", ["default", "classic", "fast", "rows"])
def test_gpu_kernel_choice_in_a_fresh_process(kernel, monkeypatch):
    # MLACORE_APPEND_KERNEL is read once per process: a fresh interpreter appends a decode step,
    # every fast shape and one only the classic kernel takes against the reference (with "fast"
    # and "rows" also odd sizes as in test_gpu_fast_kernel_shapes_at_odd_sizes), and the
    # profiler names the kernels that ran. By default every 16-byte append runs the rows
    # kernel; "fast" runs the sm_90 kernels on an H100/H200 (a build without sm_90 code fails
    # here on purpose: its fast kernels are missing), the classic one on other GPUs.
    if kernel in ("fast", "rows"):
        monkeypatch.setenv("ODD_SIZES", "1")
    ran = kernels_in_fresh_process(KERNEL_SCRIPT, "MLACORE_APPEND_KERNEL", None if kernel == "default" else kernel)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    fast = {"warp", "bulk", "classic"} if hopper else {"classic"}
    want = {"default": {"rows", "classic"}, "classic": {"classic"}, "fast": fast, "rows": {"rows", "classic"}}[kernel]
    assert ran == want, f"expected the kernels {sorted(want)}, the profiler saw: {sorted(ran)}"


@requires_cuda
@pytest.mark.parametrize("nnz", [1, 32, 1024, 5000])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_gpu_bitwise_equal_to_flashinfer(nnz, page_size):
    fi = pytest.importorskip("flashinfer")
    new = [nnz // 4 + (1 if b < nnz % 4 else 0) for b in range(4)]
    table = Table(old=[0, 17, 3, 64], new=new, page_size=page_size, seed=nnz)
    (bi, pos), (idx, ptr, last) = table.args("cuda")
    src = rand((table.nnz, 576), torch.bfloat16, nnz, "cuda")
    mine, ckv, kpe = mla_caches("split", table.pages, page_size, torch.bfloat16, "cuda")
    theirs, fckv, fkpe = mla_caches("split", table.pages, page_size, torch.bfloat16, "cuda")
    mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
    fi.page.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, fckv, fkpe, idx, ptr, last)
    torch.cuda.synchronize()
    assert_same(mine, theirs)
    for layout in ("NHD", "HND"):
        kv = rand((table.nnz, 2, 8, 128), torch.bfloat16, nnz + 1, "cuda")
        mine, arg, _, _ = kv_caches("tuple", layout, table.pages, page_size, 8, 128, torch.bfloat16, "cuda")
        theirs, farg, _, _ = kv_caches("tuple", layout, table.pages, page_size, 8, 128, torch.bfloat16, "cuda")
        mlacore.append_paged_kv_cache(kv[:, 0], kv[:, 1], bi, pos, arg, idx, ptr, last, kv_layout=layout)
        fi.page.append_paged_kv_cache(kv[:, 0], kv[:, 1], bi, pos, farg, idx, ptr, last, kv_layout=layout)
        torch.cuda.synchronize()
        assert_same(mine, theirs)


@requires_cuda
def test_gpu_strict_raises_and_writes_nothing():
    table = Table(old=[0, 20], new=[4, 4], page_size=16)
    table.positions = table.positions.clone()
    table.positions[5] = 10_000
    whole, ckv, kpe = mla_caches("split", table.pages, 16, torch.bfloat16, "cuda")
    before = whole.clone()
    src = rand((table.nnz, 576), torch.bfloat16, 0, "cuda")
    (bi, pos), (idx, ptr, last) = table.args("cuda")
    with pytest.raises(ValueError, match=r"token 5 \(batch index 1, position 10000\)"):
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last,
                                          strict=True)
    assert_same(whole, before)


@requires_cuda
def test_gpu_runs_on_the_callers_stream():
    table = Table(old=[0, 5], new=[64, 64], page_size=16)
    (bi, pos), (idx, ptr, last) = table.args("cuda")
    whole, ckv, kpe = mla_caches("split", table.pages, 16, torch.bfloat16, "cuda")
    src = torch.zeros(table.nnz, 576, dtype=torch.bfloat16, device="cuda")
    fresh = rand((table.nnz, 576), torch.bfloat16, 7, "cuda")
    ready = torch.cuda.Event()
    ready.record()  # the inputs above exist before the side stream starts
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        side.wait_event(ready)
        # The source gets its data only after a long sleep on this stream: an
        # append launched anywhere else would copy the zeros.
        torch.cuda._sleep(20_000_000)
        src.copy_(fresh)
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
        done = torch.cuda.Event()
        done.record()
    torch.cuda.current_stream().wait_event(done)
    got = whole.clone()  # on the default stream, after the event
    expect = mla_caches("split", table.pages, 16, torch.bfloat16)[0]
    e_ckv, e_kpe = torch.split(expect, [512, 64], -1)
    targets = table.targets()
    ref_write(e_ckv, fresh[:, :512].cpu(), targets)
    ref_write(e_kpe, fresh[:, 512:].cpu(), targets)
    assert_same(got, expect)


@requires_cuda
def test_gpu_cuda_graph_capture_and_replay_with_new_data():
    table = Table(old=[16, 56, 19], new=[8, 8, 8], page_size=16)
    (bi, pos), (idx, ptr, last) = table.args("cuda")
    pos.sub_(16)  # each replay moves the append 8 positions on
    whole, ckv, kpe = mla_caches("split", table.pages, 16, torch.bfloat16, "cuda")
    kv_whole, kv_arg, _, _ = kv_caches("tuple", "HND", table.pages, 16, 4, 128, torch.float16, "cuda")
    src = torch.zeros(table.nnz, 576, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(table.nnz, 2, 4, 128, dtype=torch.float16, device="cuda")

    def step():
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, idx, ptr, last)
        mlacore.append_paged_kv_cache(kv[:, 0], kv[:, 1], bi, pos, kv_arg, idx, ptr, last, kv_layout="HND")

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        step()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    whole.fill_(POISON)
    for t in kv_whole:
        t.fill_(POISON)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    expect = whole.cpu().clone()
    e_ckv, e_kpe = torch.split(expect, [512, 64], -1)
    e_k, e_v = kv_whole[0].cpu().clone(), kv_whole[1].cpu().clone()
    for seed in (11, 12):
        # New data at new positions (the next decode step), same tensors.
        src.copy_(rand((table.nnz, 576), torch.bfloat16, seed, "cuda"))
        kv.copy_(rand((table.nnz, 2, 4, 128), torch.float16, seed, "cuda"))
        pos.add_(8)
        graph.replay()
        torch.cuda.synchronize()
        table.positions = pos.cpu()
        targets = table.targets()
        assert len(targets) == table.nnz
        ref_write(e_ckv, src[:, :512].cpu(), targets)
        ref_write(e_kpe, src[:, 512:].cpu(), targets)
        ref_write(e_k, kv[:, 0].cpu(), targets, hnd=True)
        ref_write(e_v, kv[:, 1].cpu(), targets, hnd=True)
        assert_same(whole, expect)  # this replay's rows, and the previous replay's still in place
        assert_same(kv_whole, (e_k, e_v))
