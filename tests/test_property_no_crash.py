"""Property tests over every public op (issue 8): random shapes, strides,
dtypes and index values, valid and invalid. Each call either returns the
reference result or raises ValueError/TypeError whose message names the
argument; it never crashes and never writes outside its target, which is a
strided view into a larger poisoned buffer whose every other element is
checked after the call.

The number of cases per op is printed by the last test (`pytest -s` shows
the "N cases" lines).
"""

import collections
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mlacore

CASES = collections.Counter()
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INT64_MAX = 2**63 - 1
BAD_INDEX_DTYPES = [torch.float32, torch.int16, torch.uint8, torch.bool, torch.float64]
POISON = -0x5A5A


# --- poisoned targets ------------------------------------------------------------

class Poisoned:
    """A strided view into a larger buffer; everything else must stay poisoned."""

    def __init__(self, draw, shape, dtype, *, contiguous_last=False, fill=None):
        ndim = len(shape)
        order = list(range(ndim))
        if ndim > 1 and draw(st.booleans()):
            tail = order[:-1] if contiguous_last else order
            perm = draw(st.permutations(tail))
            order = list(perm) + ([ndim - 1] if contiguous_last else [])
        strides = [0] * ndim
        run = 1
        for d in reversed(order):
            strides[d] = run
            run *= max(shape[d], 1) + draw(st.integers(0, 2))
        if ndim and not contiguous_last and draw(st.integers(0, 4)) == 0:
            strides[-1] *= 2
        offset = draw(st.integers(0, 5))
        span = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0) + 1
        size = span + draw(st.integers(1, 6))
        poison = POISON if dtype not in (torch.bool, torch.uint8) else 0xA5 if dtype == torch.uint8 else True
        self.buf = torch.full((size,), poison, dtype=dtype)
        self.view = self.buf.as_strided(shape, strides, offset)
        if fill is not None:
            self.view.copy_(fill)
        elif self.view.is_floating_point():
            self.view.copy_(torch.randn(shape))
        self.mask = torch.zeros(size, dtype=torch.bool)
        if all(n > 0 for n in shape):
            pos = torch.arange(size).as_strided(shape, strides, offset)
            self.mask[pos.flatten()] = True
        self.before = self.buf.clone()

    def outside_untouched(self):
        return torch.equal(self.buf[~self.mask], self.before[~self.mask])


def index_values(draw, n, hi, extreme64=True):
    """n index values: mostly in [0, hi), sometimes negative, huge or at the extremes."""
    specials = [-1, hi, -(2**31), 2**31 - 1] + ([2**40, -(2**63), INT64_MAX] if extreme64 else [])
    return draw(st.lists(st.one_of(st.integers(0, max(hi - 1, 0)), st.sampled_from(specials)), min_size=n,
                         max_size=n))


def as_index(values, dtype, draw, name="idx"):
    """A 1-D index tensor of `dtype`, contiguous or a strided view (values wrap for int32)."""
    t = torch.tensor(values, dtype=torch.int64)
    if dtype == torch.int32:
        t = ((t + 2**31) % 2**32 - 2**31).to(torch.int32)
    else:
        t = t.to(dtype)
    if draw(st.booleans()) and t.numel() > 0:
        step = draw(st.integers(2, 3))
        buf = torch.full((t.numel() * step,), 7, dtype=t.dtype)
        view = buf[::step]
        view.copy_(t)
        return view
    return t


def expect_error(fn, exc, names):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert msg and any(n in msg for n in names), f"{exc.__name__} names none of {names}: {msg}"


# --- slot_mapping ------------------------------------------------------------------

