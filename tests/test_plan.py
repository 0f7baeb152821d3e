"""MlaPlan: the decode schedule against a pure-Python model of the algorithm,
its invariants, errors, and on a GPU the exchange kernel (one launch, no
memcpy, no sync), its rejections leaving the schedule alone, the device-only
build and CUDA-graph replay."""

import faulthandler
import os
import subprocess
import sys
import random
import time

import pytest
import torch

import mlacore
from mlacore import _mlacore
from mlacore._plan import PLAN_ERROR_INDPTR, PLAN_ERROR_INDPTR_START, PLAN_ERROR_KV_LEN

from conftest import requires_cuda

TILE = 64  # kDecodeTileTokens == kDecodeTileRows
FIXED = 5  # kPlanFixedCostTiles
NCAND = 5  # kPlanCandidates


def cdiv(a, b):
    return -(-a // b)


def lpt_class(tiles, chunk):
    """An item's length class for the longest-first order: octaves below the chunk, 15 the last."""
    return min(chunk.bit_length() - tiles.bit_length(), 15)


def reference(qo, kv, kv_len, page_size, num_heads, num_sms, max_batch, max_work, partial_rows=None, partial_qo_len=0,
              longest_first=True):
    """The schedule of schedule_algorithm.h, written again from its description (with the workspace's
    partial budget of MlaPlan.set_partial_budget unless partial_rows is None); with `longest_first`,
    the work items ordered by length class (longest first), each class in request order."""
    B = len(kv_len)
    shapes = []
    for b in range(B):
        qo_len, L = qo[b + 1] - qo[b], kv_len[b]
        pages = kv[b + 1] - kv[b]
        assert cdiv(L, page_size) == pages
        shapes.append(dict(qo_len=qo_len, kv_len=L, q_tiles=max(cdiv(qo_len * num_heads, TILE), 1),
                           kv_tiles=cdiv(L, TILE), last=0 if L == 0 else L - (pages - 1) * page_size))
    cost = sum(s["q_tiles"] * (s["kv_tiles"] + FIXED) for s in shapes)
    sum_kt = sum(s["kv_tiles"] for s in shapes)
    max_kt = max([s["kv_tiles"] for s in shapes], default=0)
    no_split = max(max_kt, 1)

    def splits(s, c):
        return 1 if s["kv_tiles"] == 0 else cdiv(s["kv_tiles"], c)

    # Bounds: capacity (items within max_work) and balance (the batch's cost over the SMs).
    spare = max_work - B
    # The budget: `fit` partials of max(partial_qo_len, max_qo_len) * heads rows; the partials of a
    # chunk c stay below 2 * sum_kt / c, so c >= 2 * sum_kt / fit keeps them within it.
    floor = 0
    if partial_rows is not None:
        fit = partial_rows // (max(partial_qo_len, max([s["qo_len"] for s in shapes], default=0), 1) * num_heads)
        floor = 0 if fit >= max_work else (-1 if fit < 2 else cdiv(2 * sum_kt, fit))
    if spare <= 0 or floor < 0:
        balance = cap = no_split
    else:
        cap = min(max(cdiv(sum_kt, spare), 1, floor), no_split)
        balance = min(max(cdiv(cost, num_sms), cap), no_split)
    chunk = no_split
    if balance < no_split:
        # Equal parts of the longest request, for these part counts; never below the capacity bound.
        most = cdiv(no_split, balance)
        counts = [most, most - 1, most * 3 // 4, most // 2, 1]
        assert len(counts) == NCAND
        cands = [max(cdiv(no_split, max(n, 1)), cap) for n in counts]
        best, best_time = no_split, None
        for c in reversed(cands):
            t = cdiv(sum(s["q_tiles"] * splits(s, c) for s in shapes), num_sms) * (c + FIXED)
            if best_time is None or t < best_time or (t == best_time and c > best):
                best, best_time = c, t
        chunk = best
    ct = chunk * TILE

    items, split_indptr, parts = [], [], 0
    for b, s in enumerate(shapes):
        n = splits(s, chunk)
        split_indptr.append(parts)
        for i in range(n):
            items.append([b, i * ct, min((i + 1) * ct, s["kv_len"]), parts + i if n > 1 else -1])
        parts += n if n > 1 else 0
    if longest_first:
        items.sort(key=lambda it: lpt_class(cdiv(it[2] - it[1], TILE), chunk))  # stable: request order within
    header = [len(items), parts, B, max([s["qo_len"] for s in shapes], default=0),
              max(kv_len, default=0), ct, qo[B], 0]
    lpl = [s["last"] for s in shapes] + [0] * (max_batch - B)
    split_indptr += [parts] * (max_batch + 1 - B)
    work_off = cdiv(8 + 2 * max_batch + 1, 4) * 4
    meta = header + lpl + split_indptr + [0] * (work_off - (8 + 2 * max_batch + 1))
    for i in range(max_work):
        meta += items[i] if i < len(items) else [-1, 0, 0, -1]
    return meta


def random_batch(rng, B, page_size, max_qo=1, max_kv=5000, empty_rate=0.1):
    kv_len = [0 if rng.random() < empty_rate else rng.randint(1, max_kv) for _ in range(B)]
    qo_len = [rng.randint(1, max_qo) for _ in range(B)]
    qo, kv = [0], [0]
    for q, L in zip(qo_len, kv_len):
        qo.append(qo[-1] + q)
        kv.append(kv[-1] + cdiv(L, page_size))
    return qo, kv, kv_len


def tensors(qo, kv, kv_len, device="cpu", dtype=torch.int32):
    return tuple(torch.tensor(x, dtype=dtype, device=device) for x in (qo, kv, kv_len))


def check_invariants(plan, kv_len, page_size):
    meta = plan.schedule.cpu()
    info = plan.info
    B = len(kv_len)
    items = plan.work_items.cpu().tolist()
    split = plan.split_indptr.cpu().tolist()
    lpl = plan.kv_last_page_len.cpu().tolist()
    assert info.batch == B == meta[2]
    assert info.chunk_tokens % TILE == 0 and info.chunk_tokens > 0
    assert info.num_work <= plan.max_work
    covered = [0] * B
    count = [0] * B
    for i, (r, begin, end, partial) in enumerate(items):
        if i >= info.num_work:
            assert (r, begin, end, partial) == (-1, 0, 0, -1)
            continue
        assert 0 <= r < B
        assert begin == covered[r], "each request's tokens are covered once, in order"
        assert begin % info.chunk_tokens == 0 and begin <= end <= begin + info.chunk_tokens
        covered[r] = end
        first, last = split[r], split[r + 1]
        assert partial == (-1 if last == first else first + count[r])
        count[r] += 1
    for b in range(B):
        assert covered[b] == kv_len[b]
        assert count[b] >= 1, "empty requests still get an item (zeros, -inf LSE)"
        assert split[b + 1] - split[b] == (count[b] if count[b] > 1 else 0)
        pages = cdiv(kv_len[b], page_size)
        assert lpl[b] == (0 if kv_len[b] == 0 else kv_len[b] - (pages - 1) * page_size)
        assert kv_len[b] == 0 or 1 <= lpl[b] <= page_size
    assert split[B:] == [info.num_partials] * (plan.max_batch + 1 - B)
    assert lpl[B:] == [0] * (plan.max_batch - B)


CASES = [
    # B, page_size, heads, max_qo, num_sms, max_kv
    (1, 64, 16, 1, 132, 65536),
    (1, 1, 128, 1, 132, 300),
    (3, 16, 16, 4, 8, 5000),
    (7, 64, 16, 1, 132, 70000),
    (32, 1, 16, 2, 132, 4096),
    (64, 16, 128, 1, 132, 20000),
    (100, 64, 16, 3, 304, 8192),
    (256, 64, 16, 1, 132, 4096),
]


@pytest.mark.parametrize("B,page_size,heads,max_qo,num_sms,max_kv", CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cpu_plan_matches_reference_and_invariants(B, page_size, heads, max_qo, num_sms, max_kv, dtype):
    rng = random.Random(B * 1000 + page_size)
    qo, kv, kv_len = random_batch(rng, B, page_size, max_qo, max_kv)
    plan = mlacore.MlaPlan("cpu", max_batch=B + 5, num_sms=num_sms)
    plan.build(*tensors(qo, kv, kv_len, dtype=dtype), page_size, heads)
    want = reference(qo, kv, kv_len, page_size, heads, num_sms, plan.max_batch, plan.max_work)
    assert plan.schedule.tolist() == want
    check_invariants(plan, kv_len, page_size)
    info = plan.info
    assert info.max_qo_len == max(q1 - q0 for q0, q1 in zip(qo, qo[1:]))
    assert info.max_kv_len == max(kv_len) and info.total_qo == qo[-1] and info.error == 0


BUDGET_CASES = [
    # B, page_size, heads, max_qo, num_sms, max_kv, partial_rows, partial_qo_len
    (1, 64, 128, 1, 132, 65536, 128 * 40, 0),     # one long request: 40 partials' room
    (1, 64, 128, 4, 132, 65536, 512 * 5, 0),      # 5 partials of 4 x 128 rows
    (1, 64, 128, 4, 132, 65536, 512 * 5, 8),      # a graph capacity of 8 query tokens: 2 fit
    (3, 16, 16, 4, 8, 5000, 16 * 4 * 3, 0),       # 3 fit
    (7, 64, 16, 1, 132, 70000, 16 * 1, 0),        # 1 fits: nothing splits
    (7, 64, 16, 1, 132, 70000, 0, 0),             # no row: nothing splits
    (7, 64, 16, 1, 132, 70000, 16 * 139, 0),      # max_work fit: never binds
    (32, 1, 16, 2, 132, 4096, 32 * 50, 3),
    (157, 16, 16, 17, 132, 1024, 65408, 0),       # 128 MiB of rows, FlashInfer's largest test shape
    (512, 1, 128, 4, 132, 8192, 65408, 0),
]


@pytest.mark.parametrize("B,page_size,heads,max_qo,num_sms,max_kv,rows,qo_floor", BUDGET_CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cpu_partial_budget_caps_the_partials_and_matches_the_reference(B, page_size, heads, max_qo, num_sms, max_kv,
                                                                        rows, qo_floor, dtype):
    rng = random.Random(B * 77 + rows)
    qo, kv, kv_len = random_batch(rng, B, page_size, max_qo, max_kv, empty_rate=0.0 if B == 1 else 0.1)
    plan = mlacore.MlaPlan("cpu", max_batch=B + 2, num_sms=num_sms)
    plan.set_partial_budget(rows, qo_floor)
    plan.build(*tensors(qo, kv, kv_len, dtype=dtype), page_size, heads)
    want = reference(qo, kv, kv_len, page_size, heads, num_sms, plan.max_batch, plan.max_work, rows, qo_floor)
    assert plan.schedule.tolist() == want
    check_invariants(plan, kv_len, page_size)
    qo_rows = max(qo_floor, max(q1 - q0 for q0, q1 in zip(qo, qo[1:])), 1) * heads
    assert plan.info.num_partials <= rows // qo_rows
    # The budget is the only change: without it the same batch may split more.
    plan.set_partial_budget(None)
    plan.build(*tensors(qo, kv, kv_len, dtype=dtype), page_size, heads)
    assert plan.schedule.tolist() == reference(qo, kv, kv_len, page_size, heads, num_sms, plan.max_batch,
                                               plan.max_work)


def test_partial_budget_binds_and_its_errors():
    # One 64k-token request at 128 heads splits into many parts; a 3-partial budget keeps it to 3 or fewer.
    qo, kv, kv_len = [0, 1], [0, 1024], [65536]
    plan = mlacore.MlaPlan("cpu", max_batch=1, num_sms=132)
    plan.build(*tensors(qo, kv, kv_len), 64, 128)
    assert plan.info.num_partials > 3
    plan.set_partial_budget(3 * 128)
    plan.build(*tensors(qo, kv, kv_len), 64, 128)
    assert 2 <= plan.info.num_partials <= 3
    plan.set_partial_budget(128)  # one partial fits: no split
    plan.build(*tensors(qo, kv, kv_len), 64, 128)
    assert plan.info.num_partials == 0 and plan.info.num_work == 1
    plan.set_partial_budget(0)  # a workspace without a row: no split either
    plan.build(*tensors(qo, kv, kv_len), 64, 128)
    assert plan.info.num_partials == 0 and plan.info.num_work == 1
    plan.set_partial_budget(None)  # the budget removed: the uncapped split again
    plan.build(*tensors(qo, kv, kv_len), 64, 128)
    assert plan.info.num_partials > 3
    assert _mlacore.PLAN_NO_PARTIAL_BUDGET == -1
    for bad in (-1, -2):
        with pytest.raises(ValueError, match="partial_rows"):
            plan.set_partial_budget(bad)
    with pytest.raises(ValueError, match="partial_rows"):
        plan._plan.set_partial_budget(-2, 0)  # the C ABI's check
    with pytest.raises(ValueError, match="partial_qo_len"):
        plan.set_partial_budget(10, -2)
    # The sizing policy of the C ABI: 512 fp32 + LSE per row.
    assert _mlacore.mla_decode_workspace_rows(128 << 20) == (128 << 20) // 2052
    assert _mlacore.mla_decode_workspace_partials(128 << 20, 4, 128) == (128 << 20) // 2052 // 512
    assert _mlacore.mla_decode_workspace_rows(-1) == -1


@pytest.mark.parametrize("max_work_extra", [0, 1, 3, 10])
def test_small_max_work_is_respected(max_work_extra):
    rng = random.Random(max_work_extra)
    B = 20
    qo, kv, kv_len = random_batch(rng, B, 16, max_kv=100000, empty_rate=0.0)
    plan = mlacore.MlaPlan("cpu", max_batch=B, max_work=B + max_work_extra, num_sms=132)
    plan.build(*tensors(qo, kv, kv_len), 16, 16)
    assert plan.schedule.tolist() == reference(qo, kv, kv_len, 16, 16, 132, B, B + max_work_extra)
    check_invariants(plan, kv_len, 16)
    assert plan.info.num_work <= B + max_work_extra
    if max_work_extra == 0:
        assert plan.info.num_partials == 0


def test_default_max_work_holds_adversarial_batches():
    num_sms = 132
    for B, lens in [(1, [2**31 - 64]), (300, [64 * 10] * 300), (300, [1] * 299 + [10**7]),
                    (132, [64 * 133] * 132), (1000, [64 * (i % 7 + 1) for i in range(1000)])]:
        plan = mlacore.MlaPlan("cpu", max_batch=B, num_sms=num_sms)
        kv = [0]
        for L in lens:
            kv.append(kv[-1] + cdiv(L, 64))
        plan.build(*tensors(list(range(B + 1)), kv, lens), 64, 16)
        assert plan.info.num_work <= plan.max_work == B + num_sms
        check_invariants(plan, lens, 64)


def test_splits_fill_the_sms_and_large_batches_do_not_split():
    plan = mlacore.MlaPlan("cpu", max_batch=512, num_sms=132)
    # One long request: split across (most of) the SMs.
    plan.build(*tensors([0, 1], [0, 1024], [65536]), 64, 16)
    assert 100 <= plan.info.num_work <= 132 and plan.info.num_partials == plan.info.num_work
    # 512 requests of equal length already fill 132 SMs: no split, no partials.
    B = 512
    plan.build(*tensors(list(range(B + 1)), [i * 16 for i in range(B + 1)], [1024] * B), 64, 16)
    assert plan.info.num_work == B and plan.info.num_partials == 0
    assert plan.info.chunk_tokens == 1024
    # Query tiles count: 128 heads x 4 tokens = 8 tiles per item, so fewer splits than with 16 heads.
    plan.build(*tensors([0, 4], [0, 1024], [65536]), 64, 128)
    assert plan.info.num_work <= 132 // 8 + 2


@pytest.mark.parametrize("batch, kv_len, heads, parts", [(8, 32768, 128, 8), (32, 8192, 128, 2), (32, 32768, 128, 2),
                                                          (8, 32768, 16, 16), (32, 8192, 16, 4), (32, 32768, 16, 4)])
def test_decode_bench_shapes_split_into_equal_parts_in_one_wave(batch, kv_len, heads, parts):
    # The shapes of bench/attn.py on 132 SMs (H100/H200): every request in `parts` equal chunks, and
    # all CTAs (items x query tiles) in one wave. Chunks grown from the balance bound gave (8, 32768)
    # at 128 heads 7 parts of 74 tiles: 112 CTAs, 20 idle SMs (ncu: SMs active 82% of the kernel).
    page = 64
    per = kv_len // page
    plan = mlacore.MlaPlan("cpu", max_batch=batch, num_sms=132)
    plan.build(*tensors(list(range(batch + 1)), [i * per for i in range(batch + 1)], [kv_len] * batch), page, heads)
    assert plan.info.chunk_tokens == kv_len // parts
    assert plan.info.num_work == batch * parts
    assert plan.info.num_work * cdiv(heads, TILE) <= 132


def test_empty_requests_batch_zero_and_padding():
    plan = mlacore.MlaPlan("cpu", max_batch=8, num_sms=4)
    plan.build(*tensors([0, 1, 2, 3], [0, 0, 3, 3], [0, 40, 0]), 16, 16)
    items = plan.work_items.tolist()
    by_request = {it[0]: it for it in items[:plan.info.num_work]}  # items come longest first
    assert by_request[0] == [0, 0, 0, -1] and by_request[2] == [2, 0, 0, -1] and by_request[1][:3] == [1, 0, 40]
    assert plan.kv_last_page_len.tolist()[:3] == [0, 8, 0]
    assert all(it == [-1, 0, 0, -1] for it in items[plan.info.num_work:])
    # Batch 0: everything is padding.
    plan.build(*tensors([0], [0], []), 16, 16)
    assert plan.info == mlacore.PlanInfo(0, 0, 0, 0, 0, 64, 0, 0)
    assert all(it == [-1, 0, 0, -1] for it in plan.work_items.tolist())


def test_schedule_is_fully_rewritten():
    rng = random.Random(5)
    qo, kv, kv_len = random_batch(rng, 10, 16)
    plan = mlacore.MlaPlan("cpu", max_batch=16, num_sms=20)
    plan.build(*tensors(qo, kv, kv_len), 16, 16)
    first = plan.schedule.clone()
    plan.schedule.fill_(-12345)
    plan.build(*tensors(qo, kv, kv_len), 16, 16)
    assert torch.equal(plan.schedule, first)


def test_rejected_batch_leaves_the_schedule_unchanged():
    plan = mlacore.MlaPlan("cpu", max_batch=4, num_sms=4)
    plan.build(*_good(), 64, 16)
    first = plan.schedule.clone()
    with pytest.raises(ValueError, match="request 1"):
        plan.build(*tensors([0, 1, 2], [0, 1, 3], [10, 300]), 64, 16)
    assert torch.equal(plan.schedule, first)


def test_strided_inputs():
    qo, kv, kv_len = [0, 1, 3], [0, 2, 4], [100, 65]
    ref = mlacore.MlaPlan("cpu", max_batch=4, num_sms=8)
    ref.build(*tensors(qo, kv, kv_len), 64, 16)
    plan = mlacore.MlaPlan("cpu", max_batch=4, num_sms=8)
    wide = [torch.tensor(x, dtype=torch.int64).repeat_interleave(3)[::3] for x in (qo, kv, kv_len)]
    assert wide[0].stride(0) == 3
    plan.build(*wide, 64, 16)
    assert torch.equal(plan.schedule, ref.schedule)


@pytest.mark.parametrize("seed", range(6))
def test_mixed_widths_and_strides_match_the_reference(seed):
    # One dtype for all three contiguous vectors takes a specialised path in
    # the core; mixed widths and strides take the generic one. Both must give
    # the reference schedule.
    rng = random.Random(100 + seed)
    B = rng.choice([1, 5, 40, 130])
    page_size = rng.choice([1, 16, 64])
    qo, kv, kv_len = random_batch(rng, B, page_size, max_qo=3, max_kv=rng.choice([300, 20000, 200000]))
    want = reference(qo, kv, kv_len, page_size, 16, 132, B, mlacore.default_max_work(B, 132))
    for dtypes, stride in [((torch.int32, torch.int64, torch.int32), 1), ((torch.int64,) * 3, 2),
                           ((torch.int32,) * 3, 3), ((torch.int64, torch.int32, torch.int64), 1)]:
        args = [torch.tensor(x, dtype=d).repeat_interleave(stride)[::stride] for x, d in zip((qo, kv, kv_len), dtypes)]
        plan = mlacore.MlaPlan("cpu", max_batch=B, num_sms=132)
        plan.build(*args, page_size, 16)
        assert plan.schedule.tolist() == want, (dtypes, stride)


@pytest.mark.parametrize("kv,kv_len,pages", [
    ([0, 3], [128], 3), ([0, 1], [128], 1), ([0, 1], [0], 1), ([0, 0], [1], 0), ([0, 2], [129], 2),
])
def test_page_count_mismatch_is_named(kv, kv_len, pages):
    plan = mlacore.MlaPlan("cpu", max_batch=2, num_sms=4)
    need = cdiv(kv_len[0], 64)
    with pytest.raises(ValueError, match=f"needs ceil\\({kv_len[0]}/page_size 64\\)={need} pages, but kv_indptr "
                                         f"gives it {pages}"):
        plan.build(*tensors([0, 1], kv, kv_len), 64, 16)


def test_page_counts_at_the_boundaries_are_accepted():
    plan = mlacore.MlaPlan("cpu", max_batch=4, num_sms=4)
    plan.build(*tensors([0, 1, 2, 3, 4], [0, 1, 2, 4, 4], [64, 1, 65, 0]), 64, 16)
    assert plan.kv_last_page_len.tolist() == [64, 1, 1, 0]


def test_sizes_and_layout_helpers():
    assert mlacore.default_max_work(256, 132) == 388
    n = mlacore.plan_schedule_size(4, 10)
    assert n == cdiv(8 + 4 + 5, 4) * 4 + 40
    plan = mlacore.MlaPlan("cpu", max_batch=4, max_work=10, num_sms=3)
    assert plan.schedule.numel() == n and plan.schedule.dtype == torch.int32
    assert _mlacore.plan_layout(4, 10) == (0, 8, 12, 20)
    assert plan.work_items.shape == (10, 4) and plan.split_indptr.numel() == 5
    with pytest.raises(ValueError, match="max_work"):
        mlacore.MlaPlan("cpu", max_batch=8, max_work=4, num_sms=3)
    with pytest.raises(ValueError, match="num_sms"):
        mlacore.MlaPlan("cpu", max_batch=8, num_sms=0)


def _good():
    return tensors([0, 1, 2], [0, 1, 3], [10, 100])


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: (a[0].view(1, 3), a[1], a[2]), ValueError, "qo_indptr: expected 1-D"),
    (lambda a: (a[0].float(), a[1], a[2]), ValueError, "qo_indptr: expected 1-D int32 or int64"),
    (lambda a: (a[0], a[1][:2], a[2]), ValueError, "kv_indptr: expected 1-D int32 or int64 of length batch\\+1=3"),
    (lambda a: (a[0], a[1], a[2][:1]), ValueError, "kv_len_arr: expected 1-D int32 or int64 of length batch=2"),
    (lambda a: (a[0] + 1, a[1], a[2]), ValueError, "qo_indptr: expected first element 0, got 1"),
    (lambda a: (a[0], a[1] + 1, a[2]), ValueError, "kv_indptr: expected first element 0, got 1"),
    (lambda a: (torch.tensor([0, 2, 1], dtype=torch.int32), a[1], a[2]), ValueError,
     "qo_indptr: expected non-decreasing.*request 1"),
    (lambda a: (a[0], a[1], torch.tensor([10, 200], dtype=torch.int32)), ValueError,
     "kv_len_arr\\[1\\]=200: request 1 needs ceil\\(200/page_size 64\\)=4 pages, but kv_indptr gives it 2"),
    (lambda a: (a[0], a[1], torch.tensor([-1, 100], dtype=torch.int32)), ValueError,
     "kv_len_arr\\[0\\]: expected 0 <= kv_len"),
    (lambda a: (a[0], None, a[2]), TypeError, "kv_indptr: expected a tensor, got None"),
    (lambda a: (a[0], [0, 1, 3], a[2]), TypeError, "kv_indptr: expected a tensor"),
])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_input_errors_name_the_argument(mutate, exc, match, device):
    # On the GPU the exchange kernel flags the batch and the host's pass over
    # the staged copy names the fault: the same message as on the CPU.
    plan = mlacore.MlaPlan(device, max_batch=4, num_sms=4)
    good = tuple(t.to(device) for t in _good())
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in mutate(good))
    with pytest.raises(exc, match=match):
        plan.build(*args, 64, 16)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_empty_batch_with_a_bad_first_element_is_rejected(device):
    # No request carries the error: the start check alone must.
    plan = mlacore.MlaPlan(device, max_batch=4, num_sms=4)
    with pytest.raises(ValueError, match="qo_indptr: expected first element 0, got 3"):
        plan.build(*tensors([3], [0], [], device), 64, 16)
    with pytest.raises(ValueError, match="kv_indptr: expected first element 0, got 2"):
        plan.build(*tensors([0], [2], [], device), 64, 16)
    plan.build(*tensors([0], [0], [], device), 64, 16)
    assert plan.info.batch == 0 and plan.info.num_work == 0


