"""Edge cases across the public ops (issue 8): empty requests, padded batches,
slots and offsets beyond 2^31, int64 = int32, non-contiguous index tensors,
mixed devices, side streams, and concurrency (threads with their own plans
and wrappers, the AITER probe raced by 16 threads in a fresh process).

CPU always; GPU variants through the `device` fixture or @requires_cuda.
"""

import math
import os
import subprocess
import sys
import threading

import pytest
import torch

import mlacore

from conftest import repeats, requires_cuda

LOG2E = 1.0 / math.log(2.0)
SCALE = 1.0 / math.sqrt(192)


# --- helpers ------------------------------------------------------------------

def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def i64(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def spread(t, step=3):
    """The same values as a strided (non-contiguous) view with junk in between."""
    buf = torch.full((max(t.numel() * step, 1),), -77, dtype=t.dtype, device=t.device)
    view = buf[::step][: t.numel()]
    view.copy_(t)
    assert not view.is_contiguous() or t.numel() <= 1
    return view


def decode_case(kv_lens, qo_lens, page_size, heads, device, *, extra_pages=2, seed=0, dtype=torch.bfloat16):
    """q, a page-shuffled [P, S, 576] cache split in halves, FlashInfer index tensors."""
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_per) + extra_pages
    kv_indices = torch.randperm(num_pages, generator=g)[: sum(pages_per)].to(torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages_per, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    total_q = int(qo_indptr[-1])
    buf = (torch.randn(num_pages, page_size, 576, generator=g) * 0.5).to(dtype)
    ckv, kpe = torch.split(buf, [512, 64], dim=-1)
    d = dict(q_nope=torch.randn(total_q, heads, 512, generator=g).to(dtype),
             q_pe=torch.randn(total_q, heads, 64, generator=g).to(dtype), ckv=ckv, kpe=kpe,
             qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
             kv_len=torch.tensor(kv_lens, dtype=torch.int32))
    d = {k: v.to(device) for k, v in d.items()}
    d.update(page_size=page_size, heads=heads, dtype=dtype)
    return d


def decode_reference(d, causal):
    qn, qp = d["q_nope"].double().cpu(), d["q_pe"].double().cpu()
    ckv, kpe = d["ckv"].double().cpu(), d["kpe"].double().cpu()
    qo, kvp, idx, lens = (d[k].cpu().long().tolist() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len"))
    P, S = ckv.shape[:2]
    out = torch.zeros(qn.shape[0], qn.shape[1], 512, dtype=torch.float64)
    lse = torch.full(qn.shape[:2], -math.inf, dtype=torch.float64)
    for b, L in enumerate(lens):
        q0, q1 = qo[b], qo[b + 1]
        for t in range(q1 - q0):
            keys = []
            for p in range(L):
                if causal and p >= L - (q1 - q0) + t + 1:
                    continue
                k = p // S
                if k >= kvp[b + 1] - kvp[b]:
                    continue
                page = idx[kvp[b] + k]
                if 0 <= page < P:
                    keys.append((page, p % S))
            if not keys:
                continue
            kc = torch.stack([ckv[pg, o] for pg, o in keys])
            kp = torch.stack([kpe[pg, o] for pg, o in keys])
            s = (qn[q0 + t] @ kc.T + qp[q0 + t] @ kp.T) * SCALE
            lse[q0 + t] = torch.logsumexp(s, -1) * LOG2E
            out[q0 + t] = torch.softmax(s, -1) @ kc
    return out, lse


def run_decode(d, causal=True, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len=None, wrapper=None):
    dev = d["q_nope"].device
    w = wrapper or mlacore.BatchMLAPagedAttentionWrapper(torch.empty(32 << 20, dtype=torch.uint8, device=dev))
    w.plan(d["qo_indptr"] if qo_indptr is None else qo_indptr, d["kv_indptr"] if kv_indptr is None else kv_indptr,
           d["kv_indices"] if kv_indices is None else kv_indices, d["kv_len"] if kv_len is None else kv_len,
           d["heads"], 512, 64, d["page_size"], causal, SCALE, d["dtype"], d["dtype"])
    return w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True)


def assert_decode_close(d, out, lse, causal):
    ref_o, ref_l = decode_reference(d, causal)
    got = out.double().cpu()
    assert (got - ref_o).abs().max().item() <= 2e-2 if got.numel() else True
    gl = lse.double().cpu()
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isfinite(gl), fin)
    assert (gl[~fin] == -math.inf).all()
    if fin.any():
        assert (gl[fin] - ref_l[fin]).abs().max().item() <= 2e-3