def ref_slot(indices, indptr, page_size, num_pages, b, p):
    batch = len(indptr) - 1
    if not (0 <= b < batch) or p < 0:
        return -1
    begin, end = indptr[b], indptr[b + 1]
    if not (0 <= begin <= end <= len(indices)) or p // page_size >= end - begin:
        return -1
    page = indices[begin + p // page_size]
    limit = INT64_MAX // page_size if num_pages is None else num_pages
    return page * page_size + p % page_size if 0 <= page < limit else -1


@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_slot_mapping_property(data):
    draw = data.draw
    CASES["slot_mapping"] += 1
    tok, idx = draw(st.sampled_from([torch.int32, torch.int64])), draw(st.sampled_from([torch.int32, torch.int64]))
    nnz, batch = draw(st.integers(0, 24)), draw(st.integers(0, 5))
    page_size = draw(st.sampled_from([1, 2, 16, 64, 2**20, 2**40]))
    num_pages = draw(st.one_of(st.none(), st.integers(0, 40), st.just(2**31)))
    n_idx = draw(st.integers(0, 16))
    indices = index_values(draw, n_idx, num_pages or 40, extreme64=idx == torch.int64)
    indptr = sorted(draw(st.lists(st.integers(0, n_idx), min_size=batch + 1, max_size=batch + 1)))
    if draw(st.integers(0, 5)) == 0 and batch:
        indptr[draw(st.integers(0, batch))] = draw(st.sampled_from([-3, n_idx + 2, 2**31 - 1]))
    bi = index_values(draw, nnz, batch, extreme64=tok == torch.int64)
    pos = [v if draw(st.booleans()) else draw(st.integers(0, 3 * page_size)) for v in
           index_values(draw, nnz, 4 * page_size if page_size < 2**30 else 2**31 - 1, extreme64=tok == torch.int64)]
    args = [as_index(bi, tok, draw), as_index(pos, tok, draw), as_index(indices, idx, draw),
            as_index(indptr, idx, draw)]
    names = ["batch_indices", "positions", "kv_indices", "kv_indptr"]
    bad = draw(st.integers(0, 9))
    if bad < 4:  # one argument of a wrong dtype, rank or kind
        k = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["dtype", "rank", "kind"]))
        if kind == "dtype":
            args[k] = args[k].to(draw(st.sampled_from(BAD_INDEX_DTYPES)))
        elif kind == "rank":
            args[k] = args[k].reshape(1, -1)
        else:
            args[k] = args[k].tolist()
        exc = TypeError if kind == "kind" else ValueError
        expect_error(lambda: mlacore.slot_mapping(*args, page_size, num_pages), exc, [names[k], "batch_indices"])
        return
    if bad == 4:
        expect_error(lambda: mlacore.slot_mapping(*args, draw(st.sampled_from([0, -1])), num_pages), ValueError,
                     ["page_size"])
        return
    if bad == 5 and nnz:
        args[1] = args[1][:-1]
        expect_error(lambda: mlacore.slot_mapping(*args, page_size, num_pages), ValueError, ["positions"])
        return
    vi, vp = args[0].tolist(), args[1].tolist()
    ii, ip = args[2].tolist(), args[3].tolist()
    if num_pages is not None and num_pages > INT64_MAX // page_size:
        expect_error(lambda: mlacore.slot_mapping(*args, page_size, num_pages), ValueError, ["num_pages"])
        return
    got = mlacore.slot_mapping(*args, page_size, num_pages).tolist()
    assert got == [ref_slot(ii, ip, page_size, num_pages, b, p) for b, p in zip(vi, vp)]


