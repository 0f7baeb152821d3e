"""slot_mapping, page_indices_from_block_table, get_batch_indices_positions
against brute-force Python references, on the CPU and (when present) the GPU."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlacore

from conftest import requires_cuda

INT64_MAX = 2**63 - 1
INDEX_DTYPES = st.sampled_from([torch.int32, torch.int64])


# --- references -------------------------------------------------------------

def ref_slots(bi, pos, indices, indptr, page_size, num_pages=None):
    bi, pos, indices, indptr = bi.tolist(), pos.tolist(), indices.tolist(), indptr.tolist()
    batch = len(indptr) - 1
    limit = INT64_MAX // page_size if num_pages is None else num_pages
    out = []
    for b, p in zip(bi, pos):
        slot = -1
        if 0 <= b < batch and p >= 0:
            begin, end = indptr[b], indptr[b + 1]
            if 0 <= begin <= end <= len(indices) and p // page_size < end - begin:
                page = indices[begin + p // page_size]
                if 0 <= page < limit:
                    slot = page * page_size + p % page_size
        out.append(slot)
    return out


def ref_block_table(table, cu, out):
    rows, cols = table.shape
    table, cu, out = table.tolist(), cu.tolist(), out.tolist()
    for r in range(rows):
        begin, end = cu[r], cu[r + 1]
        if begin < 0 or end < begin or begin >= len(out):
            continue
        for j in range(min(end - begin, cols, len(out) - begin)):
            out[begin + j] = table[r][j]
    return out


def ref_batch_positions(indptr, seq_lens, nnz):
    indptr, seq_lens = indptr.tolist(), seq_lens.tolist()
    bi, pos = [-1] * nnz, [-1] * nnz
    for b in range(len(seq_lens)):
        begin, end = indptr[b], indptr[b + 1]
        for t in range(max(begin, 0), min(end, nnz)):
            p = seq_lens[b] - (end - begin) + (t - begin)
            bi[t] = b
            pos[t] = p if 0 <= p <= 2**31 - 1 else -1
    return bi, pos


def strided(values, dtype, step):
    """A 1-D view with element stride `step` holding `values`."""
    base = torch.full((max(len(values), 1) * step,), -77, dtype=dtype)
    view = base[::step][: len(values)]
    view.copy_(torch.tensor(values, dtype=torch.int64))
    return view


# --- hypothesis strategies ----------------------------------------------------

@st.composite
def page_tables(draw):
    batch = draw(st.integers(0, 6))
    counts = draw(st.lists(st.integers(0, 5), min_size=batch, max_size=batch))
    start = draw(st.integers(0, 2))
    indptr = [start]
    for c in counts:
        indptr.append(indptr[-1] + c)
    num_indices = indptr[-1] + draw(st.integers(0, 2))
    if batch and draw(st.booleans()):
        # Corrupt one entry: past the end, negative or reversed.
        i = draw(st.integers(0, batch))
        indptr[i] = draw(st.sampled_from([-1, num_indices + 1, num_indices + 100, 0]))
    num_pages = draw(st.integers(1, 40))
    indices = draw(st.lists(st.integers(-3, num_pages + 3), min_size=num_indices, max_size=num_indices))
    return indptr, indices, num_pages


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_slot_mapping_matches_reference(data):
    indptr, indices, num_pages = data.draw(page_tables())
    page_size = data.draw(st.integers(1, 20))
    nnz = data.draw(st.integers(0, 24))
    batch = len(indptr) - 1
    bi = data.draw(st.lists(st.integers(-2, batch + 2), min_size=nnz, max_size=nnz))
    pos = data.draw(st.lists(st.integers(-3, 6 * page_size), min_size=nnz, max_size=nnz))
    tok_dtype, idx_dtype = data.draw(INDEX_DTYPES), data.draw(INDEX_DTYPES)
    step = data.draw(st.sampled_from([1, 2, 3]))
    t_bi, t_pos = strided(bi, tok_dtype, step), strided(pos, tok_dtype, 1)
    t_idx, t_ptr = strided(indices, idx_dtype, step), strided(indptr, idx_dtype, data.draw(st.sampled_from([1, 2])))
    checked = data.draw(st.booleans())
    got = mlacore.slot_mapping(t_bi, t_pos, t_idx, t_ptr, page_size, num_pages if checked else None)
    assert got.dtype == torch.int64 and got.shape == (nnz,)
    assert got.tolist() == ref_slots(t_bi, t_pos, t_idx, t_ptr, page_size, num_pages if checked else None)


def test_slot_mapping_extremes_never_overflow():
    # Positions near int64's limit must not wrap into a valid index, and a
    # page whose slot does not fit int64 is out of range even unchecked.
    indptr = torch.tensor([0, 2], dtype=torch.int64)
    indices = torch.tensor([3, 2**62], dtype=torch.int64)
    bi = torch.zeros(4, dtype=torch.int64)
    pos = torch.tensor([INT64_MAX, 2**62, 1, 5], dtype=torch.int64)
    for page_size in (1, 2, 4):
        got = mlacore.slot_mapping(bi, pos, indices, indptr, page_size).tolist()
        assert got == ref_slots(bi, pos, indices, indptr, page_size)
    assert mlacore.slot_mapping(bi, pos, indices, indptr, 4).tolist() == [-1, -1, 13, -1]
    assert mlacore.slot_mapping(bi, pos, indices, indptr, 1).tolist() == [-1, -1, 2**62, -1]


def test_slot_mapping_page_size_one_and_num_pages():
    indptr = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    indices = torch.tensor([10, 11, 99, 5, 6], dtype=torch.int32)
    bi = torch.tensor([0, 0, 0, 1, 2, 2, 3, -1], dtype=torch.int32)
    pos = torch.tensor([0, 2, 3, 0, 1, 0, 0, 0], dtype=torch.int32)
    assert mlacore.slot_mapping(bi, pos, indices, indptr, 1).tolist() == [10, 99, -1, -1, 6, 5, -1, -1]
    assert mlacore.slot_mapping(bi, pos, indices, indptr, 1, num_pages=50).tolist() == [10, -1, -1, -1, 6, 5, -1, -1]


def test_slot_mapping_validation_names_the_argument():
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
    bi, pos, idx, ptr = i32(0, 0), i32(0, 1), i32(1, 2), i32(0, 2)
    with pytest.raises(ValueError, match=r"positions: expected 1-D int32 or int64 of length len\(batch_indices\)=2"):
        mlacore.slot_mapping(bi, i32(0), idx, ptr, 4)
    with pytest.raises(ValueError, match="positions: expected int32 \\(the dtype of batch_indices\\)"):
        mlacore.slot_mapping(bi, pos.long(), idx, ptr, 4)
    with pytest.raises(ValueError, match="kv_indptr: expected int32 \\(the dtype of kv_indices\\)"):
        mlacore.slot_mapping(bi, pos, idx, ptr.long(), 4)
    with pytest.raises(ValueError, match="kv_indices: expected 1-D int32 or int64"):
        mlacore.slot_mapping(bi, pos, idx.float(), ptr, 4)
    with pytest.raises(ValueError, match="kv_indptr: expected 1-D of length batch\\+1 >= 1"):
        mlacore.slot_mapping(bi, pos, idx, i32(), 4)
    with pytest.raises(ValueError, match="page_size: expected >= 1, got 0"):
        mlacore.slot_mapping(bi, pos, idx, ptr, 0)
    with pytest.raises(ValueError, match="num_pages: expected >= 0"):
        mlacore.slot_mapping(bi, pos, idx, ptr, 4, num_pages=-2)
    with pytest.raises(ValueError, match="num_pages: expected num_pages \\* page_size to fit in int64"):
        mlacore.slot_mapping(bi, pos, idx, ptr, 4, num_pages=2**62)
    with pytest.raises(ValueError, match="batch_indices: expected 1-D"):
        mlacore.slot_mapping(bi.view(1, 2), pos, idx, ptr, 4)
    with pytest.raises(TypeError, match="kv_indices: expected a tensor, got None"):
        mlacore.slot_mapping(bi, pos, None, ptr, 4)
    with pytest.raises(TypeError, match="batch_indices: expected a tensor, got list"):
        mlacore.slot_mapping([0, 0], pos, idx, ptr, 4)


# --- page_indices_from_block_table -------------------------------------------

@st.composite
def block_tables(draw):
    rows, cols = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    dtype = draw(INDEX_DTYPES)
    values = torch.tensor(draw(st.lists(st.integers(-5, 1000), min_size=rows * cols, max_size=rows * cols)),
                          dtype=torch.int64).view(rows, cols)
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced", "column-sliced"]))
    if layout == "transposed":
        table = torch.empty(cols, rows, dtype=dtype).t()
    elif layout == "sliced":
        table = torch.empty(rows * 2, cols + 3, dtype=dtype)[::2, 1:1 + cols]
    elif layout == "column-sliced":
        table = torch.empty(rows, cols * 2, dtype=dtype)[:, ::2]
    else:
        table = torch.empty(rows, cols, dtype=dtype)
    table.copy_(values)
    counts = draw(st.lists(st.integers(0, cols + 2), min_size=rows, max_size=rows))
    cu = [draw(st.integers(0, 3))]
    for c in counts:
        cu.append(cu[-1] + c)
    if rows and draw(st.booleans()):
        cu[draw(st.integers(0, rows))] = draw(st.sampled_from([-4, 0, cu[-1] + 50]))
    out_len = max(cu[-1] + draw(st.integers(-4, 3)), 0)
    return table, cu, out_len, dtype


@settings(max_examples=300, deadline=None)
@given(case=block_tables(), cu_dtype=INDEX_DTYPES, cu_step=st.sampled_from([1, 2]), out_step=st.sampled_from([1, 3]))
def test_page_indices_from_block_table_matches_reference(case, cu_dtype, cu_step, out_step):
    table, cu, out_len, dtype = case
    t_cu = strided(cu, cu_dtype, cu_step)
    out = strided([-9] * out_len, dtype, out_step)
    expected = ref_block_table(table, t_cu, out)
    got = mlacore.page_indices_from_block_table(table, t_cu, out)
    assert got is out
    assert out.tolist() == expected


def test_block_table_clamps_rows_longer_than_the_table():
    table = torch.arange(1, 9, dtype=torch.int32).view(2, 4)
    cu = torch.tensor([0, 6, 8], dtype=torch.int32)  # row 0 claims 6 blocks of a 4-wide table
    out = torch.full((8,), -1, dtype=torch.int32)
    mlacore.page_indices_from_block_table(table, cu, out)
    assert out.tolist() == [1, 2, 3, 4, -1, -1, 5, 6]
    short = torch.full((5,), -1, dtype=torch.int32)  # too small: writes stop at its end
    mlacore.page_indices_from_block_table(table, torch.tensor([0, 3, 6], dtype=torch.int32), short)
    assert short.tolist() == [1, 2, 3, 5, 6]


def test_block_table_validation():
    table = torch.zeros(3, 4, dtype=torch.int32)
    out = torch.zeros(12, dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_num_blocks: expected 1-D int32 or int64 of length batch\\+1=4"):
        mlacore.page_indices_from_block_table(table, torch.zeros(3, dtype=torch.int32), out)
    with pytest.raises(ValueError, match="out: expected int32 \\(the dtype of block_table\\)"):
        mlacore.page_indices_from_block_table(table, torch.zeros(4, dtype=torch.int32), out.long())
    with pytest.raises(ValueError, match="block_table: expected 2-D"):
        mlacore.page_indices_from_block_table(table[0], torch.zeros(4, dtype=torch.int32), out)


# --- get_batch_indices_positions --------------------------------------------

@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_batch_indices_positions_matches_reference(data):
    batch = data.draw(st.integers(0, 6))
    counts = data.draw(st.lists(st.integers(0, 5), min_size=batch, max_size=batch))
    indptr = [data.draw(st.integers(0, 3))]
    for c in counts:
        indptr.append(indptr[-1] + c)
    big = data.draw(st.booleans())
    seq_lens = [c + data.draw(st.integers(-2, 2**40 if big else 50)) for c in counts]
    nnz = max(indptr[-1] + data.draw(st.integers(-3, 3)), 0)
    dtype = torch.int64 if big else data.draw(INDEX_DTYPES)
    step = data.draw(st.sampled_from([1, 2]))
    t_ptr, t_lens = strided(indptr, dtype, step), strided(seq_lens, dtype, 1)
    bi, pos = mlacore.get_batch_indices_positions(t_ptr, t_lens, nnz)
    assert bi.dtype == pos.dtype == torch.int32
    assert (bi.tolist(), pos.tolist()) == ref_batch_positions(t_ptr, t_lens, nnz)


def test_batch_indices_positions_flashinfer_example():
    append_indptr = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    seq_lens = torch.tensor([10, 4, 2], dtype=torch.int32)
    bi, pos = mlacore.get_batch_indices_positions(append_indptr, seq_lens, 5)
    assert bi.tolist() == [0, 0, 0, 2, 2]
    assert pos.tolist() == [7, 8, 9, 0, 1]


def test_batch_indices_positions_validation():
    with pytest.raises(ValueError, match="seq_lens: expected 1-D int32 or int64 of length len\\(append_indptr\\)-1=2"):
        mlacore.get_batch_indices_positions(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="seq_lens: expected int32 \\(the dtype of append_indptr\\)"):
        mlacore.get_batch_indices_positions(torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="nnz: expected >= 0"):
        mlacore.get_batch_indices_positions(torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), -1)


# --- the pieces composed, eager and compiled ---------------------------------

def _appended_slots(append_indptr, seq_lens, kv_indices, kv_indptr, page_size, nnz, block_table, cu):
    bi, pos = mlacore.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    mlacore.page_indices_from_block_table(block_table, cu, kv_indices)
    return mlacore.slot_mapping(bi, pos, kv_indices, kv_indptr, page_size)


def _decode_step_inputs(device):
    page_size = 4
    seq_lens = torch.tensor([5, 9, 1], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 2, 5, 6], dtype=torch.int32, device=device)
    block_table = torch.tensor([[7, 3, 0, 0], [1, 8, 2, 0], [6, 0, 0, 0]], dtype=torch.int32, device=device)
    append_indptr = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device=device)
    kv_indices = torch.full((6,), -1, dtype=torch.int32, device=device)
    return append_indptr, seq_lens, kv_indices, cu, page_size, 4, block_table.t().contiguous().t(), cu


def test_composed_step_on_cpu():
    args = _decode_step_inputs("cpu")
    slots = _appended_slots(*args)
    # request 0 pos 4 -> page 3 off 0; request 1 pos 7, 8 -> pages 8, 2; request 2 pos 0 -> page 6
    assert slots.tolist() == [12, 35, 8, 24]


def test_torch_compile_fullgraph_on_cpu():
    buf = torch.randn(10, 4, 576)
    ckv, kpe = torch.split(buf, [512, 64], -1)

    def step(append_indptr, seq_lens, kv_indices, kv_indptr, page_size, nnz, block_table, cu, ckv, kpe):
        slots = _appended_slots(append_indptr, seq_lens, kv_indices, kv_indptr, page_size, nnz, block_table, cu)
        view = mlacore.combined_kv_view(ckv, kpe)
        flat = view.reshape(-1, 576)
        return flat.index_select(0, slots.clamp(min=0)).sum(-1), slots

    args = _decode_step_inputs("cpu")
    eager_rows, eager_slots = step(*args, ckv, kpe)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = _decode_step_inputs("cpu")
    rows, slots = compiled(*args, ckv, kpe)
    assert torch.equal(slots, eager_slots) and torch.equal(rows, eager_rows)


def test_custom_ops_pass_opcheck():
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
    torch.library.opcheck(torch.ops.mlacore.slot_mapping.default, (i32(0, 1), i32(3, 0), i32(4, 5), i32(0, 1, 2), 4, None))
    torch.library.opcheck(torch.ops.mlacore.page_indices_from_block_table.default,
                          (i32(1, 2, 3, 4).view(2, 2), i32(0, 2, 3), torch.zeros(3, dtype=torch.int32)))
    torch.library.opcheck(torch.ops.mlacore.get_batch_indices_positions.default, (i32(0, 2, 3), i32(4, 1), 3))


# --- GPU: bitwise equal to the CPU path --------------------------------------

def _random_case(seed, nnz=5000, batch=64, max_pages=40, page_size=16, num_pages=3000):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_pages, (batch,), generator=g)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
    kv_indices = torch.randint(-2, num_pages + 2, (int(kv_indptr[-1]),), generator=g, dtype=torch.int32)
    bi = torch.randint(-1, batch + 1, (nnz,), generator=g, dtype=torch.int32)
    pos = torch.randint(-1, max_pages * page_size + 2, (nnz,), generator=g, dtype=torch.int32)
    return bi, pos, kv_indices, kv_indptr


@requires_cuda
@pytest.mark.parametrize("tok_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_gpu_slot_mapping_bitwise(tok_dtype, idx_dtype):
    bi, pos, idx, ptr = _random_case(1)
    bi, pos, idx, ptr = bi.to(tok_dtype), pos.to(tok_dtype), idx.to(idx_dtype), ptr.to(idx_dtype)
    for page_size, num_pages in [(16, None), (16, 3000), (1, 100), (7, None)]:
        cpu = mlacore.slot_mapping(bi, pos, idx, ptr, page_size, num_pages)
        gpu = mlacore.slot_mapping(bi.cuda()[:], pos.cuda(), idx.cuda(), ptr.cuda(), page_size, num_pages)
        assert torch.equal(gpu.cpu(), cpu)
    # strided device views
    wide = torch.stack([bi, bi], 1).cuda()[:, 1]
    assert torch.equal(mlacore.slot_mapping(wide, pos.cuda(), idx.cuda(), ptr.cuda(), 16).cpu(),
                       mlacore.slot_mapping(bi, pos, idx, ptr, 16))


@requires_cuda
def test_gpu_block_table_and_batch_positions_bitwise():
    g = torch.Generator().manual_seed(2)
    rows, cols = 300, 70
    base = torch.randint(0, 10**6, (cols, rows), generator=g, dtype=torch.int32)
    table = base.t()  # transposed view: column stride 1 is not the row stride
    counts = torch.randint(0, cols + 5, (rows,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
    out_len = int(cu[-1]) - 10
    cpu = mlacore.page_indices_from_block_table(table, cu, torch.full((out_len,), -3, dtype=torch.int32))
    gpu = mlacore.page_indices_from_block_table(table.cuda(), cu.cuda(),
                                                torch.full((out_len,), -3, dtype=torch.int32, device="cuda"))
    assert torch.equal(gpu.cpu(), cpu)
    seq = torch.randint(0, 5000, (rows,), generator=g, dtype=torch.int32) + counts.to(torch.int32)
    for nnz in (0, int(cu[-1]), int(cu[-1]) + 17):
        c_bi, c_pos = mlacore.get_batch_indices_positions(cu, seq, nnz)
        g_bi, g_pos = mlacore.get_batch_indices_positions(cu.cuda(), seq.cuda(), nnz)
        assert torch.equal(g_bi.cpu(), c_bi) and torch.equal(g_pos.cpu(), c_pos)


@requires_cuda
def test_gpu_cuda_graph_capture_and_replay():
    rows, cols, page_size = 8, 16, 16
    table = torch.zeros(rows, cols, dtype=torch.int32, device="cuda")
    cu = torch.zeros(rows + 1, dtype=torch.int32, device="cuda")
    kv_indices = torch.full((rows * cols,), -1, dtype=torch.int32, device="cuda")
    bi = torch.zeros(64, dtype=torch.int32, device="cuda")
    pos = torch.zeros(64, dtype=torch.int32, device="cuda")
    slots = torch.empty(64, dtype=torch.int64, device="cuda")

    def body():
        mlacore.page_indices_from_block_table(table, cu, kv_indices)
        slots.copy_(mlacore.slot_mapping(bi, pos, kv_indices, cu, page_size))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        c_table = torch.randint(0, 500, (rows, cols), generator=g, dtype=torch.int32)
        counts = torch.randint(0, cols + 1, (rows,), generator=g)
        c_cu = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
        c_bi = torch.randint(-1, rows + 1, (64,), generator=g, dtype=torch.int32)
        c_pos = torch.randint(0, cols * page_size, (64,), generator=g, dtype=torch.int32)
        for dst, src in [(table, c_table), (cu, c_cu), (bi, c_bi), (pos, c_pos)]:
            dst.copy_(src)
        kv_indices.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        c_idx = mlacore.page_indices_from_block_table(c_table, c_cu, torch.full((rows * cols,), -1, dtype=torch.int32))
        assert torch.equal(kv_indices.cpu(), c_idx)
        assert torch.equal(slots.cpu(), mlacore.slot_mapping(c_bi, c_pos, c_idx, c_cu, page_size))


@requires_cuda
def test_gpu_runs_on_the_current_side_stream():
    bi, pos, idx, ptr = (t.cuda() for t in _random_case(4, nnz=1 << 18))
    expected = mlacore.slot_mapping(*(t.cpu() for t in (bi, pos, idx, ptr)), 16)
    staged = torch.full_like(bi, 10**6)  # invalid batch indices until the side stream fills them
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        staged.copy_(bi)
        # On `side` the kernel waits for the copy; on any other stream it
        # would read the placeholder and map every token to -1.
        out = mlacore.slot_mapping(staged, pos, idx, ptr, 16)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expected)