# --- empty requests (seq_len == 0) -----------------------------------------------

def test_empty_requests_in_slot_mapping(device):
    # Request 1 owns no pages: every token of it gets -1, its neighbours are exact.
    indptr, indices = i32([0, 2, 2, 3], device), i32([7, 3, 9], device)
    bi, pos = i32([0, 1, 1, 2, 0], device), i32([17, 0, 5, 2, 3], device)
    out = mlacore.slot_mapping(bi, pos, indices, indptr, 16)
    assert out.cpu().tolist() == [3 * 16 + 1, -1, -1, 9 * 16 + 2, 7 * 16 + 3]
    # nnz == 0: an empty int64 result.
    empty = mlacore.slot_mapping(i32([], device), i32([], device), indices, indptr, 16)
    assert empty.shape == (0,) and empty.dtype == torch.int64


def test_empty_requests_in_batch_positions(device):
    # Requests 0 and 2 append nothing; request 3 has seq_len 0 but appends 1 (position -1).
    bi, pos = mlacore.get_batch_indices_positions(i32([0, 0, 2, 2, 3], device), i32([4, 6, 9, 0], device), 4)
    assert bi.cpu().tolist() == [1, 1, 3, -1]
    assert pos.cpu().tolist() == [4, 5, -1, -1]


@pytest.mark.parametrize("kind", ["mla", "kv"])
def test_empty_requests_in_append_write_nothing(device, kind):
    # Request 1 has no pages: its tokens are skipped; request 0's token lands.
    P, S = 3, 4
    indptr, indices, last = i32([0, 1, 1], device), i32([2], device), i32([1, 0], device)
    bi, pos = i32([1, 0, 1], device), i32([0, 1, 5], device)
    if kind == "mla":
        buf = torch.zeros(P, S, 576, device=device)
        ckv, kpe = torch.split(buf, [512, 64], -1)
        src = torch.arange(3 * 576, dtype=torch.float32, device=device).view(3, 576) + 1
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, indices, indptr, last)
        expect = torch.zeros_like(buf)
        expect[2, 1] = src[1]
        assert torch.equal(buf, expect)
    else:
        cache = torch.zeros(P, 2, S, 2, 8, device=device)
        key = torch.arange(3 * 16, dtype=torch.float32, device=device).view(3, 2, 8) + 1
        mlacore.append_paged_kv_cache(key, -key, bi, pos, cache, indices, indptr, last)
        expect = torch.zeros_like(cache)
        expect[2, 0, 1], expect[2, 1, 1] = key[1], -key[1]
        assert torch.equal(cache, expect)
    # nnz == 0 is a no-op, not an error.
    if kind == "mla":
        before = buf.clone()
        e = torch.empty(0, 576, device=device)
        mlacore.append_paged_mla_kv_cache(e[:, :512], e[:, 512:], i32([], device), i32([], device), ckv, kpe,
                                          indices, indptr, last)
        assert torch.equal(buf, before)


def test_empty_requests_in_decode_give_zeros_and_minus_inf(device):
    d = decode_case([0, 37, 0, 70], [1, 2, 2, 1], 16, 4, device, seed=1)
    out, lse = run_decode(d, causal=True)
    q = d["qo_indptr"].cpu().tolist()
    for b in (0, 2):
        rows = slice(q[b], q[b + 1])
        assert torch.equal(out[rows], torch.zeros_like(out[rows])), f"request {b} without KV must give zeros"
        assert (lse[rows] == -math.inf).all()
    assert_decode_close(d, out, lse, True)


def test_decode_of_an_all_empty_batch(device):
    d = decode_case([0, 0], [1, 1], 64, 2, device, extra_pages=1)
    out, lse = run_decode(d)
    assert torch.equal(out, torch.zeros_like(out)) and (lse == -math.inf).all()


# --- batch padded beyond the live requests ---------------------------------------