# --- page_indices_from_block_table ---------------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_block_table_property(data):
    draw = data.draw
    CASES["page_indices_from_block_table"] += 1
    dt, cdt = draw(st.sampled_from([torch.int32, torch.int64])), draw(st.sampled_from([torch.int32, torch.int64]))
    rows, cols, out_len = draw(st.integers(0, 5)), draw(st.integers(0, 6)), draw(st.integers(0, 30))
    table = Poisoned(draw, (rows, cols), dt, fill=torch.randint(0, 1000, (rows, cols)))
    cu_vals = [0]
    for _ in range(rows):
        cu_vals.append(cu_vals[-1] + draw(st.integers(0, cols + 2)))
    if draw(st.integers(0, 4)) == 0:
        cu_vals[draw(st.integers(0, rows))] = draw(st.sampled_from([-5, out_len + 3, 2**31 - 1]))
    cu = as_index(cu_vals, cdt, draw)
    out = Poisoned(draw, (out_len,), dt)
    bad = draw(st.integers(0, 7))
    if bad == 0:
        expect_error(lambda: mlacore.page_indices_from_block_table(table.view, cu, out.view.to(
            torch.int64 if dt == torch.int32 else torch.int32)), ValueError, ["out"])
    elif bad == 1:
        expect_error(lambda: mlacore.page_indices_from_block_table(table.view.to(torch.float32), cu, out.view),
                     ValueError, ["block_table"])
    elif bad == 2:
        expect_error(lambda: mlacore.page_indices_from_block_table(table.view, cu[:-1] if rows else cu[:0],
                                                                   out.view), ValueError, ["cu_num_blocks"])
    elif bad == 3:
        expect_error(lambda: mlacore.page_indices_from_block_table(table.view[0] if rows else table.view.flatten(),
                                                                   cu, out.view), ValueError, ["block_table"])
    else:
        expect = out.view.clone()
        t, c = table.view.tolist(), cu.tolist()
        for r in range(rows):
            b, e = c[r], c[r + 1]
            if b < 0 or e < b or b >= out_len:
                continue
            for j in range(min(e - b, cols, out_len - b)):
                expect[b + j] = t[r][j]
        mlacore.page_indices_from_block_table(table.view, cu, out.view)
        assert torch.equal(out.view, expect)
    assert out.outside_untouched() and torch.equal(table.buf, table.before)


# --- get_batch_indices_positions -------------------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_batch_positions_property(data):
    draw = data.draw
    CASES["get_batch_indices_positions"] += 1
    dt = draw(st.sampled_from([torch.int32, torch.int64]))
    batch, nnz = draw(st.integers(0, 5)), draw(st.integers(0, 30))
    indptr = [draw(st.integers(0, 3))]
    for _ in range(batch):
        indptr.append(indptr[-1] + draw(st.integers(0, 8)))
    lens = [draw(st.one_of(st.integers(0, 40), st.sampled_from([-1, 2**31 - 1]))) for _ in range(batch)]
    a, s = as_index(indptr, dt, draw), as_index(lens, dt, draw)
    bad = draw(st.integers(0, 6))
    if bad == 0:
        expect_error(lambda: mlacore.get_batch_indices_positions(a, s.to(torch.float32), nnz), ValueError,
                     ["seq_lens"])
        return
    if bad == 1:
        expect_error(lambda: mlacore.get_batch_indices_positions(a, a, nnz), ValueError, ["seq_lens"])
        return
    if bad == 2:
        expect_error(lambda: mlacore.get_batch_indices_positions(a, s, -1), ValueError, ["nnz"])
        return
    bi, pos = mlacore.get_batch_indices_positions(a, s, nnz)
    eb, ep = [-1] * nnz, [-1] * nnz
    for b in range(batch):
        for t in range(max(indptr[b], 0), min(indptr[b + 1], nnz)):
            p = lens[b] - (indptr[b + 1] - t)
            eb[t], ep[t] = b, (p if 0 <= p <= 2**31 - 1 and lens[b] >= 0 else -1)
    assert bi.tolist() == eb and pos.tolist() == ep


# --- appends ------------------------------------------------------------------------

