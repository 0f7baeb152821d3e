"""MLA decode (BatchMLAPagedAttentionWrapper) against a float64 torch reference.

The CPU path runs the planned schedule exactly as the GPU does (work items,
fp32 partials, LSE combine), so these tests check the schedule too. GPU tests
run the tensor-core kernel and the portable kernel at small and benchmark shapes.
"""

import math

import pytest
import torch

import mlacore
from mlacore import _mla_decode, _mlacore

from _schedule import host_schedule
from conftest import UNDER_SANITIZER, kernels_in_fresh_process, requires_cuda

LOG2E = 1.0 / math.log(2.0)


# --- inputs and the reference ---------------------------------------------

def make_batch(kv_lens, qo_lens, page_size, heads, dtype, device, *, separate=False, extra_pages=3, seed=0,
               scramble=True):
    """Random q, a paged cache with shuffled pages, and FlashInfer-style index tensors."""
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_per) + extra_pages
    perm = torch.randperm(num_pages, generator=g) if scramble else torch.arange(num_pages)
    kv_indices = perm[: sum(pages_per)].to(torch.int32)
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages_per).cumsum(0).tolist()), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0).tolist()), dtype=torch.int32)
    kv_len = torch.tensor(kv_lens, dtype=torch.int32)
    total_q = int(qo_indptr[-1])
    q_nope = torch.randn(total_q, heads, 512, generator=g).to(dtype)
    q_pe = torch.randn(total_q, heads, 64, generator=g).to(dtype)
    buf = (torch.randn(num_pages, page_size, 576, generator=g) * 0.5).to(dtype)
    if separate:
        ckv, kpe = buf[..., :512].contiguous(), buf[..., 512:].contiguous()
    else:
        ckv, kpe = torch.split(buf, [512, 64], dim=-1)
    to = lambda t: t.to(device)
    return dict(q_nope=to(q_nope), q_pe=to(q_pe), ckv=to(ckv), kpe=to(kpe), qo_indptr=to(qo_indptr),
                kv_indptr=to(kv_indptr), kv_indices=to(kv_indices), kv_len=to(kv_len), page_size=page_size,
                heads=heads, dtype=dtype)


def reference(d, sm_scale, causal):
    """float64 attention over the gathered pages; masked tokens (bad page ids) excluded."""
    qn, qp = d["q_nope"].double().cpu(), d["q_pe"].double().cpu()
    ckv, kpe = d["ckv"].double().cpu(), d["kpe"].double().cpu()
    qo, kvp, idx, lens = (d[k].cpu().long() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len"))
    P, S = ckv.shape[0], ckv.shape[1]
    total_q, H = qn.shape[0], qn.shape[1]
    out = torch.zeros(total_q, H, 512, dtype=torch.float64)
    lse = torch.full((total_q, H), -math.inf, dtype=torch.float64)
    for b in range(len(lens)):
        L, q0, q1 = int(lens[b]), int(qo[b]), int(qo[b + 1])
        if L <= 0 or q1 <= q0:
            continue
        pages = idx[kvp[b]: kvp[b + 1]]
        pos = torch.arange(L)
        page = pages[pos // S]
        valid = (page >= 0) & (page < P)
        page = page.clamp(0, P - 1)
        kc = ckv[page, pos % S]
        kp = kpe[page, pos % S]
        for t in range(q1 - q0):
            s = (qn[q0 + t] @ kc.T + qp[q0 + t] @ kp.T) * sm_scale  # [H, L]
            mask = valid.clone()
            if causal:
                mask &= pos < L - (q1 - q0) + t + 1
            s = s.masked_fill(~mask, -math.inf)
            if not mask.any():
                continue
            lse[q0 + t] = torch.logsumexp(s, dim=-1) * LOG2E
            out[q0 + t] = torch.softmax(s, dim=-1) @ kc
    return out, lse


def run_wrapper(d, *, causal=True, sm_scale=None, backend="auto", return_lse=True, workspace_mb=64, out=None,
                lse=None):
    dev = d["q_nope"].device
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(192)
    ws = torch.empty(workspace_mb << 20, dtype=torch.uint8, device=dev)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], d["heads"], 512, 64, d["page_size"],
           causal, sm_scale, d["dtype"], d["dtype"])
    res = w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], out=out, lse=lse, return_lse=return_lse)
    return res, sm_scale


def run_forced_chunk(d, chunk, sm_scale, causal, *, portable=False):
    """The decode op on a host schedule that splits every request into `chunk`-token items (no plan);
    returns (out, lse)."""
    dev = d["q_nope"].device
    heads, page_size = d["heads"], d["page_size"]
    md, mb, mw, mq = host_schedule(d["qo_indptr"].cpu(), d["kv_len"].cpu(), page_size, heads, chunk_tokens=chunk)
    ws = torch.empty(_mla_decode._capacity_bytes(mb, mw, mq, heads), dtype=torch.uint8, device=dev)
    out = torch.empty_like(d["q_nope"])
    lse = torch.empty(d["q_nope"].shape[:2], dtype=torch.float32, device=dev)
    _mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"], d["qo_indptr"],
                        d["kv_len"], md.to(dev), ws, out, lse, mb, mw, mq, mw, page_size, sm_scale, causal, portable)
    return out, lse


def check(d, out, lse, sm_scale, causal, *, atol=1.5e-2, lse_atol=2e-3, what=""):
    ref_o, ref_lse = reference(d, sm_scale, causal)
    got = out.double().cpu()
    err = (got - ref_o).abs().max().item() if got.numel() else 0.0
    tol = atol + 1e-2 * ref_o.abs().max().item()
    assert err <= tol, f"{what}: max |out - ref| = {err:.3e} > {tol:.3e}"
    if lse is not None:
        gl = lse.double().cpu()
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(gl), fin), f"{what}: LSE finiteness differs: {gl[~fin]} vs -inf"
        assert (gl[~fin] == -math.inf).all(), f"{what}: LSE of a request without KV must be -inf"
        if fin.any():
            lerr = (gl[fin] - ref_lse[fin]).abs().max().item()
            assert lerr <= lse_atol, f"{what}: max |lse - ref| = {lerr:.3e} > {lse_atol}"
    return err


# --- CPU -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads,qo", [(1, 1), (16, 1), (16, 3), (128, 1), (4, 4)])
def test_cpu_matches_reference(dtype, page_size, heads, qo):
    kv_lens = [70, 1, 200] if heads < 128 else [70, 130]
    d = make_batch(kv_lens, [qo] * len(kv_lens), page_size, heads, dtype, "cpu", seed=heads * 7 + qo)
    (out, lse), scale = run_wrapper(d, causal=qo > 1)
    check(d, out, lse, scale, qo > 1, what=f"h={heads} qo={qo} page={page_size} {dtype}")