def test_padded_batch_in_slot_mapping_and_append(device):
    # Live requests 0, 1; requests 2..5 are padding (no pages). Tokens that
    # name padding get -1 / write nothing, as do tokens past batch.
    indptr, indices = i32([0, 1, 3, 3, 3, 3, 3], device), i32([4, 0, 2], device)
    bi, pos = i32([0, 1, 3, 5, 6, 1], device), i32([1, 9, 0, 0, 0, 3], device)
    assert mlacore.slot_mapping(bi, pos, indices, indptr, 8).cpu().tolist() == [33, 2 * 8 + 1, -1, -1, -1, 3]
    cache = torch.zeros(5, 8, 2, 4, device=device), torch.zeros(5, 8, 2, 4, device=device)
    key = torch.randn(6, 2, 4, device=device)
    mlacore.append_paged_kv_cache(key, key * 2, bi, pos, cache, indices, indptr, torch.zeros(6, dtype=torch.int32,
                                                                                             device=device))
    written = (cache[0] != 0).any(-1).any(-1).nonzero().cpu().tolist()
    assert written == [[0, 3], [2, 1], [4, 1]]  # (page, offset) of tokens 5, 1, 0


def test_padded_batch_in_decode(device):
    # The wrapper gets a batch whose tail is padding (qo_len 0, kv_len 0).
    d = decode_case([40, 9, 0, 0, 0], [1, 3, 0, 0, 0], 16, 2, device, seed=2)
    out, lse = run_decode(d)
    assert_decode_close(d, out, lse, True)


def test_padded_batch_in_plan_schedule(device):
    plan = mlacore.MlaPlan(device, max_batch=8, num_sms=4)
    plan.build(i32([0, 1, 2, 2, 2], device), i32([0, 1, 3, 3, 3], device), i32([5, 20, 0, 0], device), 16, 4)
    info = plan.info
    assert info.batch == 4 and info.total_qo == 2 and info.max_kv_len == 20
    assert plan.kv_last_page_len.cpu().tolist() == [5, 4, 0, 0, 0, 0, 0, 0]
    items = plan.work_items.cpu()
    # One item per request (empty ones included), padding marked -1.
    assert sorted(items[: info.num_work, 0].tolist()) == [0, 1, 2, 3]
    assert (items[info.num_work:, 0] == -1).all()


