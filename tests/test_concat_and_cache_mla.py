"""concat_and_cache_mla (vLLM's semantics) against a pure-torch reference: block sizes,
dtypes, a layer view of a [layers, blocks, block_size, 576] cache, padded caches, strided
sources, skipped tokens (negative slots, slots past the cache), strict mode, validation
naming the argument, kv_cache_dtype and scale, the custom op, and on a GPU: bitwise
equality with the reference and CUDA-graph capture."""

import pytest
import torch

import mlacore

from conftest import requires_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
POISON = -3.25  # exactly representable in every dtype; no source value equals it


def rand(shape, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def reference(kv_c, k_pe, kv_cache, slot_mapping):
    """kv_cache[s // S, s % S] = cat(kv_c[i], k_pe[i]) for every slot s in range, in token order."""
    blocks, size = kv_cache.shape[0], kv_cache.shape[1]
    for i, s in enumerate(slot_mapping.tolist()):
        if 0 <= s < blocks * size:
            kv_cache[s // size, s % size] = torch.cat([kv_c[i].cpu(), k_pe[i].cpu()])


def make_cache(form, blocks, block_size, dtype, device="cpu", dims=(512, 64)):
    """(whole allocation to compare, kv_cache view)."""
    width = sum(dims)
    if form == "plain":
        buf = torch.full((blocks, block_size, width), POISON, dtype=dtype, device=device)
        return buf, buf
    if form == "layer":  # one layer of [layers, blocks, block_size, 576]
        buf = torch.full((3, blocks, block_size, width), POISON, dtype=dtype, device=device)
        return buf, buf[1]
    if form == "padded":  # token stride 640, written through the strides
        buf = torch.full((blocks, block_size, width + 64), POISON, dtype=dtype, device=device)
        return buf, buf[..., :width]
    raise AssertionError(form)


def make_sources(tokens, dtype, strided, seed, device="cpu", dims=(512, 64)):
    dc, dp = dims
    if strided:  # slices of one [T, 1024] buffer: token stride 1024
        src = rand((tokens, 1024), dtype, seed, device)
        return src[:, :dc], src[:, dc + 8: dc + 8 + dp]
    src = rand((tokens, dc + dp), dtype, seed, device)
    return src[:, :dc].contiguous(), src[:, dc:].contiguous()


def make_slots(tokens, blocks, block_size, seed, skips=(), device="cpu"):
    """Distinct slots drawn from the cache; `skips` maps token -> slot value to plant."""
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens].to(torch.int64)
    for i, v in skips:
        slots[i] = v
    return slots.to(device)


def run(form, dtype, block_size, tokens=37, blocks=None, strided=False, skips=(), device="cpu", seed=0,
        dims=(512, 64), slot_dtype=torch.int64, **kw):
    """(written, expected) whole allocations."""
    blocks = blocks if blocks is not None else (tokens + block_size - 1) // block_size + 2
    whole, cache = make_cache(form, blocks, block_size, dtype, device, dims)
    kv_c, k_pe = make_sources(tokens, dtype, strided, seed, device, dims)
    slots = make_slots(tokens, blocks, block_size, seed, skips, device).to(slot_dtype)
    expect_whole, expect_cache = make_cache(form, blocks, block_size, dtype, "cpu", dims)
    reference(kv_c, k_pe, expect_cache, slots)
    mlacore.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", None, **kw)
    return whole, expect_whole


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    assert torch.equal(a.cpu().view(ints), b.cpu().view(ints))


@pytest.mark.parametrize("form", ["plain", "layer", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_matches_reference(form, dtype, block_size):
    assert_same(*run(form, dtype, block_size))


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_strided_sources_and_slot_dtypes(strided, slot_dtype):
    assert_same(*run("layer", torch.bfloat16, 16, strided=strided, slot_dtype=slot_dtype))


def test_other_widths():
    # Dc + Dp other than 512 + 64, and a k_pe of no columns.
    assert_same(*run("plain", torch.float16, 16, dims=(256, 32)))
    assert_same(*run("padded", torch.float32, 4, dims=(12, 4)))
    assert_same(*run("plain", torch.bfloat16, 8, dims=(64, 0)))


@pytest.mark.parametrize("block_size", [1, 16])
def test_negative_and_out_of_range_slots_write_nothing(block_size):
    tokens = 20
    blocks = (tokens + block_size - 1) // block_size + 2
    past = blocks * block_size
    skips = [(0, -1), (3, -7), (5, past), (9, past + 1000), (19, -(2**40))]
    written, expect = run("plain", torch.bfloat16, block_size, tokens=tokens, blocks=blocks, skips=skips)
    assert_same(written, expect)
    # Only the 15 good tokens landed; every other slot still holds the poison.
    landed = (written != POISON).any(-1).sum().item()
    assert landed == tokens - len(skips)


def test_empty():
    whole, cache = make_cache("plain", 2, 16, torch.bfloat16)
    before = whole.clone()
    empty = torch.empty(0, 512, dtype=torch.bfloat16)
    mlacore.concat_and_cache_mla(empty, torch.empty(0, 64, dtype=torch.bfloat16), cache,
                                 torch.empty(0, dtype=torch.int64))
    assert_same(whole, before)


def test_strict_names_the_first_slot_past_the_cache_and_writes_nothing():
    whole, cache = make_cache("plain", 2, 16, torch.bfloat16)
    before = whole.clone()
    kv_c, k_pe = make_sources(5, torch.bfloat16, False, 0)
    slots = torch.tensor([0, -1, 31, 32, 40])  # -1 is a skip, not an error
    with pytest.raises(ValueError, match=r"token 3 \(slot 32\).*holds 32 slots; nothing was written"):
        mlacore.concat_and_cache_mla(kv_c, k_pe, cache, slots, strict=True)
    assert_same(whole, before)
    # Negative slots alone pass strict mode.
    mlacore.concat_and_cache_mla(kv_c[:3], k_pe[:3], cache, slots[:3], strict=True)
    expect = before.clone()
    reference(kv_c[:3], k_pe[:3], expect, slots[:3])
    assert_same(whole, expect)


def test_strict_from_environment(monkeypatch):
    _, cache = make_cache("plain", 1, 4, torch.float32)
    kv_c, k_pe = make_sources(1, torch.float32, False, 0)
    monkeypatch.setenv("MLACORE_STRICT", "1")
    with pytest.raises(ValueError, match="strict"):
        mlacore.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([4]))


def _args(tokens=4, dtype=torch.bfloat16):
    _, cache = make_cache("plain", 2, 16, dtype)
    kv_c, k_pe = make_sources(tokens, dtype, False, 0)
    return dict(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=torch.arange(tokens))


@pytest.mark.parametrize("name,bad,exc,match", [
    ("kv_c", torch.zeros(4, 512, 1, dtype=torch.bfloat16), ValueError, r"kv_c: expected 2-D"),
    ("kv_c", torch.zeros(4, 512, dtype=torch.float16), ValueError, r"kv_c: expected bfloat16"),
    ("kv_c", torch.zeros(4, 600, dtype=torch.bfloat16), ValueError, r"kv_c: expected at most 576"),
    ("kv_c", torch.zeros(512, 4, dtype=torch.bfloat16).t(), ValueError, r"kv_c: .*contiguous"),
    ("k_pe", torch.zeros(4, 32, dtype=torch.bfloat16), ValueError, r"k_pe: expected .*64"),
    ("k_pe", torch.zeros(3, 64, dtype=torch.bfloat16), ValueError, r"k_pe: expected .*4"),
    ("kv_cache", torch.zeros(2, 16, 576, 1, dtype=torch.bfloat16), ValueError, r"kv_cache: expected 3-D"),
    ("kv_cache", torch.zeros(2, 16, 576, dtype=torch.int32), ValueError, r"kv_cache: expected"),
    ("kv_cache", torch.zeros(576, 16, 2, dtype=torch.bfloat16).permute(2, 1, 0), ValueError,
     r"kv_cache: .*contiguous"),
    ("kv_cache", torch.zeros(2, 0, 576, dtype=torch.bfloat16), ValueError, r"kv_cache: expected a block size"),
    ("slot_mapping", torch.zeros(4, dtype=torch.float32), ValueError, r"slot_mapping: expected 1-D int32 or int64"),
    ("slot_mapping", torch.zeros(5, dtype=torch.int64), ValueError, r"slot_mapping: expected .*length"),
    ("slot_mapping", torch.zeros(4, 1, dtype=torch.int64), ValueError, r"slot_mapping: expected 1-D"),
    ("slot_mapping", [0, 1, 2, 3], TypeError, r"slot_mapping: expected a tensor"),
    ("kv_c", None, TypeError, r"kv_c: expected a tensor"),
])
def test_validation_names_the_argument(name, bad, exc, match):
    args = _args()
    args[name] = bad
    with pytest.raises(exc, match=match):
        mlacore.concat_and_cache_mla(**args)


def test_kv_cache_dtype_and_scale():
    args = _args()
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        with pytest.raises(ValueError, match="kv_cache_dtype: fp8 caches are not supported"):
            mlacore.concat_and_cache_mla(**args, kv_cache_dtype=fp8, scale=torch.ones(1))
    with pytest.raises(ValueError, match="kv_cache_dtype: expected 'auto'"):
        mlacore.concat_and_cache_mla(**args, kv_cache_dtype="bf16")
    with pytest.raises(TypeError, match="scale"):
        mlacore.concat_and_cache_mla(**args, scale="1.0")
    # vLLM passes a scale tensor on every call: accepted and ignored for "auto".
    before = args["kv_cache"].clone()
    mlacore.concat_and_cache_mla(**args, kv_cache_dtype="auto", scale=torch.tensor([7.0]))
    expect = before.clone()
    reference(args["kv_c"], args["k_pe"], expect, args["slot_mapping"])
    assert_same(args["kv_cache"], expect)


def test_custom_op_declares_its_mutation_and_compiles():
    schema = torch.ops.mlacore.concat_and_cache_mla.default._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == ["kv_cache"]
    eager = _args()
    compiled = _args()

    def step(kv_c, k_pe, kv_cache, slot_mapping):
        mlacore.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, "auto", None)
        return kv_cache.float().sum()

    total_eager = step(**eager)
    total_compiled = torch.compile(step, fullgraph=True)(**compiled)
    assert_same(eager["kv_cache"], compiled["kv_cache"])
    torch.testing.assert_close(total_compiled, total_eager)


# --- GPU --------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("form", ["plain", "layer", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("tokens", [1, 37, 512, 5000])
def test_gpu_bitwise_equal_to_reference(form, dtype, block_size, tokens):
    skips = [(0, -1), (tokens // 2, 10**9)] if tokens > 1 else []
    assert_same(*run(form, dtype, block_size, tokens=tokens, skips=skips, device="cuda", seed=tokens,
                     strided=tokens % 2 == 1))


@requires_cuda
@pytest.mark.parametrize("dims", [(512, 64), (256, 32), (12, 4), (3, 5)])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_gpu_narrow_and_unaligned_rows(dims, slot_dtype):
    # 32-, 8- and 16-byte, and 2-byte-aligned rows: every access width.
    for form in ("plain", "padded"):
        assert_same(*run(form, torch.bfloat16, 16, tokens=100, dims=dims, device="cuda", slot_dtype=slot_dtype))


@requires_cuda
def test_gpu_strict_raises_and_writes_nothing():
    whole, cache = make_cache("plain", 4, 16, torch.bfloat16, "cuda")
    before = whole.clone()
    kv_c, k_pe = make_sources(3, torch.bfloat16, False, 0, "cuda")
    with pytest.raises(ValueError, match=r"token 2 \(slot 64\)"):
        mlacore.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([1, -1, 64], device="cuda"), strict=True)
    assert_same(whole, before)


@requires_cuda
def test_gpu_cuda_graph_capture_and_replay_with_new_data():
    whole, cache = make_cache("layer", 8, 16, torch.bfloat16, "cuda")
    kv_c = torch.zeros(6, 512, dtype=torch.bfloat16, device="cuda")
    k_pe = torch.zeros(6, 64, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(6, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mlacore.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.ones(1, device="cuda"))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    whole.fill_(POISON)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mlacore.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", None)
    expect_whole, expect = make_cache("layer", 8, 16, torch.bfloat16)
    for seed in (1, 2):
        kv_c.copy_(rand((6, 512), torch.bfloat16, seed, "cuda"))
        k_pe.copy_(rand((6, 64), torch.bfloat16, seed + 10, "cuda"))
        slots.copy_(make_slots(6, 8, 16, seed))
        graph.replay()
        torch.cuda.synchronize()
        reference(kv_c, k_pe, expect, slots.cpu())
        assert_same(whole, expect_whole)