def test_cpu_ragged_batch_empty_requests_and_padding():
    # Empty requests (kv 0), a padding entry (qo 0, kv 0) and mixed MTP lengths.
    kv_lens = [0, 5, 130, 0, 64, 257, 0]
    qo_lens = [1, 2, 1, 3, 4, 1, 0]
    d = make_batch(kv_lens, qo_lens, 16, 8, torch.bfloat16, "cpu", seed=3)
    (out, lse), scale = run_wrapper(d, causal=True)
    check(d, out, lse, scale, True, what="ragged")
    q = d["qo_indptr"]
    for b in (0, 3):
        rows = slice(int(q[b]), int(q[b + 1]))
        assert torch.equal(out[rows], torch.zeros_like(out[rows])), f"request {b} without KV must give zeros"
        assert (lse[rows] == -math.inf).all()


def test_cpu_non_causal_mtp():
    d = make_batch([40, 100], [3, 2], 16, 4, torch.bfloat16, "cpu", seed=5)
    (out, lse), scale = run_wrapper(d, causal=False)
    check(d, out, lse, scale, False, what="non-causal")
    # Causal differs from non-causal for MTP rows, so the flag is really applied.
    (out_c, _), _ = run_wrapper(d, causal=True)
    assert not torch.equal(out, out_c)


@pytest.mark.parametrize("page_size", [1, 16])
def test_cpu_adjacent_and_separate_caches_are_bitwise_equal(page_size):
    a = make_batch([90, 33], [1, 2], page_size, 16, torch.bfloat16, "cpu", seed=11)
    b = dict(a)
    b["ckv"], b["kpe"] = a["ckv"].contiguous(), a["kpe"].contiguous()
    assert b["ckv"].data_ptr() != a["ckv"].data_ptr()
    (oa, la), _ = run_wrapper(a)
    (ob, lb), _ = run_wrapper(b)
    assert torch.equal(oa, ob) and torch.equal(la, lb)


def forced_schedule_decode(d, chunk_tokens, causal=True, sm_scale=0.1, max_qo_len=None, extra_work=0):
    md, max_batch, max_work, max_qo = host_schedule(
        d["qo_indptr"].cpu(), d["kv_len"].cpu(), d["page_size"], d["heads"], chunk_tokens=chunk_tokens)
    if extra_work:
        # Same schedule with spare padding items: capacity larger than the use.
        md, max_batch, max_work, max_qo = host_schedule(
            d["qo_indptr"].cpu(), d["kv_len"].cpu(), d["page_size"], d["heads"], chunk_tokens=chunk_tokens,
            max_work=max_work + extra_work)
    max_qo = max_qo_len or max_qo
    dev = d["q_nope"].device
    ws = torch.empty(_mla_decode._capacity_bytes(max_batch, max_work, max_qo, d["heads"]), dtype=torch.uint8, device=dev)
    out = torch.empty_like(d["q_nope"])
    lse = torch.empty(d["q_nope"].shape[:2], dtype=torch.float32, device=dev)
    _mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"],
                        d["qo_indptr"], d["kv_len"], md.to(dev), ws, out, lse, max_batch, max_work, max_qo, max_work,
                        d["page_size"], sm_scale, causal)
    return out, lse, md


@pytest.mark.parametrize("chunk", [64, 128, 4096])
def test_cpu_forced_splits_merge_by_lse(chunk):
    d = make_batch([300, 64, 65, 0, 129], [1, 2, 1, 1, 3], 16, 4, torch.float16, "cpu", seed=13)
    out, lse, md = forced_schedule_decode(d, chunk, extra_work=2)
    if chunk == 64:
        assert md[1] > 0, "chunk 64 must split the 300-token request into partials"
    check(d, out, lse, 0.1, True, what=f"chunk={chunk}")


def test_cpu_bad_page_ids_are_masked():
    d = make_batch([40, 40], [1, 1], 8, 2, torch.bfloat16, "cpu", seed=17)
    P = d["ckv"].shape[0]
    idx = d["kv_indices"].clone()
    idx[1] = -5       # request 0, tokens 8..15
    idx[5 + 2] = P + 1000  # request 1, tokens 16..23
    d["kv_indices"] = idx
    out, lse, _ = forced_schedule_decode(d, 64)
    check(d, out, lse, 0.1, True, what="bad page ids")
    # Every page of a request bad: zeros and -inf LSE, no read anywhere.
    idx2 = idx.clone()
    idx2[5:10] = 1 << 30
    d["kv_indices"] = idx2
    out, lse, _ = forced_schedule_decode(d, 64)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and (lse[1] == -math.inf).all()


def test_cpu_int64_indices_give_identical_results():
    d = make_batch([77, 12], [2, 1], 16, 4, torch.bfloat16, "cpu", seed=19)
    (o32, l32), _ = run_wrapper(d)
    d64 = dict(d, **{k: d[k].long() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len")})
    (o64, l64), _ = run_wrapper(d64)
    assert torch.equal(o32, o64) and torch.equal(l32, l64)


def test_cpu_out_and_lse_given_are_written_in_place():
    d = make_batch([50, 9], [1, 1], 1, 16, torch.bfloat16, "cpu", seed=23)
    out = torch.full_like(d["q_nope"], 7.0)
    lse = torch.full(d["q_nope"].shape[:2], 7.0)
    (o, l), scale = run_wrapper(d, out=out, lse=lse)
    assert o is out and l is lse
    check(d, out, lse, scale, True, what="out= lse=")
    # lse given without return_lse is still written; the return is the output alone.
    lse2 = torch.zeros_like(lse)
    o2, _ = run_wrapper(d, lse=lse2, return_lse=False)
    assert isinstance(o2, torch.Tensor) and torch.equal(lse2, lse)


def test_cpu_strided_q_and_out():
    d = make_batch([60], [2], 16, 4, torch.bfloat16, "cpu", seed=29)
    big = torch.randn(2, 4, 1024).to(torch.bfloat16)
    big[..., :512] = d["q_nope"]
    d["q_nope"] = big[..., :512]  # row stride 1024
    out_big = torch.zeros(2, 8, 512, dtype=torch.bfloat16)
    out = out_big[:, ::2]  # head stride 1024
    (o, l), scale = run_wrapper(d, out=out)
    check(d, o, l, scale, True, what="strided")
    assert torch.equal(out_big[:, 1::2], torch.zeros_like(out_big[:, 1::2]))


def test_cpu_torch_compile_traces_run():
    d = make_batch([33, 70], [1, 1], 16, 16, torch.bfloat16, "cpu", seed=31)
    ws = torch.empty(8 << 20, dtype=torch.uint8)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True, 0.1,
           torch.bfloat16, torch.bfloat16)

    def f(qn, qp, ckv, kpe):
        return w.run(qn, qp, ckv, kpe, return_lse=True)

    eager = f(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"])
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"])
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_validation_errors_name_the_argument():
    d = make_batch([20], [1], 16, 4, torch.bfloat16, "cpu")
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    args = (d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"])
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"])
    with pytest.raises(ValueError, match="head_dim_ckv"):
        w.plan(*args, 4, 256, 64, 16, True, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="num_heads"):
        w.plan(*args, 129, 512, 64, 16, True, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="must match"):
        w.plan(*args, 4, 512, 64, 16, True, 0.1, torch.bfloat16, torch.float16)
    with pytest.raises(ValueError, match="kv_len_arr"):
        w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"][:0], 4, 512, 64, 16, True, 0.1,
               torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="backend"):
        mlacore.BatchMLAPagedAttentionWrapper(ws, backend="cutlass")

    w.plan(*args, 4, 512, 64, 16, True, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="q_pe"):
        w.run(d["q_nope"], d["q_pe"].half(), d["ckv"], d["kpe"])
    with pytest.raises(ValueError, match="ckv_cache.*page_size"):
        w.run(d["q_nope"], d["q_pe"], d["ckv"][:, :8], d["kpe"])
    with pytest.raises(ValueError, match="kpe_cache"):
        w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"][:-1])
    with pytest.raises(ValueError, match="q_nope.*heads"):
        w.run(d["q_nope"][:, :0], d["q_pe"][:, :0], d["ckv"], d["kpe"])
    with pytest.raises(ValueError, match="out"):
        w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], out=torch.empty(2, 4, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="lse"):
        w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], lse=torch.empty(1, 4, dtype=torch.float64), return_lse=True)
    with pytest.raises(TypeError, match="q_nope"):
        w.run(None, d["q_pe"], d["ckv"], d["kpe"])