# --- beyond 2^31 --------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_slots_beyond_int32_are_exact(device, index_dtype):
    # Page ids near 2^31 / page_size and near INT32_MAX: slots exceed 2^31 and
    # must be exact int64 values (no 32-bit wrap) with or without num_pages.
    page_size = 64
    pages = [2**31 // page_size - 1, 2**31 // page_size, 2**31 // page_size + 1, 2**31 - 1, 2**30 + 12345]
    indices = torch.tensor(pages, dtype=index_dtype, device=device)
    indptr = torch.tensor([0, len(pages)], dtype=index_dtype, device=device)
    pos = torch.tensor([k * page_size + (k * 13) % page_size for k in range(len(pages))], dtype=index_dtype,
                       device=device)
    bi = torch.zeros_like(pos)
    want = [pages[k] * page_size + (k * 13) % page_size for k in range(len(pages))]
    assert max(want) > 2**31 + 2**30
    assert mlacore.slot_mapping(bi, pos, indices, indptr, page_size).cpu().tolist() == want
    assert mlacore.slot_mapping(bi, pos, indices, indptr, page_size, num_pages=2**31).cpu().tolist() == want
    # A pool one page short of the largest id: that page alone is out of range.
    got = mlacore.slot_mapping(bi, pos, indices, indptr, page_size, num_pages=2**31 - 1).cpu().tolist()
    assert got == want[:3] + [-1] + want[4:]


def test_slots_near_int64_limit(device):
    # The largest page whose slots all fit int64 is accepted, the next is not.
    page_size = 2**20
    top = (2**63 - 1) // page_size
    indices = i64([top - 1, top], device)
    out = mlacore.slot_mapping(i64([0, 0], device), i64([page_size - 1, page_size + 5], device), indices,
                               i64([0, 2], device), page_size)
    assert out.cpu().tolist() == [(top - 1) * page_size + page_size - 1, -1]
    with pytest.raises(ValueError, match="num_pages"):
        mlacore.slot_mapping(i64([0], device), i64([0], device), indices, i64([0, 2], device), page_size,
                             num_pages=top + 1)


def test_block_table_page_ids_beyond_int32_copy_exactly(device):
    table = torch.tensor([[2**40 + 1, 2**33, 5], [7, 2**62, -3]], dtype=torch.int64, device=device)
    out = torch.full((6,), -9, dtype=torch.int64, device=device)
    mlacore.page_indices_from_block_table(table.t().contiguous().t(), i32([0, 3, 6], device), out)
    assert out.cpu().tolist() == [2**40 + 1, 2**33, 5, 7, 2**62, -3]


@requires_cuda
@pytest.mark.parametrize("limit", [2**31, 2**32])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gpu_pool_larger_than_2_pow_31_elements(index_dtype, limit):
    # A [P, 16, 576] bf16 pool of more than 2^31 (> 4 GiB) and 2^32 elements
    # (> 8 GiB, past an unsigned 32-bit offset): appends and decode on its
    # last pages must use 64-bit offsets.
    S = 16
    P = limit // (S * 576) + 3
    if torch.cuda.mem_get_info()[0] < P * S * 576 * 2 + (1 << 30):
        pytest.skip(f"needs {P * S * 576 * 2 / 2**30:.1f} GiB of free GPU memory")
    buf = torch.zeros(P, S, 576, dtype=torch.bfloat16, device="cuda")
    assert buf.numel() > limit
    ckv, kpe = torch.split(buf, [512, 64], -1)
    pages = [P - 1, P - 2, 5]
    indices = torch.tensor(pages, dtype=index_dtype, device="cuda")
    indptr = torch.tensor([0, 3], dtype=index_dtype, device="cuda")
    n = 40
    src = torch.randn(n, 576, device="cuda").to(torch.bfloat16)
    bi = torch.zeros(n, dtype=index_dtype, device="cuda")
    pos = torch.arange(n, dtype=index_dtype, device="cuda")
    mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, indices, indptr,
                                      torch.tensor([n - 32], dtype=index_dtype, device="cuda"))
    for t in range(n):
        assert torch.equal(buf[pages[t // S], t % S], src[t]), f"token {t}"
    # Slots of the last pages exceed 2^31 elements / 16 tokens: check them too.
    slots = mlacore.slot_mapping(bi, pos, indices, indptr, S).cpu()
    assert slots[0].item() == (P - 1) * S and slots[16].item() == (P - 2) * S
    # Decode over exactly those tokens.
    q = torch.randn(1, 2, 576, device="cuda").to(torch.bfloat16)
    d = dict(q_nope=q[..., :512], q_pe=q[..., 512:], ckv=ckv, kpe=kpe, qo_indptr=i32([0, 1], "cuda"),
             kv_indptr=indptr, kv_indices=indices, kv_len=torch.tensor([n], dtype=index_dtype, device="cuda"),
             page_size=S, heads=2, dtype=torch.bfloat16)
    out, lse = run_decode(d, causal=False)
    k = src.double().cpu()
    s = (q[0].double().cpu() @ k.T) * SCALE
    ref = torch.softmax(s, -1) @ k[:, :512]
    assert (out[0].double().cpu() - ref).abs().max().item() < 2e-2
    assert (lse[0].double().cpu() - torch.logsumexp(s, -1) * LOG2E).abs().max().item() < 2e-3


# --- int64 indices give the int32 results ------------------------------------------

def test_int64_indices_equal_int32_everywhere(device):
    g = torch.Generator().manual_seed(5)
    indptr = i32([0, 3, 3, 7], device)
    indices = torch.randint(-2, 12, (7,), generator=g, dtype=torch.int32).to(device)
    bi = torch.randint(-1, 4, (30,), generator=g, dtype=torch.int32).to(device)
    pos = torch.randint(-3, 70, (30,), generator=g, dtype=torch.int32).to(device)
    want = mlacore.slot_mapping(bi, pos, indices, indptr, 16, num_pages=10)
    for a, b in [(bi.long(), pos.long()), (bi, pos)]:
        for c, e in [(indices.long(), indptr.long()), (indices, indptr)]:
            assert torch.equal(mlacore.slot_mapping(a, b, c, e, 16, num_pages=10), want)

    table = torch.randint(0, 100, (3, 5), generator=g, dtype=torch.int32).to(device)
    o32, o64 = torch.full((12,), -1, dtype=torch.int32, device=device), torch.full((12,), -1, device=device)
    mlacore.page_indices_from_block_table(table, i32([0, 4, 4, 9], device), o32)
    mlacore.page_indices_from_block_table(table.long(), i64([0, 4, 4, 9], device), o64)
    assert torch.equal(o32.long(), o64)

    ap, sl = i32([0, 2, 2, 6], device), i32([5, 0, 4], device)
    r32 = mlacore.get_batch_indices_positions(ap, sl, 7)
    r64 = mlacore.get_batch_indices_positions(ap.long(), sl.long(), 7)
    assert all(torch.equal(x, y) for x, y in zip(r32, r64))

    d = decode_case([33, 0, 90], [2, 1, 1], 16, 2, device, seed=6)
    out32, lse32 = run_decode(d)
    out64, lse64 = run_decode(d, **{k: d[k].long() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len")})
    assert torch.equal(out32, out64) and torch.equal(lse32, lse64)

    p32, p64 = mlacore.MlaPlan(device, 4, num_sms=3), mlacore.MlaPlan(device, 4, num_sms=3)
    p32.build(d["qo_indptr"], d["kv_indptr"], d["kv_len"], 16, 2)
    p64.build(d["qo_indptr"].long(), d["kv_indptr"].long(), d["kv_len"].long(), 16, 2)
    assert torch.equal(p32.schedule, p64.schedule)


def test_int64_append_equals_int32(device):
    cache32, cache64 = (torch.zeros(4, 2, 8, 3, 16, device=device) for _ in range(2))
    key = torch.randn(9, 3, 16, device=device)
    bi, pos = i32([0, 0, 1, 2, 1, 0, 5, 1, 0], device), i32([0, 9, 3, 1, 30, -1, 0, 8, 15], device)
    indices, indptr, last = i32([3, 1, 0, 2], device), i32([0, 2, 4, 4], device), i32([8, 1, 0], device)
    mlacore.append_paged_kv_cache(key, -key, bi, pos, cache32, indices, indptr, last)
    mlacore.append_paged_kv_cache(key, -key, bi.long(), pos.long(), cache64, indices.long(), indptr.long(),
                                  last.long())
    assert torch.equal(cache32, cache64) and cache32.abs().sum() > 0


# --- non-contiguous index tensors ---------------------------------------------------

def test_non_contiguous_index_tensors(device):
    indptr, indices = i32([0, 2, 3, 6], device), i32([4, 1, 0, 5, 2, 3], device)
    bi, pos = i32([0, 2, 1, 2, 0, 3], device), i32([3, 17, 1, 0, 2, 0], device)
    want = mlacore.slot_mapping(bi, pos, indices, indptr, 8)
    got = mlacore.slot_mapping(spread(bi), spread(pos, 2), spread(indices, 4), spread(indptr), 8)
    assert torch.equal(got, want)
    # Transposed and column-major tables, strided cu and out.
    table = torch.arange(24, dtype=torch.int64, device=device).view(4, 6)
    flat_a, flat_b = torch.full((16,), -1, device=device, dtype=torch.int64), torch.full((16,), -1, device=device,
                                                                                         dtype=torch.int64)
    cu = i64([0, 2, 2, 8, 11], device)
    mlacore.page_indices_from_block_table(table.t().contiguous().t(), cu, flat_a)
    mlacore.page_indices_from_block_table(table, spread(cu, 5), flat_b)
    assert torch.equal(flat_a, flat_b) and (flat_a[:11] >= 0).all() and (flat_a[11:] == -1).all()
    out_view = torch.full((32,), -5, device=device, dtype=torch.int64)
    mlacore.page_indices_from_block_table(table, cu, out_view[::2])
    assert torch.equal(out_view[::2][:11], flat_a[:11]) and (out_view[::2][11:] == -5).all()
    assert (out_view[1::2] == -5).all()

    ap, sl = i64([0, 3, 3, 5], device), i64([7, 2, 2], device)
    r = mlacore.get_batch_indices_positions(spread(ap), spread(sl, 2), 6)
    assert [x.cpu().tolist() for x in r] == [[0, 0, 0, 2, 2, -1], [4, 5, 6, 0, 1, -1]]

    d = decode_case([50, 3], [1, 2], 16, 2, device, seed=8)
    out, lse = run_decode(d)
    out2, lse2 = run_decode(d, **{k: spread(d[k]) for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len")})
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_non_contiguous_index_tensors_in_append(device):
    buf_a, buf_b = torch.zeros(5, 4, 576, device=device), torch.zeros(5, 4, 576, device=device)
    src = torch.randn(6, 576, device=device)
    bi, pos = i64([0, 1, 1, 0, 2, 1], device), i64([0, 0, 5, 7, 1, 2], device)
    indices, indptr, last = i32([3, 0, 4, 1], device), i32([0, 2, 4, 4], device), i32([4, 2, 0], device)
    for buf, args in ((buf_a, (bi, pos, indices, indptr, last)),
                      (buf_b, (spread(bi), spread(pos, 2), spread(indices), spread(indptr, 4), spread(last)))):
        ckv, kpe = torch.split(buf, [512, 64], -1)
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], args[0], args[1], ckv, kpe, *args[2:])
    assert torch.equal(buf_a, buf_b) and buf_a.abs().sum() > 0


# --- tensors on different devices (GPU) -------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("name", ["batch_indices", "positions", "kv_indices", "kv_indptr"])
def test_gpu_slot_mapping_one_index_tensor_on_cpu(name):
    args = dict(batch_indices=i32([0], "cuda"), positions=i32([1], "cuda"), kv_indices=i32([2], "cuda"),
                kv_indptr=i32([0, 1], "cuda"))
    args[name] = args[name].cpu()
    with pytest.raises(ValueError, match=name):
        mlacore.slot_mapping(args["batch_indices"], args["positions"], args["kv_indices"], args["kv_indptr"], 4)


@requires_cuda
@pytest.mark.parametrize("name", ["batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"])
def test_gpu_append_one_index_tensor_on_cpu(name):
    buf = torch.zeros(2, 4, 576, device="cuda")
    ckv, kpe = torch.split(buf, [512, 64], -1)
    src = torch.randn(1, 576, device="cuda")
    args = dict(batch_indices=i32([0], "cuda"), positions=i32([1], "cuda"), kv_indices=i32([1], "cuda"),
                kv_indptr=i32([0, 1], "cuda"), kv_last_page_len=i32([2], "cuda"))
    args[name] = args[name].cpu()
    with pytest.raises(ValueError, match=name):
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], args["batch_indices"], args["positions"], ckv,
                                          kpe, args["kv_indices"], args["kv_indptr"], args["kv_last_page_len"])
    assert buf.abs().sum() == 0


@requires_cuda
@pytest.mark.parametrize("name", ["block_table", "cu_num_blocks", "out"])
def test_gpu_block_table_one_tensor_on_cpu(name):
    args = dict(block_table=i32([[1, 2]], "cuda"), cu_num_blocks=i32([0, 2], "cuda"), out=i32([0, 0], "cuda"))
    args[name] = args[name].cpu()
    with pytest.raises(ValueError, match="cu_num_blocks|out|block_table"):
        mlacore.page_indices_from_block_table(args["block_table"], args["cu_num_blocks"], args["out"])


@requires_cuda
@pytest.mark.parametrize("name", ["kv_indptr", "kv_len_arr"])
def test_gpu_plan_inputs_on_two_devices(name):
    args = dict(qo_indptr=i32([0, 1], "cuda"), kv_indptr=i32([0, 1], "cuda"), kv_len_arr=i32([5], "cuda"))
    args[name] = args[name].cpu()
    plan = mlacore.MlaPlan("cuda", 2)
    with pytest.raises(ValueError, match=name):
        plan.build(args["qo_indptr"], args["kv_indptr"], args["kv_len_arr"], 16, 2)


@requires_cuda
@pytest.mark.parametrize("name", ["q_pe", "ckv_cache", "kpe_cache"])
def test_gpu_decode_one_tensor_on_cpu(name):
    d = decode_case([20], [1], 16, 2, "cuda", seed=9)
    key = {"q_pe": "q_pe", "ckv_cache": "ckv", "kpe_cache": "kpe"}[name]
    d[key] = d[key].cpu()
    with pytest.raises(ValueError, match=name):
        run_decode(d)


# --- streams (GPU) ---------------------------------------------------------------------

@requires_cuda
def test_gpu_side_stream_with_event_waits():
    # Inputs produced on the default stream, ops on a side stream that waits on
    # an event; results consumed back on the default stream after a wait.
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    indptr, indices = i32([0, 2, 3], "cuda"), torch.empty(3, dtype=torch.int32, device="cuda")
    torch.cuda._sleep(20_000_000)  # the fill below lands late on the main stream
    indices.copy_(i32([6, 2, 9], "cuda"))
    ready = torch.cuda.Event()
    ready.record(main)
    buf = torch.zeros(10, 16, 576, dtype=torch.bfloat16, device="cuda")
    ckv, kpe = torch.split(buf, [512, 64], -1)
    src = torch.randn(5, 576, device="cuda").to(torch.bfloat16)
    bi, pos = i32([0, 0, 1, 1, 0], "cuda"), i32([0, 17, 3, 16, 31], "cuda")
    with torch.cuda.stream(side):
        side.wait_event(ready)
        slots = mlacore.slot_mapping(bi, pos, indices, indptr, 16)
        mlacore.append_paged_mla_kv_cache(src[:, :512], src[:, 512:], bi, pos, ckv, kpe, indices, indptr,
                                          i32([16, 4], "cuda"))
        done = torch.cuda.Event()
        done.record(side)
    main.wait_event(done)
    slots.record_stream(main)
    assert slots.cpu().tolist() == [96, 2 * 16 + 1, 9 * 16 + 3, -1, 2 * 16 + 15]
    assert torch.equal(buf[6, 0], src[0]) and torch.equal(buf[2, 1], src[1]) and torch.equal(buf[9, 3], src[2])
    assert torch.equal(buf[2, 15], src[4])


# --- concurrency ------------------------------------------------------------------------

def test_concurrent_plans_and_wrappers_from_threads(device):
    # Each thread owns its MlaPlan and wrapper; results equal a single thread's.
    cases = [decode_case([17 * (i + 1), 5 + i], [1 + i % 2, 1], 16, 2, device, seed=100 + i) for i in range(6)]
    single = [run_decode(d) for d in cases]
    plans_single = []
    for d in cases:
        p = mlacore.MlaPlan(device, 4, num_sms=2 + len(plans_single))
        p.build(d["qo_indptr"], d["kv_indptr"], d["kv_len"], 16, 2)
        plans_single.append(p.schedule.clone())
    results, errors = [None] * (3 * len(cases)), []
    barrier = threading.Barrier(3 * len(cases))

    def work(i):
        try:
            d = cases[i % len(cases)]
            barrier.wait()
            for _ in range(repeats(3)):
                p = mlacore.MlaPlan(device, 4, num_sms=2 + i % len(cases))
                p.build(d["qo_indptr"], d["kv_indptr"], d["kv_len"], 16, 2)
                out, lse = run_decode(d)
            results[i] = (p.schedule.clone(), out, lse)
        except Exception as e:  # reported below: a thread's exception would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (md, out, lse) in enumerate(results):
        k = i % len(cases)
        assert torch.equal(md, plans_single[k]), f"thread {i}: schedule differs"
        assert torch.equal(out, single[k][0]) and torch.equal(lse, single[k][1]), f"thread {i}: decode differs"


def test_concurrent_schedule_ops_from_threads(device):
    g = torch.Generator().manual_seed(11)
    jobs = []
    for i in range(8):
        indptr = torch.tensor([0, 3, 5, 9], dtype=torch.int32).to(device)
        indices = torch.randint(0, 50, (9,), generator=g, dtype=torch.int32).to(device)
        bi = torch.randint(0, 4, (200,), generator=g, dtype=torch.int32).to(device)
        pos = torch.randint(0, 80, (200,), generator=g, dtype=torch.int32).to(device)
        jobs.append((bi, pos, indices, indptr, mlacore.slot_mapping(bi, pos, indices, indptr, 16)))
    bad = []

    def work(k):
        bi, pos, indices, indptr, want = jobs[k % len(jobs)]
        for _ in range(repeats(50, 3)):
            if not torch.equal(mlacore.slot_mapping(bi, pos, indices, indptr, 16), want):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_backend_probe_raced_by_16_threads_in_a_fresh_process():
    # The probe runs once per process: a fresh interpreter makes the 16
    # threads race the first probe itself, not a cached answer.
    script = r"""
import json, threading, mlacore
barrier = threading.Barrier(16)
answers = [None] * 16
def work(i):
    barrier.wait()
    answers[i] = json.dumps(mlacore.backends(), sort_keys=True)
threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(len(set(answers)), answers[0])
"""
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd="/")
    assert res.returncode == 0, res.stderr
    distinct, answer = res.stdout.strip().split(" ", 1)
    assert distinct == "1", res.stdout
    assert answer == __import__("json").dumps(mlacore.backends(), sort_keys=True)