def append_indices(draw, nnz, pages, page_size):
    batch = draw(st.integers(0, 4))
    n_idx = draw(st.integers(0, 10))
    indices = index_values(draw, n_idx, pages, extreme64=False)
    indptr = sorted(draw(st.lists(st.integers(0, n_idx), min_size=batch + 1, max_size=batch + 1)))
    bi = index_values(draw, nnz, batch, extreme64=False)
    pos = [draw(st.one_of(st.integers(0, 4 * page_size), st.sampled_from([-1, 2**31 - 1])))
           for _ in range(nnz)]
    dt = draw(st.sampled_from([torch.int32, torch.int64]))
    return dict(batch_indices=as_index(bi, dt, draw), positions=as_index(pos, dt, draw),
                kv_indices=as_index(indices, dt, draw), kv_indptr=as_index(indptr, dt, draw),
                kv_last_page_len=torch.ones(batch, dtype=dt)), (bi, pos, indices, indptr)


def append_slots(ref, pages, page_size):
    bi, pos, indices, indptr = ref
    return [ref_slot(indices, indptr, page_size, pages, b, p) for b, p in zip(bi, pos)]


INDEX_NAMES = ["batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"]


def break_index(draw, idx):
    name = draw(st.sampled_from(INDEX_NAMES))
    kind = draw(st.sampled_from(["dtype", "rank", "length"]))
    if name == "kv_indices" and kind == "length":
        kind = "rank"  # any length of kv_indices is valid
    t = idx[name]
    if kind == "dtype":
        idx[name] = t.to(draw(st.sampled_from(BAD_INDEX_DTYPES)))
    elif kind == "rank":
        idx[name] = t.reshape(1, -1)
    else:
        idx[name] = torch.cat([t, t.new_zeros(1)])
    return name