def test_workspace_too_small_says_how_many_bytes():
    d = make_batch([300, 300], [2, 2], 16, 16, torch.bfloat16, "cpu")
    md, mb, mw, mq = host_schedule(d["qo_indptr"], d["kv_len"], 16, 16, chunk_tokens=64)
    need = _mla_decode._capacity_bytes(mb, mw, mq, 16)
    assert need == mw * mq * 16 * 513 * 4
    ws = torch.empty(need - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=f"at least {need} bytes"):
        _mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"],
                            d["qo_indptr"], d["kv_len"], md, ws, torch.empty_like(d["q_nope"]), None, mb, mw, mq, mw,
                            16, 0.1, True)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("ws_bytes", [16, 16 * 2 * 513 * 4 * 2, 16 * 2 * 513 * 4 * 3 + 100])
def test_cpu_any_workspace_runs_with_the_splits_it_holds(ws_bytes, graph):
    # The plan caps the partials to what the workspace holds (none below two), instead of raising.
    d = make_batch([3000, 2500, 40], [2, 2, 1], 16, 16, torch.bfloat16, "cpu", seed=5)
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(ws_bytes, dtype=torch.uint8), use_cuda_graph=graph)
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True, 0.1,
           torch.bfloat16, torch.bfloat16)
    info = w._plan.info
    assert info.num_partials <= ws_bytes // (2 * 16 * 513 * 4)
    assert w._capacity[3] * 2 * 16 * 513 * 4 <= ws_bytes
    out, lse = w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True)
    check(d, out, lse, 0.1, True, what=f"workspace {ws_bytes} B")


def test_workspace_bytes_sizes_an_uncapped_schedule():
    need = mlacore.workspace_bytes(16, 8, 2, num_sms=4)
    assert need == (8 + 4) * 2 * 16 * 513 * 4  # default_max_work partials of 2 x 16 rows
    assert mlacore.workspace_bytes(128, 512, 4, num_sms=132) > 128 << 20  # 128 MiB is capped there, and runs
    with pytest.raises(ValueError, match="num_heads"):
        mlacore.workspace_bytes(0, 8)
    d = make_batch([5000], [1], 64, 16, torch.bfloat16, "cpu", seed=9)
    ws = torch.empty(mlacore.workspace_bytes(16, 1, 1), dtype=torch.uint8)
    capped = mlacore.BatchMLAPagedAttentionWrapper(ws)
    capped.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 64, False, 0.1,
                torch.bfloat16, torch.bfloat16)
    plan = mlacore.MlaPlan("cpu", max_batch=1)
    plan.build(d["qo_indptr"], d["kv_indptr"], d["kv_len"], 64, 16)
    assert capped._plan.info == plan.info  # that size never caps


def test_schedule_of_wrong_size_is_rejected():
    d = make_batch([20], [1], 16, 4, torch.bfloat16, "cpu")
    md, mb, mw, mq = host_schedule(d["qo_indptr"], d["kv_len"], 16, 4)
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="schedule"):
        _mlacore.mla_decode(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], d["kv_indices"], d["kv_indptr"],
                            d["qo_indptr"], d["kv_len"], md[:-4], ws, torch.empty_like(d["q_nope"]), None, mb, mw,
                            mq, mw, 16, 0.1, True)


# --- FlashInfer's argument forms ------------------------------------------------

def test_cpu_batch_from_qo_indptr_and_longer_index_inputs():
    # FlashInfer reads the first batch+1 entries of kv_indptr and batch of kv_len_arr.
    d = make_batch([70, 300, 5], [1, 2, 1], 16, 16, torch.bfloat16, "cpu", seed=21)
    (ref_o, ref_l), _ = run_wrapper(d, sm_scale=0.1)
    long = dict(d, kv_indptr=torch.cat([d["kv_indptr"], torch.tensor([99, -5], dtype=torch.int32)]),
                kv_len=torch.cat([d["kv_len"], torch.tensor([7, -1], dtype=torch.int32)]),
                kv_indices=torch.cat([d["kv_indices"], torch.full((50,), 10 ** 6, dtype=torch.int32)]))
    (o, l), _ = run_wrapper(long, sm_scale=0.1)
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"kv_indptr: expected at least batch\+1=4"):
        w.plan(d["qo_indptr"], d["kv_indptr"][:3], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True, 0.1,
               torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_len_arr: expected at least batch=3"):
        w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"][:2], 16, 512, 64, 16, True, 0.1,
               torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("backend", ["fa2", "fa3", "native", "auto"])
def test_cpu_flashinfer_backend_names_run_the_native_kernel(backend):
    d = make_batch([70, 130], [1, 1], 16, 16, torch.bfloat16, "cpu", seed=3)
    (o, l), scale = run_wrapper(d, backend=backend)
    (o_n, l_n), _ = run_wrapper(d, backend="native")
    assert torch.equal(o, o_n) and torch.equal(l, l_n)


def test_cutlass_backend_says_what_to_pass_instead():
    with pytest.raises(ValueError, match="no CUTLASS path.*'fa2'"):
        mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), backend="cutlass")
    with pytest.raises(ValueError, match="backend: expected one of"):
        mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), backend="fa4")


