"""Hostile sizes and tensors (issue 28): one test per attack row.

Caller-controlled sizes reach int64's edge without memory through expand()
(stride 0) and huge decode dims; each must be a ValueError/TypeError naming
the argument, with nothing written outside the outputs (every output and
cache here is filled with a sentinel first and compared after). The `device`
fixture runs each row on the CPU and, where present, on CUDA: there the
refusal must come before any launch, so nothing on the device changes.
"""

import pytest
import torch

import mlacore
from mlacore import _mla_decode, _mlacore

I64MAX = 2**63 - 1


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def i64(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def huge(length, device, dtype=torch.int64, value=0):
    """A 1-D index tensor of `length` elements (up to 2^63-1) in one element of memory."""
    return torch.full((1,), value, dtype=dtype, device=device).expand(length)


def unchanged(*pairs):
    for t, before in pairs:
        assert torch.equal(t, before), "a refused call wrote into a tensor"


class launches_nothing:
    """On CUDA, asserts that the block launched no kernel and made no copy
    (CUDA activity seen by torch's profiler); elsewhere a plain block. Build
    the call's inputs before the block: making a CUDA tensor copies."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            kernels = [e.name for e in self.prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            assert not kernels, f"a refused call launched {kernels}"
        return False


# --- appends ----------------------------------------------------------------------

def mla_append_case(device):
    ckv = torch.full((4, 2, 512), 7.0, dtype=torch.bfloat16, device=device)
    kpe = torch.full((4, 2, 64), 7.0, dtype=torch.bfloat16, device=device)
    src_ckv = torch.randn(1, 512, device=device).to(torch.bfloat16)
    src_kpe = torch.randn(1, 64, device=device).to(torch.bfloat16)
    return ckv, kpe, src_ckv, src_kpe


def kv_append_case(device):
    k = torch.full((4, 2, 1, 8), 7.0, device=device)
    v = torch.full((4, 2, 1, 8), 7.0, device=device)
    return k, v, torch.randn(1, 1, 8, device=device), torch.randn(1, 1, 8, device=device)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("which", ["mla", "kv"])
def test_d1_append_huge_last_page_len_and_batch_index(device, which, strict):
    if which == "mla":
        cache_a, cache_b, src_a, src_b = mla_append_case(device)
    else:
        cache_a, cache_b, src_a, src_b = kv_append_case(device)
    before = (cache_a.clone(), cache_b.clone())
    last = huge(I64MAX, device)
    bi, pos = i64([2**62], device), i64([0], device)
    indices, indptr = i64([0, 1], device), i64([0, 1, 2], device)
    with launches_nothing(device), pytest.raises(ValueError, match="kv_last_page_len"):
        if which == "mla":
            mlacore.append_paged_mla_kv_cache(src_a, src_b, bi, pos, cache_a, cache_b, indices, indptr, last,
                                              strict=strict)
        else:
            mlacore.append_paged_kv_cache(src_a, src_b, bi, pos, (cache_a, cache_b), indices, indptr, last,
                                          kv_layout="NHD", strict=strict)
    unchanged((cache_a, before[0]), (cache_b, before[1]))


def test_d1_append_huge_kv_indptr_is_refused(device):
    # kv_indptr itself a huge broadcast: 2^63-1 int64 elements are no byte
    # size in int64; 2^59 are, and the batch they define needs as many
    # kv_last_page_len entries.
    ckv, kpe, src_ckv, src_kpe = mla_append_case(device)
    before = (ckv.clone(), kpe.clone())
    bi, pos, indices, last = i64([2**62], device), i64([0], device), i64([0], device), i64([1], device)
    for indptr, match in ((huge(I64MAX, device), "^kv_indptr: "), (huge(2**59, device), "^kv_last_page_len: ")):
        with launches_nothing(device), pytest.raises(ValueError, match=match):
            mlacore.append_paged_mla_kv_cache(src_ckv, src_kpe, bi, pos, ckv, kpe, indices, indptr, last)
    unchanged((ckv, before[0]), (kpe, before[1]))


def test_d1_append_last_page_len_of_2_59_entries(device):
    ckv, kpe, src_ckv, src_kpe = mla_append_case(device)
    before = (ckv.clone(), kpe.clone())
    args = (i64([2**62], device), i64([0], device), ckv, kpe, i64([0, 1], device), i64([0, 1, 2], device),
            huge(2**59, device))
    with launches_nothing(device), pytest.raises(ValueError, match=r"^kv_last_page_len: .*len\(kv_indptr\)-1=2"):
        mlacore.append_paged_mla_kv_cache(src_ckv, src_kpe, *args, strict=True)
    unchanged((ckv, before[0]), (kpe, before[1]))


def test_e1_last_page_len_one_longer_than_the_batch_is_named(device):
    ckv, kpe, src_ckv, src_kpe = mla_append_case(device)
    before = (ckv.clone(), kpe.clone())
    args = (i32([0], device), i32([0], device), ckv, kpe, i32([0], device), i32([0, 1], device), i32([1, 1], device))
    with launches_nothing(device), pytest.raises(ValueError, match=r"^kv_last_page_len: .*len\(kv_indptr\)-1=1"):
        mlacore.append_paged_mla_kv_cache(src_ckv, src_kpe, *args)
    unchanged((ckv, before[0]), (kpe, before[1]))


# --- slot mapping ops ---------------------------------------------------------------

@pytest.mark.parametrize("rows,dtype", [(I64MAX, torch.int64), (I64MAX, torch.uint8), (2**60, torch.int32)])
def test_d2_block_table_with_huge_row_counts(device, rows, dtype):
    # int64 rows past a byte size, uint8 rows at exactly 2^63-1 (rows + 1
    # would wrap; then the dtype is refused, by name), int32 rows that fit.
    table = torch.zeros(1, 1, dtype=dtype, device=device).expand(rows, 1)
    out = torch.full((4,), -5, dtype=torch.int64 if dtype == torch.uint8 else dtype, device=device)
    cu = i64([0, 1], device)
    with launches_nothing(device), pytest.raises(ValueError, match="^(block_table|cu_num_blocks): "):
        mlacore.page_indices_from_block_table(table, cu, out)
    assert out.tolist() == [-5] * 4


def test_d11_batch_positions_huge_nnz_names_nnz(device):
    with pytest.raises(ValueError, match="^nnz: "):
        mlacore.get_batch_indices_positions(i32([0, 1], device), i32([1], device), 2**62)


def test_d11_slot_mapping_huge_batch_indices_names_it(device):
    bi = huge(I64MAX, device)
    with pytest.raises(ValueError, match="^batch_indices: "):
        mlacore.slot_mapping(bi, bi, i64([0], device), i64([0, 1], device), 4)


# --- decode ---------------------------------------------------------------------

HEADS, PAGE = 2, 4


def decode_case(device):
    g = torch.Generator().manual_seed(0)
    d = dict(q_nope=torch.randn(1, HEADS, 512, generator=g), q_pe=torch.randn(1, HEADS, 64, generator=g),
             ckv=torch.randn(2, PAGE, 512, generator=g), kpe=torch.randn(2, PAGE, 64, generator=g))
    d = {k: v.to(torch.bfloat16).to(device) for k, v in d.items()}
    d.update(kv_indices=i32([0], device), kv_indptr=i32([0, 1], device), qo_indptr=i32([0, 1], device),
             kv_len=i32([3], device))
    plan = mlacore.MlaPlan(torch.device(device), max_batch=1)
    d["schedule"] = plan.build(d["qo_indptr"], d["kv_indptr"], d["kv_len"], PAGE, HEADS)
    d["dims"] = dict(max_batch=plan.max_batch, max_work=plan.max_work, max_qo_len=1, max_partials=plan.max_work)
    d["workspace"] = torch.zeros(_mla_decode._capacity_bytes(plan.max_batch, plan.max_work, 1, HEADS),
                                 dtype=torch.uint8, device=device)
    d["out"] = torch.full((1, HEADS, 512), -3.0, dtype=torch.bfloat16, device=device)
    d["lse"] = torch.full((1, HEADS), -3.0, dtype=torch.float32, device=device)
    return d


def call_decode(d, **dims):
    dm = dict(d["dims"], **dims)
    torch.ops.mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"],
                                 d["qo_indptr"], d["kv_len"], d["schedule"], d["workspace"], d["out"], d["lse"],
                                 dm["max_batch"], dm["max_work"], dm["max_qo_len"], dm["max_partials"], PAGE, 0.1,
                                 True, False, "native")


def decode_refused(d, match, **dims):
    out, lse, ws = d["out"].clone(), d["lse"].clone(), d["workspace"].clone()
    with launches_nothing(d["out"].device), pytest.raises(ValueError, match=match):
        call_decode(d, **dims)
    unchanged((d["out"], out), (d["lse"], lse), (d["workspace"], ws))


def test_decode_case_itself_runs(device):
    d = decode_case(device)
    call_decode(d)
    assert torch.isfinite(d["out"].float()).all() and not (d["out"] == -3.0).all()


def test_d3_decode_max_work_2_62(device):
    d = decode_case(device)
    d["schedule"] = torch.zeros(12, dtype=torch.int32, device=device)  # what the wrapped layout total asked for
    decode_refused(d, "max_work", max_work=2**62, max_partials=1)


def test_d4_decode_max_qo_len_2_61(device):
    d = decode_case(device)
    d["workspace"] = torch.zeros(16, dtype=torch.uint8, device=device)
    decode_refused(d, "max_qo_len", max_qo_len=2**61)


def test_d4_workspace_bytes_overflow_is_refused_by_name(device):
    d = decode_case(device)
    # Every dim within its own bound, the product past int64.
    d["workspace"] = torch.zeros(16, dtype=torch.uint8, device=device)
    n = 2**28
    d["schedule"] = huge(mlacore.plan_schedule_size(n, n), device, torch.int32)
    decode_refused(d, "^dims: the workspace", max_batch=n, max_work=n, max_partials=n, max_qo_len=2**31 - 1)


def test_d5_decode_max_batch_and_work_past_2_62(device):
    d = decode_case(device)
    decode_refused(d, "max_batch", max_batch=2**62 + 2**40, max_work=2**62 + 2**40)


def test_d10_workspace_bytes_overflow_is_minus_one():
    assert _mlacore.mla_decode_workspace_bytes(1, 1, 2**61, 1, 128) == -1
    assert _mlacore.mla_decode_workspace_bytes(1, 2**28, 2**31 - 1, 2**28, 128) == -1
    assert _mlacore.mla_decode_workspace_bytes(1, 1, 1, -1, 1) == -1
    assert _mlacore.mla_decode_workspace_bytes(1, 1, 1, 1, 1) == 513 * 4


def planned_wrapper(d, device):
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=device),
                                              backend="native")
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], HEADS, 512, 64, PAGE, True, 0.1,
           torch.bfloat16, torch.bfloat16)
    return w


def test_d7_negative_view_as_query_is_refused(device):
    # The eager path hands the tensor to the binding as it is; through the
    # torch op, torch materializes the negation first (checked too).
    d = decode_case(device)
    w = planned_wrapper(d, device)
    out = torch.full((1, HEADS, 512), -3.0, dtype=torch.bfloat16, device=device)
    with launches_nothing(device), pytest.raises(ValueError, match="^q_nope: .*negative"):
        w.run(torch._neg_view(d["q_nope"]), d["q_pe"], d["ckv"], d["kpe"], out=out)
    assert (out == -3.0).all()
    want = w.run(-d["q_nope"], d["q_pe"], d["ckv"], d["kpe"])
    d["q_nope"] = torch._neg_view(d["q_nope"])
    call_decode(d)
    assert torch.equal(d["out"], want)


def test_d7_negative_view_as_append_source_is_refused(device):
    ckv, kpe, src_ckv, src_kpe = mla_append_case(device)
    before = (ckv.clone(), kpe.clone())
    args = (i32([0], device), i32([0], device), ckv, kpe, i32([0], device), i32([0, 1], device), i32([1], device))
    neg = torch._neg_view(src_ckv)
    with launches_nothing(device), pytest.raises(ValueError, match="^append_ckv: .*negative"):
        mlacore.append_paged_mla_kv_cache(neg, src_kpe, *args)
    unchanged((ckv, before[0]), (kpe, before[1]))


def test_d7_conjugate_view_is_refused(device):
    idx = torch.zeros(2, dtype=torch.complex64, device=device).conj()
    with pytest.raises(ValueError, match="^kv_indices: "):
        mlacore.slot_mapping(i64([0], device), i64([0], device), idx, i64([0, 1], device), 4)


def test_d8_run_with_more_query_rows_than_the_plan(device):
    d = decode_case(device)
    w = planned_wrapper(d, device)
    q_nope = torch.cat([d["q_nope"], d["q_nope"]])
    q_pe = torch.cat([d["q_pe"], d["q_pe"]])
    out = torch.full((2, HEADS, 512), -3.0, dtype=torch.bfloat16, device=device)
    with launches_nothing(device), pytest.raises(ValueError, match=r"^q_nope: expected 1 rows \(qo_indptr\[-1\] of the plan\), got 2"):
        w.run(q_nope, q_pe, d["ckv"], d["kpe"], out=out)
    assert (out == -3.0).all()
    w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"])  # the planned size still runs


# --- tensors torch cannot hand over -------------------------------------------------

def test_d9_meta_tensor_is_named():
    out = torch.empty(1, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="^out: .*meta"):
        mlacore.page_indices_from_block_table(torch.zeros(1, 1, dtype=torch.int64), i64([0, 1]), out)


def test_d9_sparse_tensor_is_named():
    table = torch.zeros(2, 2, dtype=torch.int64).to_sparse()
    with pytest.raises(ValueError, match="^block_table: "):
        mlacore.page_indices_from_block_table(table, i64([0, 1, 2]), torch.zeros(4, dtype=torch.int64))


def test_d6_null_data_with_nonzero_shape():
    # Any object whose __dlpack__ yields a NULL data pointer (the C ABI case
    # is in tests/cpp/test_hostile_sizes.cpp).
    class NullTensor:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            import ctypes
            cap = self.t.__dlpack__()
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            managed = get(cap, b"dltensor")
            ctypes.c_void_p.from_address(managed).value = None  # DLTensor.data is the first field
            self.cap = cap
            return cap

    out = torch.full((4,), -5, dtype=torch.int64)
    with pytest.raises(ValueError, match="^block_table: expected a data pointer"):
        mlacore.page_indices_from_block_table(NullTensor(torch.zeros(1, 1, dtype=torch.int64)), i64([0, 1]), out)
    assert out.tolist() == [-5] * 4


def test_u2_misaligned_index_tensor_is_refused():
    # torch keeps elements aligned; numpy allows an int32 view at an odd
    # address (the C ABI case is in tests/cpp/test_hostile_sizes.cpp).
    np = pytest.importorskip("numpy")
    buf = np.zeros(17, dtype=np.uint8)
    view = np.ndarray((4,), dtype=np.int32, buffer=buf, offset=1)
    with pytest.raises(ValueError, match="^batch_indices: expected a 4-byte aligned"):
        _mlacore.slot_mapping(view, view, i32([0]), i32([0, 1]), 4, -1, torch.zeros(4, dtype=torch.int64))


def test_u1_plan_at_int32_extremes():
    n = 2**31 - 1
    plan = mlacore.MlaPlan(torch.device("cpu"), max_batch=1)
    plan.build(i64([0, n]), i64([0, 1]), i64([n]), n, 128)
    info = plan.info
    assert info.error == 0 and info.max_qo_len == n and info.max_kv_len == n
    with pytest.raises(ValueError, match="^num_heads: "):
        plan.build(i64([0, n]), i64([0, 1]), i64([n]), n, 129)