@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_append_mla_property(data):
    draw = data.draw
    CASES["append_paged_mla_kv_cache"] += 1
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    P, S, nnz = draw(st.integers(0, 4)), draw(st.sampled_from([1, 3, 16])), draw(st.integers(0, 12))
    dc, dp = draw(st.sampled_from([512, 16, 8])), draw(st.sampled_from([64, 8, 1]))
    cache = Poisoned(draw, (P, S, dc + dp), dtype, contiguous_last=True)
    ckv, kpe = cache.view[..., :dc], cache.view[..., dc:]
    src = torch.randn(nnz, dc + dp).to(dtype)
    idx, ref = append_indices(draw, nnz, P, S)
    bad = draw(st.integers(0, 9))
    if bad < 3:
        name = break_index(draw, idx)
        expect_error(lambda: mlacore.append_paged_mla_kv_cache(src[:, :dc], src[:, dc:], idx["batch_indices"],
                                                               idx["positions"], ckv, kpe, idx["kv_indices"],
                                                               idx["kv_indptr"], idx["kv_last_page_len"]),
                     ValueError, [name, "nnz", "batch"])
    elif bad == 3:
        expect_error(lambda: mlacore.append_paged_mla_kv_cache(src[:, :dc].to(torch.float64), src[:, dc:],
                                                               *list(idx.values())[:2], ckv, kpe,
                                                               *list(idx.values())[2:]),
                     ValueError, ["append_ckv"])
    elif bad == 4:
        expect_error(lambda: mlacore.append_paged_mla_kv_cache(src[:, :dc], src[:, dc:], *list(idx.values())[:2],
                                                               ckv, kpe.unsqueeze(0), *list(idx.values())[2:]),
                     ValueError, ["kpe_cache"])
    elif bad == 5:
        expect_error(lambda: mlacore.append_paged_mla_kv_cache(src[:, :dc], src[:, dc:], *list(idx.values())[:2],
                                                               ckv, kpe, *list(idx.values())[2:], backend="fast"),
                     ValueError, ["backend"])
    else:
        expect = cache.view.clone()
        for t, slot in enumerate(append_slots(ref, P, S)):
            if slot >= 0:
                expect[slot // S, slot % S] = src[t]
        mlacore.append_paged_mla_kv_cache(src[:, :dc], src[:, dc:], *list(idx.values())[:2], ckv, kpe,
                                          *list(idx.values())[2:])
        assert torch.equal(cache.view, expect)
    assert cache.outside_untouched()


@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_append_kv_property(data):
    draw = data.draw
    CASES["append_paged_kv_cache"] += 1
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    layout = draw(st.sampled_from(["NHD", "HND"]))
    P, S, H, D, nnz = (draw(st.integers(0, 3)), draw(st.sampled_from([1, 4])), draw(st.integers(1, 3)),
                       draw(st.sampled_from([8, 64])), draw(st.integers(0, 10)))
    inner = (S, H, D) if layout == "NHD" else (H, S, D)
    cache = Poisoned(draw, (P, 2) + inner, dtype, contiguous_last=True)
    fused = draw(st.booleans())
    target = cache.view if fused else (cache.view[:, 0], cache.view[:, 1])
    key, value = torch.randn(nnz, H, D).to(dtype), torch.randn(nnz, H, D).to(dtype)
    idx, ref = append_indices(draw, nnz, P, S)
    vals = list(idx.values())
    bad = draw(st.integers(0, 9))
    if bad < 3:
        name = break_index(draw, idx)
        vals = list(idx.values())
        expect_error(lambda: mlacore.append_paged_kv_cache(key, value, *vals[:2], target, *vals[2:], kv_layout=layout),
                     ValueError, [name, "nnz", "batch"])
    elif bad == 3:
        expect_error(lambda: mlacore.append_paged_kv_cache(key, value, *vals[:2], target, *vals[2:], kv_layout="NDH"),
                     ValueError, ["kv_layout"])
    elif bad == 4:
        expect_error(lambda: mlacore.append_paged_kv_cache(key[:, :, :1] if D > 1 else key.repeat(1, 1, 2), value,
                                                           *vals[:2], target, *vals[2:], kv_layout=layout),
                     ValueError, ["append_key"])
    elif bad == 5:
        expect_error(lambda: mlacore.append_paged_kv_cache(key, value, *vals[:2], [target] if fused else 3,
                                                           *vals[2:], kv_layout=layout), (TypeError, ValueError),
                     ["paged_kv_cache"])
    else:
        expect = cache.view.clone()
        for t, slot in enumerate(append_slots(ref, P, S)):
            if slot >= 0:
                p, o = slot // S, slot % S
                for kv, src in ((0, key), (1, value)):
                    if layout == "NHD":
                        expect[p, kv, o] = src[t]
                    else:
                        expect[p, kv, :, o] = src[t]
        mlacore.append_paged_kv_cache(key, value, *vals[:2], target, *vals[2:], kv_layout=layout)
        assert torch.equal(cache.view, expect)
    assert cache.outside_untouched()


# --- combined_kv_view / explain_kv_layout -----------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_kv_layout_property(data):
    draw = data.draw
    CASES["combined_kv_view/explain_kv_layout"] += 1
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.int8]))
    P, S, dc, dp = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 16)), draw(st.integers(1, 8))
    pad = draw(st.integers(0, 2))
    layers = draw(st.integers(1, 2))
    buf = torch.zeros(layers, P, S, dc + dp + pad, dtype=dtype)
    layer = buf[draw(st.integers(0, layers - 1))]
    ckv, kpe = layer[..., :dc], layer[..., dc:dc + dp]
    adjacent = pad == 0
    mode = draw(st.integers(0, 6))
    if mode == 1:
        kpe = kpe.clone()  # a separate storage can never be viewed together
        adjacent = False
    elif mode == 2:
        ckv, kpe = layer[..., dp:dp + dc], layer[..., :dp]
        adjacent = False
    elif mode == 3:
        kpe = kpe.to(torch.float64)
        adjacent = False
    elif mode == 4:
        expect_error(lambda: mlacore.combined_kv_view(ckv.unsqueeze(0), kpe), ValueError, ["ckv_cache"])
        return
    elif mode == 5:
        other = torch.zeros(P + 1, S, dp, dtype=dtype) if draw(st.booleans()) else torch.zeros(P, S + 1, dp, dtype=dtype)
        expect_error(lambda: mlacore.combined_kv_view(ckv, other), ValueError, ["kpe_cache"])
        return
    if S <= 1 and pad and mode in (0, 6):
        adjacent = True  # one token per page: the token stride addresses nothing
    if P * S == 0:
        adjacent = None  # an empty cache has no element addresses to compare: only safety matters
    view = mlacore.combined_kv_view(ckv, kpe)
    text = mlacore.explain_kv_layout(ckv, kpe)
    assert text.startswith("adjacent") == (view is not None)
    if adjacent is not None:
        assert (view is not None) == adjacent, text
    if view is not None:
        assert view.shape == (P, S, dc + dp)
        if P * S:
            assert torch.equal(view[..., :dc], ckv) and torch.equal(view[..., dc:], kpe)
            assert view.data_ptr() == ckv.data_ptr()