def test_cpu_lse_base_on_e_and_lse_mode():
    d = make_batch([70, 0, 200], [1, 1, 2], 16, 16, torch.bfloat16, "cpu", seed=4)
    ws = torch.empty(8 << 20, dtype=torch.uint8)
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    args = (d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True, 0.1,
            torch.bfloat16, torch.bfloat16)
    w.plan(*args)
    o2, l2 = w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True)
    oe, le = w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True, return_lse_base_on_e=True)
    assert torch.equal(o2, oe)
    fin = torch.isfinite(l2)
    assert torch.equal(fin, torch.isfinite(le)) and (le[~fin] == -math.inf).all()
    torch.testing.assert_close(le[fin], l2[fin] * math.log(2.0))
    check(d, oe, le / math.log(2.0), 0.1, True, what="base e")
    # lse given without return_lse is still written (FlashInfer does), in the base asked for.
    lse = torch.zeros_like(l2)
    w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], lse=lse, return_lse_base_on_e=True)
    assert torch.equal(lse, le)
    for mode, want in (("base2", l2), ("none", l2), ("basee", le)):
        w.plan(*args, lse_mode=mode)
        assert torch.equal(w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True)[1], want), mode
    with pytest.raises(ValueError, match="lse_mode"):
        w.plan(*args, lse_mode="base10")
    assert w._sm_scale == 0.1 and w._float_workspace_buffer is ws  # FlashInfer attributes engines read


def test_module_paths_and_seq_lens():
    import mlacore.mla
    import mlacore.page

    assert mlacore.mla.BatchMLAPagedAttentionWrapper is mlacore.BatchMLAPagedAttentionWrapper
    for name in ("append_paged_kv_cache", "append_paged_mla_kv_cache", "get_batch_indices_positions",
                 "get_seq_lens"):
        assert getattr(mlacore.page, name) is getattr(mlacore, name)
    kv_indptr = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32)
    last = torch.tensor([5, 0, 16, 1], dtype=torch.int32)
    assert mlacore.get_seq_lens(kv_indptr, last, 16).tolist() == [37, 0, 16, 65]
    with pytest.raises(ValueError, match="kv_indptr: expected batch\\+1=5"):
        mlacore.get_seq_lens(kv_indptr[:4], last, 16)
    with pytest.raises(TypeError, match="kv_last_page_len"):
        mlacore.get_seq_lens(kv_indptr, [1, 2, 3, 4], 16)


def test_batch_indices_positions_into_given_buffers():
    indptr = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    seq = torch.tensor([4, 3, 10], dtype=torch.int32)
    want_b, want_p = mlacore.get_batch_indices_positions(indptr, seq, 6)
    bi = torch.full((8,), 77, dtype=torch.int32)
    pos = torch.full((8,), 77, dtype=torch.int32)
    got_b, got_p = mlacore.get_batch_indices_positions(indptr, seq, 6, batch_indices=bi, positions=pos)
    assert got_b is bi and got_p is pos
    assert torch.equal(bi[:6], want_b) and torch.equal(pos[:6], want_p)
    assert bi[6:].tolist() == [77, 77] and want_p.tolist() == [2, 3, 0, 1, 2, 9]
    with pytest.raises(ValueError, match="positions: expected a 1-D int32 tensor of at least nnz=6"):
        mlacore.get_batch_indices_positions(indptr, seq, 6, batch_indices=bi, positions=pos[:5])
    with pytest.raises(ValueError, match="batch_indices"):
        mlacore.get_batch_indices_positions(indptr, seq, 6, batch_indices=bi.long())


# --- CUDA-graph contract ----------------------------------------------------------