def test_capacity_scalar_and_schedule_errors():
    plan = mlacore.MlaPlan("cpu", max_batch=1, num_sms=4)
    with pytest.raises(ValueError, match="batch 2 .* exceeds the plan's max_batch=1"):
        plan.build(*_good(), 64, 16)
    plan = mlacore.MlaPlan("cpu", max_batch=4, num_sms=4)
    with pytest.raises(ValueError, match="page_size: expected >= 1"):
        plan.build(*_good(), 0, 16)
    with pytest.raises(ValueError, match="num_heads: expected >= 1"):
        plan.build(*_good(), 64, 0)
    raw = plan._plan
    n = plan.schedule.numel()
    with pytest.raises(ValueError, match="schedule: expected int32"):
        raw.build(*_good(), 64, 16, torch.zeros(n, dtype=torch.int64))
    with pytest.raises(ValueError, match="schedule: expected at least"):
        raw.build(*_good(), 64, 16, torch.zeros(n - 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="schedule: expected a contiguous"):
        raw.build(*_good(), 64, 16, torch.zeros(2 * n, dtype=torch.int32)[::2])
    with pytest.raises(ValueError, match="schedule: expected 16-byte aligned"):
        raw.build(*_good(), 64, 16, torch.zeros(n + 1, dtype=torch.int32)[1:])
    with pytest.raises(ValueError, match="build_device needs GPU tensors"):
        plan.build_device(*_good(), 64, 16)


# ---------------------------------------------------------------- GPU


def _cuda_batch(seed, B, page_size=64, max_qo=1, dtype=torch.int32):
    qo, kv, kv_len = random_batch(random.Random(seed), B, page_size, max_qo)
    return (qo, kv, kv_len), tensors(qo, kv, kv_len, "cuda", dtype)


@pytest.fixture
def watchdog():
    """A build whose kernel never raises its flag hangs inside C++, where no
    Python signal handler runs: faulthandler's own thread dumps the stacks and
    ends the process instead, so a hang fails the run instead of stalling it."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _host_input_reference(plan, raw, page_size=64, num_heads=16):
    """The same schedule from host inputs (schedule + H2D upload) on a second GPU plan of the same shape."""
    ref = mlacore.MlaPlan("cuda", max_batch=plan.max_batch, max_work=plan.max_work, num_sms=plan.num_sms)
    ref.build(*tensors(*raw), page_size, num_heads)
    torch.cuda.synchronize()
    return ref.schedule.clone()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gpu_device_inputs_match_host_inputs_with_one_exchange(dtype, watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=300)
    host_plan = mlacore.MlaPlan("cpu", max_batch=300, num_sms=plan.num_sms)
    staging = None
    for step, B in enumerate([1, 17, 300, 5, 256, 0]):
        raw, dev = _cuda_batch(step, B, max_qo=3, dtype=dtype)
        before = plan.stats
        plan.build(*dev, 64, 16)
        after = plan.stats
        host_plan.build(*tensors(*raw), 64, 16)
        assert torch.equal(plan.schedule.cpu(), host_plan.schedule)
        assert plan.info == host_plan.info
        # One transfer, the kernel's verdict; the kernel writes the schedule itself; no sync.
        assert after["device_to_host_copies"] - before["device_to_host_copies"] == 1
        assert after["host_to_device_copies"] - before["host_to_device_copies"] == 0
        assert after["stream_syncs"] - before["stream_syncs"] == 0
        # One pinned buffer for the plan's life, whatever the batch size.
        assert after["pinned_allocations"] == 1
        staging = staging or after["staging"]
        assert after["staging"] == staging != 0


@requires_cuda
def test_gpu_build_is_one_kernel_launch_without_memcpy_or_sync(watchdog):
    # The exchange kernel stores its verdict into the plan's mapped pinned
    # buffer and writes the schedule itself: one launch, no memcpy in either
    # direction, no stream synchronization.
    plan = mlacore.MlaPlan("cuda", max_batch=64)
    _, dev = _cuda_batch(1, 64)
    plan.build(*dev, 64, 16)  # warm: staging allocated
    torch.cuda.synchronize()
    before = plan.stats
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        plan.build(*dev, 64, 16)
        torch.cuda.synchronize()
    after = plan.stats
    if not any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()):
        pytest.skip("the profiler records no GPU activity here (CUPTI is taken, e.g. by compute-sanitizer)")
    names = [e.name for e in prof.events()]
    memcpys = [n for n in names if "emcpy" in n or "HtoD" in n or "DtoH" in n or "Pinned" in n]
    syncs = [n for n in names if "StreamSynchronize" in n or "EventSynchronize" in n]
    kernels = [n for n in names if "plan_exchange" in n]
    launches = [n for n in names if "LaunchKernel" in n]
    assert memcpys == [], names
    assert syncs == [], names
    assert len(kernels) == 1, names
    assert len(launches) <= 1, names  # runtime-API rows, where the profiler records them
    assert after["stream_syncs"] == before["stream_syncs"] == 0
    assert after["device_to_host_copies"] - before["device_to_host_copies"] == 1
    assert after["pinned_allocations"] == 1 and after["staging"] == before["staging"]


@requires_cuda
def test_gpu_mixed_widths_and_strides_match_the_host(watchdog):
    # The exchange kernel keeps each vector's own width; strided views are gathered.
    raw, _ = _cuda_batch(7, 40, max_qo=3)
    qo = torch.tensor(raw[0], dtype=torch.int64, device="cuda").repeat_interleave(2)[::2]
    kv = torch.tensor(raw[1], dtype=torch.int32, device="cuda")
    kv_len = torch.tensor(raw[2], dtype=torch.int64, device="cuda").repeat_interleave(3)[::3]
    plan = mlacore.MlaPlan("cuda", max_batch=48)
    plan.build(qo, kv, kv_len, 64, 16)
    host = mlacore.MlaPlan("cpu", max_batch=48, num_sms=plan.num_sms)
    host.build(*tensors(*raw), 64, 16)
    assert torch.equal(plan.schedule.cpu(), host.schedule)


@requires_cuda
@pytest.mark.parametrize("B", [20, 80])
def test_gpu_exchange_matches_the_host_on_both_sides_of_the_narrow_bound(B, watchdog):
    # The exchange and device-build kernels pick the chunk in 32-bit arithmetic while the
    # batch's tile and cost totals stay below 2^31, and through the shared 64-bit helpers
    # beyond: requests near INT32_MAX tokens (2^25 tiles each) put 20 of them below the
    # bound, 80 above. Both sides must choose what the host does; with 1024 SMs to fill,
    # both batches split (on the H200's 132, 80 such requests fill two waves whichever
    # way they split: no split wins).
    page_size = 1 << 16
    kv_len = [2**31 - 1 - 4099 * b for b in range(B)]
    pages = [-(-n // page_size) for n in kv_len]
    kv = [0]
    for p in pages:
        kv.append(kv[-1] + p)
    raw = (list(range(B + 1)), kv, kv_len)
    tiles = sum(-(-n // TILE) for n in kv_len)
    assert (tiles + FIXED * B < 2**31) == (B == 20)
    plan = mlacore.MlaPlan("cuda", max_batch=B, num_sms=1024)
    plan.build(*tensors(*raw, "cuda"), page_size, 16)
    host = mlacore.MlaPlan("cpu", max_batch=B, num_sms=1024)
    host.build(*tensors(*raw), page_size, 16)
    assert torch.equal(plan.schedule.cpu(), host.schedule)
    assert plan.info == host.info
    assert host.info.num_partials > 0
    # build_device's kernel decides with the same code.
    plan.schedule.fill_(-777)
    plan.build_device(*tensors(*raw, "cuda"), page_size, 16)
    assert torch.equal(plan.schedule.cpu(), host.schedule)


@requires_cuda
def test_gpu_failed_build_leaves_the_schedule_and_the_plan_usable(watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=8, num_sms=8)
    good = tensors([0, 1, 2], [0, 2, 3], [100, 10], "cuda")
    plan.build(*good, 64, 16)
    first = plan.schedule.clone()
    with pytest.raises(ValueError, match="request 1"):
        plan.build(*tensors([0, 1, 2], [0, 2, 3], [100, 200], "cuda"), 64, 16)
    torch.cuda.synchronize()
    # The kernel rejected the batch itself: it never reaches the schedule tensor.
    assert torch.equal(plan.schedule, first)
    plan.build(*good, 64, 16)
    assert torch.equal(plan.schedule, first)


@requires_cuda
def test_gpu_every_rejection_leaves_the_schedule_and_the_plan_usable(watchdog):
    # Each of these is rejected by the exchange kernel and worded by the host
    # from the inputs the kernel staged; the schedule must keep its contents
    # and the next build on the same plan must work. A wrong verdict shows as
    # a missing ValueError, a hang (watchdog) or the schedule changing.
    plan = mlacore.MlaPlan("cuda", max_batch=8, num_sms=8)
    raw_good, good = _cuda_batch(11, 6)
    want = _host_input_reference(plan, raw_good)
    host = mlacore.MlaPlan("cpu", max_batch=8, num_sms=8)
    host.build(*tensors(*raw_good), 64, 16)
    bad = [
        ([0, 1, 2], [0, 2, 3], [100, 200]),   # page count of request 1
        ([1, 2, 3], [0, 1, 2], [10, 10]),     # qo_indptr[0] != 0 (the scalar checks)
        ([0, 1, 2], [1, 2, 3], [10, 10]),     # kv_indptr[0] != 0
        ([0, 2, 1], [0, 1, 2], [10, 10]),     # decreasing qo_indptr
        ([0, 1, 2], [0, 1, 2], [-1, 10]),     # negative kv_len
    ]
    for rounds in range(3):
        plan.build(*good, 64, 16)
        torch.cuda.synchronize()
        assert torch.equal(plan.schedule, want)
        for qo, kv, kv_len in bad:
            with pytest.raises(ValueError):
                plan.build(*tensors(qo, kv, kv_len, "cuda"), 64, 16)
            assert torch.equal(plan.schedule, want)  # .schedule read on the stream: after the rejecting kernel
        # The good build's counts come after its build() returned and are
        # read only now: rejected kernels send none, so they are still its.
        assert plan.info == host.info
    # Rejections on a side stream, then a good build on the default stream.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for qo, kv, kv_len in bad:
            with pytest.raises(ValueError):
                plan.build(*tensors(qo, kv, kv_len, "cuda"), 64, 16)
    torch.cuda.current_stream().wait_stream(side)
    raw2, dev2 = _cuda_batch(12, 8)
    plan.build(*dev2, 64, 16)
    assert torch.equal(plan.schedule, _host_input_reference(plan, raw2))
    torch.cuda.synchronize()
    del plan  # teardown after rejections
    torch.cuda.synchronize()


@requires_cuda
def test_gpu_back_to_back_builds_with_different_inputs(watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=128)
    raw_plan = plan._plan
    batches = [_cuda_batch(100 + i, B, max_qo=2) for i, B in enumerate([128, 1, 77, 0, 128, 3, 64])]
    metas = [torch.full_like(plan.schedule, -5) for _ in batches]
    for (_, dev), meta in zip(batches, metas):
        raw_plan.build(*dev, 64, 16, meta)  # no sync in between: each kernel copies while the next build runs
    # The same plan's own schedule, built repeatedly from alternating inputs.
    for (_, dev) in batches:
        plan.build(*dev, 64, 16)
    torch.cuda.synchronize()
    for (raw, _), meta in zip(batches, metas):
        assert torch.equal(meta, _host_input_reference(plan, raw))
    assert torch.equal(plan.schedule, _host_input_reference(plan, batches[-1][0]))
    assert plan.stats["pinned_allocations"] == 1
    assert plan.stats["stream_syncs"] == 0


@requires_cuda
def test_gpu_build_on_a_side_stream_while_the_default_stream_is_busy(watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=64)
    raw_plan = plan._plan
    sets = [_cuda_batch(200 + i, B) for i, B in enumerate([64, 9, 33, 1])]
    metas = [torch.zeros_like(plan.schedule) for _ in range(2 * len(sets))]
    wants = [_host_input_reference(plan, raw) for raw, _ in sets]
    plan.build(*sets[0][1], 64, 16)  # warm: the pinned staging buffer is allocated before the clock starts
    torch.cuda.synchronize()
    main = torch.cuda.current_stream()
    side_a, side_b = torch.cuda.Stream(), torch.cuda.Stream()
    # The default stream is busy for ~1.5 s or more: under racecheck the eight
    # builds below take ~0.55 s (each waits for its kernel's verdict and, on a
    # stream switch, the previous kernel's counts, all instrumented).
    torch.cuda._sleep(3_000_000_000)
    t0 = time.perf_counter()
    # Alternating streams: the previous exchange kernel may still be deciding
    # or placing its schedule on the other stream when the next one starts.
    for i in range(2 * len(sets)):
        with torch.cuda.stream(side_a if i % 2 == 0 else side_b):
            raw_plan.build(*sets[i % len(sets)][1], 64, 16, metas[i])
    elapsed = time.perf_counter() - t0
    still_busy = not main.query()
    side_a.synchronize()
    side_b.synchronize()
    for i, meta in enumerate(metas):
        assert torch.equal(meta, wants[i % len(sets)]), i
    # Each launch on the other stream first waited for the previous kernel's
    # counts: the last ones are the last build's.
    last = mlacore.MlaPlan("cpu", max_batch=64, num_sms=plan.num_sms)
    last.build(*tensors(*sets[(2 * len(sets) - 1) % len(sets)][0]), 64, 16)
    got = raw_plan.info()
    assert {k: got[k] for k in mlacore.PlanInfo._fields} == last.info._asdict()
    # The builds did not wait for the default stream.
    assert still_busy, elapsed
    torch.cuda.synchronize()


@requires_cuda
def test_gpu_device_input_build_waits_for_a_pending_host_input_upload(watchdog):
    # The upload, held back by a long kernel, must have read the pinned
    # schedule region before the next host-input build rewrites it, with an
    # exchange (which leaves that region alone) in between.
    plan = mlacore.MlaPlan("cuda", max_batch=8, num_sms=8)
    raw = plan._plan
    meta_a, meta_b, meta_c = (torch.zeros_like(plan.schedule) for _ in range(3))
    a = ([0, 1], [0, 100], [6400])
    b = ([0, 1, 2], [0, 1, 2], [64, 64])
    want_a = _host_input_reference(plan, a)
    want_b = _host_input_reference(plan, b)
    host_a, dev_b = tensors(*a), tensors(*b, "cuda")  # made before the sleep: their copies would wait for it
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    raw.build(*host_a, 64, 16, meta_a)  # upload queued behind the sleep
    raw.build(*dev_b, 64, 16, meta_b)   # exchange: its kernel too, so the host waits; then the upload's event
    raw.build(*host_a, 64, 16, meta_c)  # host inputs right after an exchange
    torch.cuda.synchronize()
    assert torch.equal(meta_a, want_a)
    assert torch.equal(meta_b, want_b)
    assert torch.equal(meta_c, want_a)


@requires_cuda
def test_gpu_many_builds_in_a_loop(watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=256)
    sets = [_cuda_batch(300 + i, B) for i, B in enumerate([256, 1, 100, 0, 255])]
    n = 2000
    before = plan.stats
    for i in range(n):
        plan.build(*sets[i % len(sets)][1], 64, 16)
        if i % 499 == 0:
            torch.cuda.synchronize()
            assert torch.equal(plan.schedule, _host_input_reference(plan, sets[i % len(sets)][0])), i
    torch.cuda.synchronize()
    assert torch.equal(plan.schedule, _host_input_reference(plan, sets[(n - 1) % len(sets)][0]))
    after = plan.stats
    assert after["device_to_host_copies"] - before["device_to_host_copies"] == n
    assert after["stream_syncs"] - before["stream_syncs"] == 0
    assert after["pinned_allocations"] == 1


@requires_cuda
def test_gpu_host_inputs_cost_no_round_trip():
    plan = mlacore.MlaPlan("cuda", max_batch=32)
    raw, _ = _cuda_batch(3, 32)
    plan.build(*tensors(*raw), 64, 16)
    s = plan.stats
    assert s["device_to_host_copies"] == 0 and s["stream_syncs"] == 0 and s["host_to_device_copies"] == 1
    host = mlacore.MlaPlan("cpu", max_batch=32, num_sms=plan.num_sms)
    host.build(*tensors(*raw), 64, 16)
    assert torch.equal(plan.schedule.cpu(), host.schedule)


@requires_cuda
def test_gpu_pinned_buffer_is_guarded_until_its_upload_ran():
    # The first upload waits behind a long kernel; the second build must not
    # overwrite the pinned schedule it is about to copy.
    plan = mlacore.MlaPlan("cuda", max_batch=8, num_sms=8)
    raw = plan._plan
    meta_a = torch.zeros_like(plan.schedule)
    meta_b = torch.zeros_like(plan.schedule)
    a = tensors([0, 1], [0, 100], [6400])
    b = tensors([0, 1, 2], [0, 1, 2], [64, 64])
    want_a = mlacore.MlaPlan("cpu", max_batch=8, num_sms=8)
    want_a.build(*a, 64, 16)
    torch.cuda._sleep(200_000_000)
    raw.build(*a, 64, 16, meta_a)
    raw.build(*b, 64, 16, meta_b)
    torch.cuda.synchronize()
    assert torch.equal(meta_a.cpu(), want_a.schedule)


@requires_cuda
@pytest.mark.parametrize("B,dtype", [(0, torch.int32), (1, torch.int32), (33, torch.int64), (255, torch.int32),
                                     (256, torch.int32), (257, torch.int64), (1000, torch.int32)])
def test_gpu_build_device_equals_host_build_bitwise(B, dtype):
    plan = mlacore.MlaPlan("cuda", max_batch=1024)
    ref = mlacore.MlaPlan("cpu", max_batch=1024, num_sms=plan.num_sms)
    for seed in range(3):
        raw, dev = _cuda_batch(seed + B, B, page_size=16, max_qo=4, dtype=dtype)
        plan.schedule.fill_(-777)
        plan.build_device(*dev, 16, 16)
        ref.build(*tensors(*raw), 16, 16)
        assert torch.equal(plan.schedule.cpu(), ref.schedule)
        assert plan.info == ref.info
    assert plan.stats["device_to_host_copies"] == 0 and plan.stats["pinned_allocations"] == 0


@requires_cuda
@pytest.mark.parametrize("B,rows,qo_floor", [(1, 16 * 4 * 5, 0), (3, 16 * 4 * 2, 4), (33, 16 * 4 * 40, 0), (33, 0, 0),
                                             (257, 65408, 0), (1000, 16 * 4 * 7, 8)])
def test_gpu_partial_budget_is_bitwise_equal_on_host_exchange_and_device_builds(B, rows, qo_floor):
    plan = mlacore.MlaPlan("cuda", max_batch=1024)
    ref = mlacore.MlaPlan("cpu", max_batch=1024, num_sms=plan.num_sms)
    for p in (plan, ref):
        p.set_partial_budget(rows, qo_floor)
    for seed in range(3):
        raw, dev = _cuda_batch(seed + B, B, page_size=16, max_qo=4)
        ref.build(*tensors(*raw), 16, 16)
        plan.schedule.fill_(-777)
        plan.build_device(*dev, 16, 16)
        assert torch.equal(plan.schedule.cpu(), ref.schedule)
        plan.schedule.fill_(-777)
        plan.build(*dev, 16, 16)  # the exchange kernel's narrow path
        assert torch.equal(plan.schedule.cpu(), ref.schedule)
        assert plan.info == ref.info


@requires_cuda
def test_gpu_build_device_does_not_synchronize():
    plan = mlacore.MlaPlan("cuda", max_batch=16)
    _, dev = _cuda_batch(0, 16)
    plan.build_device(*dev, 64, 16)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s or more of device time
    t0 = time.perf_counter()
    plan.build_device(*dev, 64, 16)
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert elapsed < 0.05


@requires_cuda
def test_gpu_cuda_graph_capture_and_replay_with_new_lengths():
    max_batch, page_size = 64, 16
    plan = mlacore.MlaPlan("cuda", max_batch=max_batch)
    ref = mlacore.MlaPlan("cpu", max_batch=max_batch, num_sms=plan.num_sms)
    (qo, kv, kv_len), dev = _cuda_batch(0, max_batch, page_size, max_qo=2)
    static = [t.clone() for t in dev]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.build_device(*static, page_size, 16)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.build_device(*static, page_size, 16)
    for seed in range(1, 5):
        # A smaller live batch padded with empty requests, as engines do under graphs.
        live = [max_batch, 40, 7, 1][seed - 1]
        raw, _ = _cuda_batch(seed, live, page_size, max_qo=2)
        qo = raw[0] + [raw[0][-1]] * (max_batch - live)
        kv = raw[1] + [raw[1][-1]] * (max_batch - live)
        kv_len = raw[2] + [0] * (max_batch - live)
        for dst, src in zip(static, tensors(qo, kv, kv_len, "cuda")):
            dst.copy_(src)
        plan.schedule.fill_(-1)
        graph.replay()
        ref.build(*tensors(qo, kv, kv_len), page_size, 16)
        assert torch.equal(plan.schedule.cpu(), ref.schedule)
        check_invariants(plan, kv_len, page_size)


@requires_cuda
def test_gpu_host_build_refuses_graph_capture(watchdog):
    plan = mlacore.MlaPlan("cuda", max_batch=4)
    raw, dev = _cuda_batch(0, 4)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="use build_device under capture"):
        with torch.cuda.graph(graph):
            plan.build(*dev, 64, 16)
    # Refused before any launch: nothing spins, and the plan still works.
    torch.cuda.synchronize()
    plan.build(*dev, 64, 16)
    assert torch.equal(plan.schedule, _host_input_reference(plan, raw))


@requires_cuda
def test_gpu_build_device_flags_invalid_inputs_and_skips_those_requests():
    plan = mlacore.MlaPlan("cuda", max_batch=8, num_sms=8)
    # Request 1 claims 200 tokens on 1 page of 64: no work for it, the rest planned.
    plan.build_device(*tensors([0, 1, 2, 3], [0, 2, 3, 4], [100, 200, 10], "cuda"), 64, 16)
    info = plan.info
    assert info.error == PLAN_ERROR_KV_LEN
    items = plan.work_items.cpu().tolist()[: info.num_work]
    assert sorted({r for r, *_ in items}) == [0, 2]
    assert plan.kv_last_page_len.cpu().tolist()[:3] == [36, 0, 10]
    # A decreasing kv_indptr.
    plan.build_device(*tensors([0, 1, 2], [0, 3, 2], [100, 10], "cuda"), 64, 16)
    assert plan.info.error & PLAN_ERROR_INDPTR and {r for r, *_ in plan.work_items.cpu().tolist()} <= {-1, 0}
    # qo_indptr not starting at 0: nothing is planned.
    plan.build_device(*tensors([1, 2, 3], [0, 1, 2], [10, 10], "cuda"), 64, 16)
    assert plan.info.error == PLAN_ERROR_INDPTR_START and plan.info.num_work == 0
    assert all(r == -1 for r, *_ in plan.work_items.cpu().tolist())
    # The host build raises for the same inputs instead.
    with pytest.raises(ValueError, match="request 1"):
        plan.build(*tensors([0, 1, 2, 3], [0, 2, 3, 4], [100, 200, 10], "cuda"), 64, 16)


@requires_cuda
def test_gpu_device_mismatch_errors():
    plan = mlacore.MlaPlan("cuda", max_batch=4)
    qo, kv, kv_len = _cuda_batch(0, 2)[1]
    with pytest.raises(ValueError, match="kv_len_arr: expected a tensor on cuda:0"):
        plan.build(qo, kv, kv_len.cpu(), 64, 16)
    cpu_plan = mlacore.MlaPlan("cpu", max_batch=4)
    with pytest.raises(ValueError, match="schedule: expected a tensor on cuda"):
        cpu_plan.build(qo, kv, kv_len, 64, 16)


@requires_cuda
def test_gpu_blocking_launches_still_exchange():
    """With CUDA_LAUNCH_BLOCKING=1 a launch returns only once its kernel has ended; the exchange
    kernel never waits for the host, so its flag is already there: the same schedule, a
    rejection still raised, no stream synchronization. A fresh process, since the setting is
    read at context creation."""
    code = (
        "import torch, mlacore, pytest\n"
        "dev = torch.device('cuda')\n"
        "kv_len = torch.tensor([5, 0, 300, 64], dtype=torch.int32)\n"
        "pages = (kv_len + 15) // 16\n"
        "kv = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(pages, 0).to(torch.int32)])\n"
        "qo = torch.arange(5, dtype=torch.int32)\n"
        "a = mlacore.MlaPlan(dev, max_batch=8)\n"
        "a.build(qo.cuda(), kv.cuda(), kv_len.cuda(), 16, 16)\n"
        "b = mlacore.MlaPlan(dev, max_batch=8)\n"
        "b.build(qo, kv, kv_len, 16, 16)\n"
        "torch.cuda.synchronize()\n"
        "assert torch.equal(a.schedule, b.schedule)\n"
        "with pytest.raises(ValueError, match='request 0'):\n"
        "    a.build(qo.cuda(), kv.cuda(), (kv_len + 100).cuda(), 16, 16)\n"
        "assert torch.equal(a.schedule, b.schedule)\n"
        "assert a.stats['stream_syncs'] == 0, a.stats\n"
        "print('ok')\n")
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def test_128_mib_serves_uniform_engine_shapes_without_capping():
    # Engines give 128 MiB. At heads 16-128, batch 1-512, 1-4 query tokens and uniform lengths the
    # budget never changes the schedule (132 SMs); it binds only for skewed batches, which it keeps in.
    rows = _mlacore.mla_decode_workspace_rows(128 << 20)
    for heads in (16, 128):
        for B in (1, 4, 32, 128, 512):
            for qo_len in (1, 2, 4):
                for L in (1024, 65536):
                    qo, kv, kv_len = tensors([q * qo_len for q in range(B + 1)], [b * L for b in range(B + 1)],
                                             [L] * B)
                    plan = mlacore.MlaPlan("cpu", max_batch=B, num_sms=132)
                    plan.build(qo, kv, kv_len, 1, heads)
                    free = plan.schedule.clone()
                    plan.set_partial_budget(rows)
                    plan.build(qo, kv, kv_len, 1, heads)
                    assert torch.equal(plan.schedule, free), (heads, B, qo_len, L)
                    assert plan.info.num_partials * qo_len * heads * 2052 <= 128 << 20
    # Skewed: one long request among short ones at 128 heads x 4 tokens: capped, and within 128 MiB.
    B = 512
    lens = [65536] + [64] * (B - 1)
    qo, kv, kv_len = tensors([q * 4 for q in range(B + 1)], [0] + list(torch.tensor(lens).cumsum(0).tolist()), lens)
    plan = mlacore.MlaPlan("cpu", max_batch=B, num_sms=132)
    plan.set_partial_budget(rows)
    plan.build(qo, kv, kv_len, 1, 128)
    assert plan.info.num_partials * 4 * 128 * 2052 <= 128 << 20


# --- the balanced split (tests/_schedule.py, docs/design/2026-12-03-balanced-schedule.md) ---

BALANCED_BATCHES = [
    ("one long request", [65536], 66),
    ("bar shape", [32768] * 8, 66),
    ("many short", [1024] * 128, 66),
    ("ragged", [random.Random(32).randint(1, 16384) for _ in range(32)], 66),
    ("ragged with empties", [0, 5, 0, 70000, 3, 0, 640, 64, 65], 7),
    ("more parts than tiles", [64, 1], 132),
    ("all empty", [0, 0, 0], 4),
]


@pytest.mark.parametrize("name,lens,num_parts", BALANCED_BATCHES, ids=[b[0] for b in BALANCED_BATCHES])
def test_balanced_parts_cover_every_tile_once_within_the_payload(name, lens, num_parts):
    from _schedule import balanced_parts

    tiles = [cdiv(n, TILE) for n in lens]
    parts = balanced_parts(tiles, num_parts, FIXED)
    assert len(parts) == num_parts
    payload = max(cdiv(sum(k + FIXED for k in tiles), num_parts) + FIXED, 2 * FIXED)
    nxt = [0] * len(tiles)
    pieces = 0
    for part in parts:
        # A list's cost: its tiles plus a fixed cost a piece, never over the payload.
        assert sum(t1 - t0 + FIXED for _, t0, t1 in part) <= payload
        for b, t0, t1 in part:
            assert t0 == nxt[b] and t0 <= t1 <= tiles[b] and (t1 > t0 or tiles[b] == 0)
            nxt[b] = t1 if tiles[b] else -1  # an empty request: exactly one (empty) piece
            pieces += 1
    assert nxt == [k if k else -1 for k in tiles], "every tile in exactly one piece, in order"
    # Each list boundary cuts at most one request: today's default_max_work holds the pieces.
    assert pieces <= len(tiles) + num_parts - 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("heads,qo_lens,kv_lens,page_size,num_sms", [
    (16, [1] * 5, [300, 64, 0, 1000, 129], 16, 6),
    (128, [1] * 3, [2000, 7, 650], 1, 6),
    (16, [2, 1, 3], [520, 90, 333], 64, 3),
])
def test_balanced_schedule_runs_on_the_current_kernels(device, heads, qo_lens, kv_lens, page_size, num_sms):
    # The balanced split laid out as today's schedule (pieces as work items, several requests' pieces
    # in one list, one request's pieces over several lists) gives the planned decode's results.
    from _schedule import balanced_schedule
    from test_decode import check, make_batch, run_wrapper
    from mlacore import _mla_decode

    d = make_batch(kv_lens, qo_lens, page_size, heads, torch.bfloat16, device, seed=5)
    md, max_batch, max_work, max_qo, parts = balanced_schedule(d["qo_indptr"].cpu(), d["kv_len"].cpu(), page_size,
                                                               heads, num_sms=num_sms)
    assert md[1] > 0, "the lists cut at least one request: the combine runs"
    assert any(len(p) > 1 for p in parts), "at least one list holds pieces of several requests"
    ws = torch.empty(_mla_decode._capacity_bytes(max_batch, max_work, max_qo, heads), dtype=torch.uint8, device=device)
    out = torch.empty_like(d["q_nope"])
    lse = torch.empty(d["q_nope"].shape[:2], dtype=torch.float32, device=device)
    sm_scale = 0.1
    _mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"], d["qo_indptr"],
                        d["kv_len"], md.to(device), ws, out, lse, max_batch, max_work, max_qo, max_work, page_size,
                        sm_scale, True)
    check(d, out, lse, sm_scale, True, what="balanced schedule")
    (planned, planned_lse), _ = run_wrapper(d, causal=True, sm_scale=sm_scale)
    assert (out.float() - planned.float()).abs().max().item() <= 2e-2
    fin = torch.isfinite(planned_lse)
    assert torch.equal(torch.isfinite(lse), fin)  # -inf exactly where a request has no KV
    assert (lse[fin] - planned_lse[fin]).abs().max().item() <= 2e-3


# --- longest-first placement (MLACORE_SCHEDULE=longest_first, read when a plan is created) ---

@pytest.mark.parametrize("B,page_size,heads,max_qo,num_sms,max_kv", CASES)
def test_cpu_longest_first_matches_reference_and_invariants(B, page_size, heads, max_qo, num_sms, max_kv,
                                                             monkeypatch):
    monkeypatch.setenv("MLACORE_SCHEDULE", "longest_first")
    rng = random.Random(B * 1000 + page_size)
    qo, kv, kv_len = random_batch(rng, B, page_size, max_qo, max_kv)
    plan = mlacore.MlaPlan("cpu", max_batch=B + 5, num_sms=num_sms)
    plan.build(*tensors(qo, kv, kv_len), page_size, heads)
    want = reference(qo, kv, kv_len, page_size, heads, num_sms, plan.max_batch, plan.max_work, longest_first=True)
    assert plan.schedule.tolist() == want
    check_invariants(plan, kv_len, page_size)  # a request's items still in order, same splits
    monkeypatch.setenv("MLACORE_SCHEDULE", "legacy")
    legacy = mlacore.MlaPlan("cpu", max_batch=B + 5, num_sms=num_sms)
    legacy.build(*tensors(qo, kv, kv_len), page_size, heads)
    assert legacy.schedule.tolist() == reference(qo, kv, kv_len, page_size, heads, num_sms, plan.max_batch,
                                                 plan.max_work, longest_first=False)
    # The same items, header and per-request sections: only the order of the work array differs.
    n = plan.info.num_work
    assert plan.info == legacy.info
    assert sorted(map(tuple, plan.work_items[:n].tolist())) == sorted(map(tuple, legacy.work_items[:n].tolist()))
    assert torch.equal(plan.split_indptr, legacy.split_indptr)


def test_longest_first_orders_a_ragged_batch_by_length_class(monkeypatch):
    # 300 requests of 1..2048 tokens do not split on 132 SMs: one item each, now longest first.
    monkeypatch.setenv("MLACORE_SCHEDULE", "longest_first")
    rng = random.Random(7)
    lens = [rng.randint(1, 2048) for _ in range(300)]
    kv = [0]
    for L in lens:
        kv.append(kv[-1] + cdiv(L, 64))
    plan = mlacore.MlaPlan("cpu", max_batch=300, num_sms=132)
    plan.build(*tensors(list(range(301)), kv, lens), 64, 128)
    chunk = plan.info.chunk_tokens // TILE
    assert plan.info.num_partials == 0 and chunk == 32
    items = plan.work_items[:300].tolist()
    classes = [lpt_class(cdiv(e - b, TILE), chunk) for _, b, e, _ in items]
    assert classes == sorted(classes) and classes[0] == 0 and classes[-1] > 0
    first = [r for (r, _, _, _), c in zip(items, classes) if c == 0]
    assert first == sorted(first)  # request order within a class


def test_schedule_knob_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("MLACORE_SCHEDULE", "balanced-ish")
    with pytest.raises(ValueError, match="MLACORE_SCHEDULE: expected legacy or longest_first"):
        mlacore.MlaPlan("cpu", max_batch=4, num_sms=8)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_longest_first_decode_equals_request_order(device, monkeypatch):
    # The work items' order changes which CTA (or CPU loop step) runs them, never what they write:
    # outputs and LSE are bitwise those of request order.
    from test_decode import make_batch, run_wrapper

    d = make_batch([700, 5, 0, 3000, 130, 64, 2100], [1, 2, 1, 1, 3, 1, 1], 16, 16, torch.bfloat16, device, seed=9)
    runs = []
    for mode in ("legacy", "longest_first"):
        monkeypatch.setenv("MLACORE_SCHEDULE", mode)
        runs.append(run_wrapper(d, causal=True, sm_scale=0.1)[0])
    (oa, la), (ob, lb) = runs
    assert torch.equal(oa, ob) and torch.equal(la, lb)


@requires_cuda
@pytest.mark.parametrize("B", [1, 7, 32, 33, 300, 700])
def test_gpu_longest_first_device_builds_equal_the_host(B, monkeypatch, watchdog):
    # The exchange (device inputs) and build_device run place_longest_first() on a block of threads;
    # both must write the host's schedule bit for bit.
    monkeypatch.setenv("MLACORE_SCHEDULE", "longest_first")
    rng = random.Random(B)
    qo, kv, kv_len = random_batch(rng, B, 16, 2, 20000)
    host = mlacore.MlaPlan("cuda", max_batch=B + 3)
    host.build(*tensors(qo, kv, kv_len), 16, 128)
    want = reference(qo, kv, kv_len, 16, 128, host.num_sms, host.max_batch, host.max_work, longest_first=True)
    assert host.schedule.cpu().tolist() == want
    exchange = mlacore.MlaPlan("cuda", max_batch=B + 3)
    exchange.build(*tensors(qo, kv, kv_len, device="cuda"), 16, 128)
    device_only = mlacore.MlaPlan("cuda", max_batch=B + 3)
    device_only.build_device(*tensors(qo, kv, kv_len, device="cuda"), 16, 128)
    torch.cuda.synchronize()
    assert exchange.schedule.cpu().tolist() == want
    assert device_only.schedule.cpu().tolist() == want