# --- plan and decode ---------------------------------------------------------------------

@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_plan_property(data):
    draw = data.draw
    CASES["MlaPlan.build"] += 1
    max_batch = draw(st.integers(1, 6))
    plan = mlacore.MlaPlan("cpu", max_batch, num_sms=draw(st.integers(1, 64)))
    B = draw(st.integers(0, max_batch))
    page_size = draw(st.sampled_from([1, 16, 64]))
    lens = [draw(st.integers(0, 400)) for _ in range(B)]
    qo = [0]
    kv = [0]
    for n in lens:
        qo.append(qo[-1] + draw(st.integers(0, 3)))
        kv.append(kv[-1] + -(-n // page_size))
    bad = draw(st.integers(0, 9)) if B else 9
    name = None
    if bad == 0:
        qo[0], name = 1, "qo_indptr"
    elif bad == 1:
        lens[draw(st.integers(0, B - 1))] += page_size
        name = "kv_len_arr"
    elif bad == 2:
        b = draw(st.integers(0, B - 1))
        qo[b + 1] = qo[b] - 1
        name = "qo_indptr"
    elif bad == 3:
        lens[draw(st.integers(0, B - 1))] = -1
        name = "kv_len_arr"
    dts = [draw(st.sampled_from([torch.int32, torch.int64])) for _ in range(3)]
    q, k, l = as_index(qo, dts[0], draw), as_index(kv, dts[1], draw), as_index(lens, dts[2], draw)
    if bad == 4:
        expect_error(lambda: plan.build(q, k, l[:-1], page_size, 4), ValueError, ["kv_len_arr"])
        return
    if bad == 5:
        expect_error(lambda: plan.build(q, k, l, 0, 4), ValueError, ["page_size"])
        return
    if name:
        expect_error(lambda: plan.build(q, k, l, page_size, 4), ValueError, [name])
        return
    plan.build(q, k, l, page_size, 4)
    info = plan.info
    assert info.batch == B and info.total_qo == qo[B] and info.error == 0
    assert info.max_kv_len == max(lens, default=0)
    assert plan.kv_last_page_len.tolist()[:B] == [n - (-(-n // page_size) - 1) * page_size if n else 0 for n in lens]
    items = plan.work_items[: info.num_work].tolist()
    for b in range(B):  # every request covered exactly, in order
        mine = [it for it in items if it[0] == b]
        assert mine and mine[0][1] == 0 and mine[-1][2] == lens[b]
        assert all(x[2] == y[1] for x, y in zip(mine, mine[1:]))


def decode_reference(q, ckv, kpe, qo, kvp, idx, lens, scale, causal):
    out = torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.float64)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    P, S = ckv.shape[:2]
    for b, L in enumerate(lens):
        ql = qo[b + 1] - qo[b]
        for t in range(ql):
            keys = [(idx[kvp[b] + p // S], p % S) for p in range(L)
                    if p // S < kvp[b + 1] - kvp[b] and (not causal or p < L - ql + t + 1)]
            keys = [(pg, o) for pg, o in keys if 0 <= pg < P]
            if not keys:
                continue
            kc = torch.stack([torch.cat([ckv[pg, o], kpe[pg, o]]) for pg, o in keys]).double()
            s = (q[qo[b] + t].double() @ kc.T) * scale
            lse[qo[b] + t] = torch.logsumexp(s, -1) / math.log(2)
            out[qo[b] + t] = torch.softmax(s, -1) @ kc[:, :512]
    return out, lse


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_decode_property(data):
    draw = data.draw
    CASES["BatchMLAPagedAttentionWrapper"] += 1
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    H, S, B = draw(st.integers(1, 3)), draw(st.sampled_from([1, 16, 64])), draw(st.integers(0, 3))
    lens = [draw(st.integers(0, 90)) for _ in range(B)]
    qls = [draw(st.integers(0, 2)) for _ in range(B)]
    kvp = [0]
    for n in lens:
        kvp.append(kvp[-1] + -(-n // S))
    P = max(kvp[-1], 1) + draw(st.integers(0, 2))
    idx = index_values(draw, kvp[-1], P, extreme64=False)
    qo = [0]
    for n in qls:
        qo.append(qo[-1] + n)
    causal = draw(st.booleans())
    cache = Poisoned(draw, (P, S, 576), dtype, contiguous_last=True)
    cache.before = cache.buf.clone()
    ckv, kpe = cache.view[..., :512], cache.view[..., 512:]
    q = torch.randn(qo[-1], H, 576).to(dtype)
    out = Poisoned(draw, (qo[-1], H, 512), dtype, contiguous_last=True)
    dt = draw(st.sampled_from([torch.int32, torch.int64]))
    tens = [as_index(v, dt, draw) for v in (qo, kvp, idx, lens)]
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16 << 20, dtype=torch.uint8))
    bad = draw(st.integers(0, 7))
    if bad == 0:
        expect_error(lambda: w.plan(*tens, 0, 512, 64, S, causal, 0.1, dtype, dtype), ValueError, ["num_heads"])
        return
    if bad == 1:
        expect_error(lambda: w.plan(*tens[:3], tens[3].float(), H, 512, 64, S, causal, 0.1, dtype, dtype), ValueError,
                     ["kv_len_arr"])
        return
    w.plan(*tens, H, 512, 64, S, causal, 0.1, dtype, dtype)
    if bad == 2:
        expect_error(lambda: w.run(q[..., :512], q[..., 512:], ckv.to(torch.float32), kpe), ValueError, ["ckv_cache"])
        return
    if bad == 3:
        expect_error(lambda: w.run(q[..., :512], q[..., 512:], ckv, kpe[:, :, :32]), ValueError, ["kpe_cache"])
        return
    res, lse = w.run(q[..., :512], q[..., 512:], ckv, kpe, out=out.view, return_lse=True)
    assert res is out.view and out.outside_untouched() and torch.equal(cache.buf, cache.before)
    ref_o, ref_l = decode_reference(q, ckv, kpe, qo, kvp, tens[2].tolist(), lens, 0.1, causal)
    if res.numel():
        assert (res.double() - ref_o).abs().max().item() <= 2e-2
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isfinite(lse), fin) and (lse[~fin] == -math.inf).all()
    if fin.any():
        assert (lse.double()[fin] - ref_l[fin]).abs().max().item() <= 2e-3


# --- huge logical sizes (issue 28) -------------------------------------------------
# expand() gives an argument a size near INT64_MAX / INT32_MAX in one element
# of memory. The op either runs (reading only what it needs) or raises
# ValueError/TypeError naming an argument, with its outputs untouched.

HUGE_SIZES = [INT64_MAX, INT64_MAX - 1, 2**62, 2**61 + 1, 2**59, 2**32, 2**31, 2**31 - 1]


def huge_like(t, n, draw):
    """`t`'s first element broadcast to n elements in dim 0 (2-D: rows or columns)."""
    one = t.reshape(-1)[:1] if t.numel() else torch.zeros(1, dtype=t.dtype)
    if t.dim() == 2:  # torch itself refuses more than 2^63-1 elements
        if draw(st.booleans()):
            return one.view(1, 1).expand(min(n, INT64_MAX // t.shape[1]), t.shape[1])
        return one.view(1, 1).expand(t.shape[0], min(n, INT64_MAX // t.shape[0]))
    return one.expand(n)


@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_huge_expanded_sizes_property(data):
    draw = data.draw
    n = draw(st.sampled_from(HUGE_SIZES))
    op = draw(st.sampled_from(["slot_mapping", "page_indices_from_block_table", "append_paged_mla_kv_cache"]))
    dt = draw(st.sampled_from([torch.int32, torch.int64]))
    idx = lambda v: torch.tensor(v, dtype=dt)
    if op == "slot_mapping":
        args = dict(batch_indices=idx([0, 1]), positions=idx([0, 3]), kv_indices=idx([0, 1, 2]),
                    kv_indptr=idx([0, 2, 3]))
        name = draw(st.sampled_from(sorted(args)))
        args[name] = huge_like(args[name], n, draw)
        call = lambda: mlacore.slot_mapping(args["batch_indices"], args["positions"], args["kv_indices"],
                                            args["kv_indptr"], 4)
        outputs = []
    elif op == "page_indices_from_block_table":
        out = torch.full((6,), -5, dtype=dt)
        args = dict(block_table=idx([[1, 2], [3, 4]]), cu_num_blocks=idx([0, 2, 4]))
        name = draw(st.sampled_from(sorted(args)))
        args[name] = huge_like(args[name], n, draw)
        call = lambda: mlacore.page_indices_from_block_table(args["block_table"], args["cu_num_blocks"], out)
        outputs = [out]
    else:
        ckv = torch.full((3, 2, 512), 5.0, dtype=torch.bfloat16)
        kpe = torch.full((3, 2, 64), 5.0, dtype=torch.bfloat16)
        args = dict(batch_indices=idx([0, 1]), positions=idx([0, 1]), kv_indices=idx([0, 2]),
                    kv_indptr=idx([0, 1, 2]), kv_last_page_len=idx([1, 2]))
        name = draw(st.sampled_from(sorted(args)))
        args[name] = huge_like(args[name], n, draw)
        src_ckv, src_kpe = torch.randn(2, 512).to(torch.bfloat16), torch.randn(2, 64).to(torch.bfloat16)
        strict = draw(st.booleans())
        call = lambda: mlacore.append_paged_mla_kv_cache(src_ckv, src_kpe, args["batch_indices"], args["positions"],
                                                         ckv, kpe, args["kv_indices"], args["kv_indptr"],
                                                         args["kv_last_page_len"], strict=strict)
        outputs = [ckv, kpe]
    CASES[op] += 1
    before = [t.clone() for t in outputs]
    try:
        call()
    except (ValueError, TypeError) as e:
        assert any(a in str(e) for a in list(args) + ["out", "nnz"]), f"names no argument: {e}"
        assert all(torch.equal(t, b) for t, b in zip(outputs, before)), "a refused call wrote"


def test_zz_case_counts():
    """Prints the number of cases each property test ran (pytest -s shows them)."""
    total = sum(CASES.values())
    for name, n in sorted(CASES.items()):
        print(f"property {name}: {n} cases")
    print(f"property total: {total} cases")
    if total == 0:
        pytest.skip("no property test ran in this session (selected alone)")
    ops = ["slot_mapping", "page_indices_from_block_table", "get_batch_indices_positions",
           "append_paged_mla_kv_cache", "append_paged_kv_cache", "combined_kv_view/explain_kv_layout",
           "MlaPlan.build", "BatchMLAPagedAttentionWrapper"]
    assert set(CASES) <= set(ops), f"unknown counters: {set(CASES) - set(ops)}"