def _grow(seed, batch, heads, page_size, qo, device, max_kv=900):
    """A batch of `batch` requests of random lengths over one shared cache of 400 pages of page_size."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_kv, (batch,), generator=g).tolist()
    return make_batch(lens, [qo] * batch, page_size, heads, torch.bfloat16, device, seed=seed)


def test_cpu_graph_mode_runs_with_the_wrappers_buffers_not_the_latest_plans_tensors():
    heads, page = 16, 16
    bufs = dict(qo_indptr=torch.empty(9, dtype=torch.int32), kv_indptr=torch.empty(9, dtype=torch.int32),
                kv_indices=torch.empty(600, dtype=torch.int32), kv_len_arr=torch.empty(8, dtype=torch.int32))
    ptrs = {k: v.data_ptr() for k, v in bufs.items()}
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(32 << 20, dtype=torch.uint8), use_cuda_graph=True, **bufs)
    md_ptr = None
    for step, batch in enumerate([8, 3, 6, 1, 8]):
        d = _grow(step, batch, heads, page, 2, "cpu")
        w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], heads, 512, 64, page, True, 0.1,
               torch.bfloat16, torch.bfloat16)
        # The plan's inputs are copied into the constructor's buffers ...
        assert torch.equal(bufs["qo_indptr"][: batch + 1], d["qo_indptr"])
        assert torch.equal(bufs["kv_len_arr"][:batch], d["kv_len"])
        n = d["kv_indices"].numel()
        assert torch.equal(bufs["kv_indices"][:n], d["kv_indices"])
        # ... and run() reads only those: the caller's tensors may be freed or overwritten.
        truth = dict(d, **{k: d[k].clone() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len")})
        d["qo_indptr"].fill_(0)
        d["kv_indptr"].fill_(0)
        d["kv_indices"].fill_(10 ** 6)
        d["kv_len"].fill_(-1)
        launched = [t.data_ptr() for t in w._run_index]
        assert launched == [ptrs["qo_indptr"], ptrs["kv_indptr"], ptrs["kv_indices"], ptrs["kv_len_arr"]]
        md_ptr = md_ptr or w._md.data_ptr()
        assert w._md.data_ptr() == md_ptr
        out, lse = w.run(truth["q_nope"], truth["q_pe"], truth["ckv"], truth["kpe"], return_lse=True)
        check(truth, out, lse, 0.1, True, what=f"graph-mode step {step} batch {batch}")
    assert {k: v.data_ptr() for k, v in bufs.items()} == ptrs


def test_cpu_graph_mode_capacities_and_own_buffers():
    heads, page = 16, 16
    w = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(32 << 20, dtype=torch.uint8), use_cuda_graph=True)
    d = _grow(1, 4, heads, page, 1, "cpu", max_kv=300)
    args = lambda d: (d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], heads, 512, 64, page, True,
                      0.1, torch.bfloat16, torch.bfloat16)
    w.plan(*args(d))
    own = [t.data_ptr() for t in w._run_index]
    small = _grow(2, 2, heads, page, 1, "cpu", max_kv=100)
    w.plan(*args(small))
    assert [t.data_ptr() for t in w._run_index] == own
    out, lse = w.run(small["q_nope"], small["q_pe"], small["ckv"], small["kpe"], return_lse=True)
    check(small, out, lse, 0.1, True, what="own buffers, smaller batch")
    with pytest.raises(ValueError, match="qo_indptr: batch 5 exceeds the CUDA-graph capacity max_batch=4"):
        w.plan(*args(_grow(3, 5, heads, page, 1, "cpu", max_kv=50)))
    big = make_batch([300 * 16, 10, 10, 10], [1] * 4, 1, heads, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="kv_indices: .* exceed the CUDA-graph buffer"):
        w.plan(big["qo_indptr"], big["kv_indptr"], big["kv_indices"], big["kv_len"], heads, 512, 64, 1, True, 0.1,
               torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="qo_indptr: a request with 2 query tokens exceeds"):
        w.plan(*args(_grow(4, 4, heads, page, 2, "cpu", max_kv=50)))
    with pytest.raises(ValueError, match="num_heads"):
        w.plan(*args(small)[:4], 32, 512, 64, page, True, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_indptr: expected a buffer of at least max_batch\\+1=9"):
        mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), use_cuda_graph=True,
                                              qo_indptr=torch.empty(9, dtype=torch.int32),
                                              kv_indptr=torch.empty(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="share one dtype"):
        mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), use_cuda_graph=True,
                                              qo_indptr=torch.empty(9, dtype=torch.int32),
                                              kv_len_arr=torch.empty(8, dtype=torch.int64))
    with pytest.raises(TypeError, match="kv_indices"):
        mlacore.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8), use_cuda_graph=True,
                                              kv_indices=[1, 2])


@requires_cuda
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("given_buffers", [True, False])
def test_gpu_graph_captured_once_replays_after_replans_with_new_tensors(heads, page_size, given_buffers):
    """FlashInfer's CUDA-graph contract, as vLLM uses it: capture once, then every step plans with
    newly allocated index tensors (other batch sizes and lengths) and replays the ORIGINAL graph; each
    replay must equal a fresh eager run of the same step."""
    dev = "cuda"
    max_batch, qo, max_len = 24, 1 if heads == 128 else 2, 340
    num_pages = max_batch * -(-max_len // page_size) + 8
    g = torch.Generator().manual_seed(heads + page_size)
    ckv_kpe = (torch.randn(num_pages, page_size, 576, generator=g) * 0.5).to(torch.bfloat16).to(dev)
    ckv, kpe = torch.split(ckv_kpe, [512, 64], dim=-1)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    bufs = {}
    if given_buffers:
        bufs = dict(qo_indptr=torch.empty(max_batch + 1, dtype=torch.int32, device=dev),
                    kv_indptr=torch.empty(max_batch + 1, dtype=torch.int32, device=dev),
                    kv_indices=torch.empty(num_pages, dtype=torch.int32, device=dev),
                    kv_len_arr=torch.empty(max_batch, dtype=torch.int32, device=dev))
    w = mlacore.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, **bufs)
    eager = mlacore.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev))
    q_nope = torch.zeros(max_batch * qo, heads, 512, dtype=torch.bfloat16, device=dev)
    q_pe = torch.zeros(max_batch * qo, heads, 64, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q_nope)
    lse = torch.empty(max_batch * qo, heads, dtype=torch.float32, device=dev)

    def step_inputs(step, batch, full=False):
        # Fresh tensors each step, as vLLM allocates them; lengths within the shared cache. `full`:
        # every request at max_len, the largest kv_indices any step needs.
        gen = torch.Generator().manual_seed(1000 * step + batch)
        lens = torch.randint(0, max_len + 1, (batch,), generator=gen)
        lens[0] = 0 if step % 3 == 0 else int(lens[0])  # an empty request now and then
        if full:
            lens.fill_(max_len)
        pages = (lens + page_size - 1) // page_size
        kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
        kv_indptr[1:] = pages.cumsum(0)
        kv_indices = torch.randperm(num_pages, generator=gen)[: int(kv_indptr[-1])].to(torch.int32)
        # The graph always runs max_batch requests: the live batch padded with empty ones.
        pad = max_batch - batch
        qo_indptr = torch.arange(max_batch + 1, dtype=torch.int32) * qo
        kv_indptr = torch.cat([kv_indptr, kv_indptr[-1:].repeat(pad)])
        lens = torch.cat([lens, torch.zeros(pad, dtype=lens.dtype)]).to(torch.int32)
        return [t.to(dev) for t in (qo_indptr, kv_indptr, kv_indices, lens)]

    def plan(wr, idx):
        wr.plan(*idx, heads, 512, 64, page_size, qo > 1, 0.1, torch.bfloat16, torch.bfloat16)

    # Without given buffers the wrapper sizes its own at the first plan (the capacities are fixed
    # there, as the graph holds their addresses): that plan must be the largest.
    plan(w, step_inputs(0, max_batch, full=not given_buffers))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)

    for step, batch in enumerate([max_batch, 5, 17, 1, 24, 9, 12, 3]):
        idx = step_inputs(step + 1, batch)
        gen = torch.Generator(device=dev).manual_seed(step)
        q_nope.copy_(torch.randn(q_nope.shape, generator=gen, device=dev))
        q_pe.copy_(torch.randn(q_pe.shape, generator=gen, device=dev))
        plan(w, idx)
        del idx  # the caller's tensors go away; the graph must not need them
        torch.cuda.empty_cache()
        junk = torch.full((1 << 16,), -7, dtype=torch.int32, device=dev)  # may reuse their memory
        out.fill_(float("nan"))
        graph.replay()
        idx = step_inputs(step + 1, batch)  # the same step, fresh tensors, for the eager run
        plan(eager, idx)
        ref_o, ref_l = eager.run(q_nope, q_pe, ckv, kpe, return_lse=True)
        torch.cuda.synchronize()
        rows = batch * qo
        assert torch.isfinite(out[:rows]).all(), f"step {step}: non-finite output"
        torch.testing.assert_close(out[:rows], ref_o[:rows], atol=2e-2, rtol=2e-2, msg=f"step {step} batch {batch}")
        fin = torch.isfinite(ref_l[:rows])
        assert torch.equal(torch.isfinite(lse[:rows]), fin), f"step {step}: LSE finiteness"
        torch.testing.assert_close(lse[:rows][fin], ref_l[:rows][fin], atol=2e-3, rtol=1e-3)
        del junk


# --- GPU -------------------------------------------------------------------

GPU_BACKENDS = ["native", "portable"]


@requires_cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads,qo", [(1, 1), (16, 1), (16, 2), (32, 1), (128, 1), (128, 2), (16, 4)])
def test_gpu_matches_reference(backend, dtype, page_size, heads, qo):
    kv_lens = [1, 63, 64, 65, 700, 0, 2000]
    d = make_batch(kv_lens, [qo] * len(kv_lens), page_size, heads, dtype, "cuda", seed=heads + qo + page_size)
    (out, lse), scale = run_wrapper(d, causal=qo > 1, backend=backend)
    torch.cuda.synchronize()
    err = check(d, out, lse, scale, qo > 1, atol=2e-2, lse_atol=2e-2,
                what=f"{backend} h={heads} qo={qo} page={page_size} {dtype}")
    print(f"{backend} h={heads} qo={qo} page={page_size} {dtype}: max err {err:.3e}")


def decode_kernel_kind(name):
    """The kind of decode kernel a profiler event names: seesaw, wgmma, mma, or other (the combine)."""
    return ("seesaw" if "seesaw" in name else "wgmma" if "wgmma" in name else
            "mma" if "mma_kernel" in name else "other")


KERNEL_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, os.environ["MLACORE_TESTS_DIR"])
from test_decode import make_batch, run_wrapper, check, decode_kernel_kind
names = set()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for heads, qo, page, dtype in [(128, 1, 1, torch.bfloat16), (128, 2, 64, torch.float16),
                                   (32, 1, 16, torch.bfloat16), (16, 4, 16, torch.bfloat16)]:
        d = make_batch([1, 63, 64, 65, 700, 0, 2000], [qo] * 7, page, heads, dtype, "cuda", seed=heads + qo)
        (out, lse), scale = run_wrapper(d, causal=qo > 1)
        torch.cuda.synchronize()
        check(d, out, lse, scale, qo > 1, atol=2e-2, lse_atol=2e-2, what=f"h={heads} qo={qo} page={page} {dtype}")
names = {e.name for e in prof.events() if "mla_decode" in e.name}
print("kernels:", " ".join(sorted(decode_kernel_kind(n) for n in names)), flush=True)
"""


@requires_cuda
@pytest.mark.parametrize("kernel", ["default", "wgmma", "mma"])
def test_gpu_64_row_tiles_by_kernel_in_a_fresh_process(kernel):
    # MLACORE_DECODE_KERNEL is read once per process. 64-row query tiles (heads >= 32, or heads x
    # qo_len > 16) run on an sm_90a build the seesaw kernel where a request has 256 rows or more (128 on
    # some devices), the batch two requests or more and pages hold 64-token multiples (here heads=128
    # qo=2 page=64), the wgmma kernel otherwise, and every one of them with MLACORE_DECODE_KERNEL=wgmma;
    # the mma.sync kernel's 64-row configuration elsewhere (A100) or with MLACORE_DECODE_KERNEL=mma. A fresh
    # interpreter checks each configuration against the reference, and the profiler names the kernels
    # that ran.
    ran = kernels_in_fresh_process(KERNEL_SCRIPT, "MLACORE_DECODE_KERNEL", None if kernel == "default" else kernel,
                                   ignore=("other",))  # "other": the combine
    # A build without sm_90a code for them fails here on purpose on H100/H200: its fast kernels are missing.
    if torch.cuda.get_device_capability() != (9, 0) or kernel == "mma":
        want = {"mma"}
    else:
        want = {"wgmma", "seesaw"} if kernel == "default" else {"wgmma"}
    assert ran == want, f"expected the {sorted(want)} kernels for 64-row tiles, the profiler saw: {sorted(ran)}"


BY_SHAPE_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, os.environ["MLACORE_TESTS_DIR"])
from test_decode import make_batch, run_wrapper, check, decode_kernel_kind
seen = []
for name, lens, qo, heads, page in [("b7h128", [700] * 7, 1, 128, 64), ("b1h128qo2", [700], 2, 128, 64),
                                    ("b2h128qo2", [700, 65], 2, 128, 64), ("b2h64qo4", [700, 65], 4, 64, 64),
                                    ("b7h16qo4", [700] * 7, 4, 16, 64), ("b2h128qo2p16", [700, 65], 2, 128, 16)]:
    d = make_batch(lens, [qo] * len(lens), page, heads, torch.bfloat16, "cuda", seed=heads + qo + len(lens))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        (out, lse), scale = run_wrapper(d, causal=qo > 1)
        torch.cuda.synchronize()
    check(d, out, lse, scale, qo > 1, atol=2e-2, lse_atol=2e-2, what=name)
    kinds = {decode_kernel_kind(e.name) for e in prof.events() if "mla_decode" in e.name} - {"other"}
    seen += [f"{name}={k}" for k in sorted(kinds)]
print("kernels:", " ".join(seen), flush=True)
"""


def dram_mbps_per_sm():
    """Peak DRAM bandwidth of GPU 0 an SM in MB/s, as the launcher computes it (mla_decode_launch.cu),
    or None where torch does not report the memory clock and bus width."""
    props = torch.cuda.get_device_properties(0)
    khz, bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return khz * bits // 4000 // props.multi_processor_count if khz and bits else None


@requires_cuda
def test_gpu_64_row_tiles_kernel_by_shape_in_a_fresh_process():
    # The default choice on sm_90a (mla_decode_launch.cu, seesaw_by_shape): the seesaw kernel where the
    # launch holds more than one request and a request's rows fill four 64-row tiles or more (heads x
    # query tokens >= 256), or two on a device of 30 GB/s of DRAM bandwidth or more an SM, at pages of
    # 64-token multiples; the wgmma kernel for the other 64-row tiles.
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the choice is between the sm_90a kernels")
    ran = kernels_in_fresh_process(BY_SHAPE_SCRIPT, "MLACORE_DECODE_KERNEL", None)
    want = {"b1h128qo2=wgmma", "b2h128qo2=seesaw", "b2h64qo4=seesaw", "b7h16qo4=wgmma", "b2h128qo2p16=wgmma"}
    mbps = dram_mbps_per_sm()
    if mbps is None:  # the two-tile case is not checked
        ran = {r for r in ran if not r.startswith("b7h128=")}
    else:
        want.add("b7h128=seesaw" if mbps >= 30000 else "b7h128=wgmma")
    assert ran == want, f"expected {sorted(want)} ({mbps} MB/s an SM), the profiler saw: {sorted(ran)}"


SEESAW_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, os.environ["MLACORE_TESTS_DIR"])
from test_decode import make_batch, run_wrapper, run_forced_chunk, check, decode_kernel_kind
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for heads, qo, page, dtype in [(128, 1, 64, torch.bfloat16), (128, 2, 64, torch.float16),
                                   (32, 1, 128, torch.bfloat16), (16, 4, 64, torch.bfloat16),
                                   (128, 1, 16, torch.bfloat16)]:
        d = make_batch([1, 63, 64, 65, 700, 0, 2000, 129], [qo] * 8, page, heads, dtype, "cuda",
                       seed=heads + qo + page)
        (out, lse), scale = run_wrapper(d, causal=qo > 1)
        torch.cuda.synchronize()
        check(d, out, lse, scale, qo > 1, atol=2e-2, lse_atol=2e-2, what=f"h={heads} qo={qo} page={page} {dtype}")
    # Split requests (partials and the combine), bad page ids, odd and even tile counts.
    for chunk in (64, 128, 192):
        d = make_batch([1000, 64, 65, 0, 129, 3, 257], [1, 2, 1, 1, 3, 1, 1], 64, 128, torch.bfloat16, "cuda",
                       seed=43 + chunk)
        idx = d["kv_indices"].clone()
        idx[3] = -1
        idx[5] = 10 ** 6
        d["kv_indices"] = idx
        out, lse = run_forced_chunk(d, chunk, 0.1, True)
        torch.cuda.synchronize()
        check(d, out, lse, 0.1, True, atol=2e-2, lse_atol=2e-2, what=f"forced chunk {chunk}, bad pages")
names = {e.name for e in prof.events() if "mla_decode" in e.name}
print("kernels:", " ".join(sorted(decode_kernel_kind(n) for n in names)), flush=True)
"""


@requires_cuda
def test_gpu_seesaw_kernel_in_a_fresh_process():
    # MLACORE_DECODE_KERNEL=seesaw (read once per process) runs 64-row tiles over pages of 64-token
    # multiples on the seesaw kernel on an sm_90a build, other page sizes on the wgmma kernel; the
    # outputs against the reference, the profiler names what ran.
    ran = kernels_in_fresh_process(SEESAW_SCRIPT, "MLACORE_DECODE_KERNEL", "seesaw", ignore=("other",))
    want = {"seesaw", "wgmma"} if torch.cuda.get_device_capability() == (9, 0) else {"mma"}
    assert ran == want, f"expected {sorted(want)}, the profiler saw: {sorted(ran)}"


@requires_cuda
@pytest.mark.parametrize("chunk", [64, 192])
@pytest.mark.parametrize("backend_portable", [False, True])
def test_gpu_forced_splits_and_bad_pages(chunk, backend_portable):
    d = make_batch([1000, 64, 65, 0, 129, 3], [1, 2, 1, 1, 3, 1], 16, 16, torch.bfloat16, "cuda", seed=41)
    idx = d["kv_indices"].clone()
    idx[3] = -1
    idx[10] = 10 ** 6
    d["kv_indices"] = idx
    out, lse = run_forced_chunk(d, chunk, 0.1, True, portable=backend_portable)
    torch.cuda.synchronize()
    err = check(d, out, lse, 0.1, True, atol=2e-2, lse_atol=2e-2, what=f"chunk={chunk} portable={backend_portable}")
    print(f"forced chunk={chunk} portable={backend_portable}: max err {err:.3e}")


@requires_cuda
@pytest.mark.parametrize("heads,page_size", [(16, 1), (16, 64), (128, 1), (32, 16)])
@pytest.mark.parametrize("chunk", [None, 64])
def test_gpu_peaked_scores_ring_and_many_partials(heads, page_size, chunk):
    """The tensor-core kernel stores P per warp slab against the warp's own row maximum and rescales it
    when read back: peaked scores (most slabs underflow to 0, the maximum jumps between tiles) check that.
    Lengths end inside a 32-token half tile and span many turns of the KV ring; chunk=64 forces up to 47
    partials per request through the combine (its unrolled loop and remainder)."""
    kv_lens = [3000, 33, 95, 1, 2049, 0, 160]
    d = make_batch(kv_lens, [1] * len(kv_lens), page_size, heads, torch.bfloat16, "cuda", seed=11 + heads)
    d["q_nope"] = d["q_nope"] * 3
    scale = 0.35
    if chunk is None:
        (out, lse), _ = run_wrapper(d, causal=False, sm_scale=scale)
    else:
        out, lse = run_forced_chunk(d, chunk, scale, False)
    torch.cuda.synchronize()
    err = check(d, out, lse, scale, False, atol=2e-2, lse_atol=2e-2,
                what=f"peaked h={heads} page={page_size} chunk={chunk}")
    print(f"peaked h={heads} page={page_size} chunk={chunk}: max err {err:.3e}")


def sign_of_scale_case(scale, heads, qo, device, page_size=16):
    # The softmax takes its row maxima after scaling: a negative scale turns the largest raw score
    # into the smallest weight, and a zero one weighs every visible token alike (tails, a masked
    # page and an empty request included). The seesaw kernel takes its maxima before scaling and
    # declines a scale that is not positive: page 64 checks that its fallback serves those.
    kv_lens = [700, 65, 0, 129, 3]
    d = make_batch(kv_lens, [qo] * len(kv_lens), page_size, heads, torch.bfloat16, device, seed=5 + heads)
    idx = d["kv_indices"].clone()
    idx[2] = -1
    d["kv_indices"] = idx
    (out, lse), _ = run_wrapper(d, causal=qo > 1, sm_scale=scale)
    check(d, out, lse, scale, qo > 1, atol=2e-2, lse_atol=2e-2, what=f"sm_scale={scale} h={heads} qo={qo} {device}")


@pytest.mark.parametrize("scale", [-0.2, 0.0])
def test_cpu_any_sign_of_sm_scale(scale):
    sign_of_scale_case(scale, 4, 2, "cpu")


@requires_cuda
@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.1])
@pytest.mark.parametrize("heads,qo", [(16, 1), (128, 1), (64, 2)])
@pytest.mark.parametrize("page_size", [16, 64])
def test_gpu_any_sign_of_sm_scale(scale, heads, qo, page_size):
    # The mma.sync kernel (16 heads) and the 64-row-tile kernels (wgmma on sm_90a; with
    # MLACORE_DECODE_KERNEL=seesaw at page 64, the seesaw for the positive scale).
    sign_of_scale_case(scale, heads, qo, "cuda", page_size)


@requires_cuda
@pytest.mark.parametrize("batch", [8, 16, 32])
@pytest.mark.parametrize("chunk", [None, 64])
def test_gpu_combine_rows_per_thread(batch, chunk):
    # At 128 heads the combine gives each thread 1, 2 or 4 rows of a request (batch 8, 16, 32) and
    # loads 8, 4 or 2 partials of each per round: ragged lengths and a forced 64-token chunk (up
    # to 40 partials a request) take every row count through several rounds and a remainder.
    kv_lens = [(37 * i * i + 11 * i) % 2600 for i in range(batch)]
    d = make_batch(kv_lens, [1] * batch, 64, 128, torch.bfloat16, "cuda", seed=batch)
    scale = 0.1
    if chunk is None:
        (out, lse), _ = run_wrapper(d, causal=False, sm_scale=scale)
    else:
        out, lse = run_forced_chunk(d, chunk, scale, False)
    torch.cuda.synchronize()
    check(d, out, lse, scale, False, atol=2e-2, lse_atol=2e-2, what=f"combine batch={batch} chunk={chunk}")


BENCH_SHAPES = [(8, 32768, 16, 1), (8, 32768, 16, 64), (32, 8192, 16, 1), (32, 8192, 16, 64),
                (32, 32768, 16, 64), (8, 4096, 128, 64), (32, 8192, 128, 1)]


@requires_cuda
@pytest.mark.parametrize("batch,kv,heads,page_size", BENCH_SHAPES)
def test_gpu_benchmark_shapes(batch, kv, heads, page_size):
    if UNDER_SANITIZER:
        # compute-sanitizer tracks every shared-memory access: up to 32 x 32768 tokens per
        # launch never finished under racecheck. The same kernels, configs and split
        # structure at 1/16 of the length (still several splits of several tiles each).
        kv //= 16
    d = make_batch([kv] * batch, [1] * batch, page_size, heads, torch.bfloat16, "cuda", seed=batch + heads)
    (out, lse), scale = run_wrapper(d, causal=False, workspace_mb=256)
    torch.cuda.synchronize()
    # Reference on the GPU in float64, two requests (first and last) to keep it affordable.
    for b in (0, batch - 1):
        sub = slice_request(d, b)
        ref_o, ref_lse = reference_gpu(sub, scale)
        err = (out[b].double() - ref_o).abs().max().item()
        lerr = (lse[b].double() - ref_lse).abs().max().item()
        print(f"b={batch} kv={kv} h={heads} page={page_size} request {b}: max err {err:.3e}, lse err {lerr:.3e}")
        assert err < 2e-2 and lerr < 2e-2, f"request {b}: out err {err:.3e}, lse err {lerr:.3e}"


def slice_request(d, b):
    kvp = d["kv_indptr"].cpu()
    return dict(q_nope=d["q_nope"][b], q_pe=d["q_pe"][b], ckv=d["ckv"], kpe=d["kpe"],
                pages=d["kv_indices"][int(kvp[b]): int(kvp[b + 1])].long(), L=int(d["kv_len"][b]))


def reference_gpu(s, sm_scale):
    S = s["ckv"].shape[1]
    pos = torch.arange(s["L"], device="cuda")
    page = s["pages"][pos // S]
    kc = s["ckv"][page, pos % S].double()
    kp = s["kpe"][page, pos % S].double()
    sc = (s["q_nope"].double() @ kc.T + s["q_pe"].double() @ kp.T) * sm_scale
    return torch.softmax(sc, -1) @ kc, torch.logsumexp(sc, -1) * LOG2E


@requires_cuda
@pytest.mark.parametrize("page_size,heads", [(1, 16), (64, 16), (64, 128)])
def test_gpu_adjacent_and_separate_are_bitwise_equal(page_size, heads):
    a = make_batch([3000, 17, 640], [1, 2, 1], page_size, heads, torch.bfloat16, "cuda", seed=43)
    b = dict(a)
    b["ckv"], b["kpe"] = a["ckv"].contiguous(), a["kpe"].contiguous()
    (oa, la), _ = run_wrapper(a)
    (ob, lb), _ = run_wrapper(b)
    torch.cuda.synchronize()
    assert torch.equal(oa, ob) and torch.equal(la, lb)


@requires_cuda
def test_gpu_cuda_graph_capture_and_replay_with_new_data():
    d = make_batch([500, 2000, 31], [1, 1, 1], 64, 16, torch.bfloat16, "cuda", seed=47)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = mlacore.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True)
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 64, False, 0.1,
           torch.bfloat16, torch.bfloat16)
    qn, qp = d["q_nope"].clone(), d["q_pe"].clone()
    out = torch.empty_like(qn)
    lse = torch.empty(qn.shape[:2], dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(qn, qp, d["ckv"], d["kpe"], out=out, lse=lse)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(qn, qp, d["ckv"], d["kpe"], out=out, lse=lse)
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        qn.copy_(torch.randn(qn.shape, generator=gen, device="cuda"))
        qp.copy_(torch.randn(qp.shape, generator=gen, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        check(dict(d, q_nope=qn, q_pe=qp), out, lse, 0.1, False, atol=2e-2, lse_atol=2e-2, what=f"graph replay {seed}")

    # Replan inside the capacity (new lengths, no sync) and replay the same graph.
    new_len = torch.tensor([700, 100, 1500], dtype=torch.int32, device="cuda")
    pages = (new_len + 63) // 64
    kv_indptr = torch.zeros(4, dtype=torch.int32, device="cuda")
    kv_indptr[1:] = pages.cumsum(0)
    d2 = dict(d, kv_len=new_len, kv_indptr=kv_indptr, kv_indices=d["kv_indices"][: int(pages.sum())].clone(),
              q_nope=qn, q_pe=qp)
    w.plan(d["qo_indptr"], kv_indptr, d2["kv_indices"], new_len, 16, 512, 64, 64, False, 0.1, torch.bfloat16,
           torch.bfloat16)
    # FlashInfer's contract: the replan copied into the wrapper's buffers, so the ORIGINAL graph
    # replays the new schedule.
    g.replay()
    torch.cuda.synchronize()
    check(d2, out, lse, 0.1, False, atol=2e-2, lse_atol=2e-2, what="graph after device replan")


@requires_cuda
def test_gpu_runs_on_the_current_side_stream():
    d = make_batch([4000, 64], [1, 2], 16, 16, torch.bfloat16, "cuda", seed=53)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = mlacore.BatchMLAPagedAttentionWrapper(ws)
    w.plan(d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["kv_len"], 16, 512, 64, 16, True, 0.1,
           torch.bfloat16, torch.bfloat16)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy: a launch on another stream would finish first
        out, lse = w.run(d["q_nope"], d["q_pe"], d["ckv"], d["kpe"], return_lse=True)
    s.synchronize()
    check(d, out, lse, 0.1, True, atol=2e-2, lse_atol=2e-2, what="side stream")
