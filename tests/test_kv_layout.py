"""combined_kv_view / explain_kv_layout: adjacency from metadata alone."""

import pytest
import torch

import mlacore

from conftest import requires_cuda

DC, DP = 512, 64


def split(buf):
    return torch.split(buf, [DC, DP], -1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_split_of_one_buffer_is_viewed_in_place(dtype, device):
    buf = torch.randn(5, 16, DC + DP, device=device).to(dtype)
    ckv, kpe = split(buf)
    view = mlacore.combined_kv_view(ckv, kpe)
    assert view is not None
    assert view.shape == buf.shape and view.stride() == buf.stride()
    assert view.data_ptr() == buf.data_ptr() and view.storage_offset() == buf.storage_offset()
    assert torch.equal(view, buf)
    view[2, 3, DC] = 7  # writes land in kpe: the view aliases the halves
    assert kpe[2, 3, 0].item() == 7
    assert mlacore.explain_kv_layout(ckv, kpe).startswith("adjacent")


def test_layer_slices_keep_the_parent_page_stride():
    layers = torch.randn(3, 4, 8, DC + DP, dtype=torch.bfloat16)
    for layer in range(3):
        ckv, kpe = split(layers[layer])
        view = mlacore.combined_kv_view(ckv, kpe)
        assert view is not None
        assert view.stride() == layers[layer].stride()
        assert view.storage_offset() == layers[layer].storage_offset()
        assert torch.equal(view, layers[layer])


def test_page_slices_and_page_major_pools():
    # A pool whose pages are strided further apart than their tokens (a
    # [P, 2, S, 576]-like pool) still gives a view with the parent's page stride.
    pool = torch.randn(6, 2, 8, DC + DP, dtype=torch.float16)[:, 1]
    ckv, kpe = split(pool)
    view = mlacore.combined_kv_view(ckv, kpe)
    assert view is not None and view.stride() == (2 * 8 * (DC + DP), DC + DP, 1)
    assert torch.equal(view, pool)
    ckv, kpe = split(torch.randn(6, 8, DC + DP)[2:5])
    assert torch.equal(mlacore.combined_kv_view(ckv, kpe), torch.cat([ckv, kpe], -1))


def test_page_size_one_layout():
    # SGLang / vLLM-AITER style: every token is a page.
    buf = torch.randn(33, 1, DC + DP, dtype=torch.bfloat16)
    view = mlacore.combined_kv_view(*split(buf))
    assert view is not None and torch.equal(view, buf)


def test_separate_allocations_are_not_adjacent():
    ckv = torch.zeros(4, 16, DC, dtype=torch.bfloat16)
    kpe = torch.zeros(4, 16, DP, dtype=torch.bfloat16)
    assert mlacore.combined_kv_view(ckv, kpe) is None
    text = mlacore.explain_kv_layout(ckv, kpe)
    assert text.startswith("not adjacent") and "token stride" in text
    # Halves of two different buffers have the right strides but the wrong distance.
    ckv2, _ = split(torch.zeros(4, 16, DC + DP, dtype=torch.bfloat16))
    _, kpe2 = split(torch.zeros(4, 16, DC + DP, dtype=torch.bfloat16))
    assert mlacore.combined_kv_view(ckv2, kpe2) is None
    assert "separate allocations" in mlacore.explain_kv_layout(ckv2, kpe2)


def test_pointer_adjacent_halves_in_separate_storages_are_not_viewed():
    # With one token the strides say nothing, and two allocations can sit back
    # to back; only the storage can tell. Here the memory is adjacent but kpe
    # is re-imported through DLPack, so it is a storage of its own.
    buf = torch.zeros(1, 1, DC + DP, dtype=torch.bfloat16)
    ckv = buf[..., :DC]
    kpe = torch.from_dlpack(buf[..., DC:])
    assert kpe.data_ptr() == ckv.data_ptr() + DC * 2
    assert mlacore._mlacore.combined_kv_view(ckv, kpe) is not None  # the core sees adjacency
    assert mlacore.combined_kv_view(ckv, kpe) is None
    assert "separate torch storages" in mlacore.explain_kv_layout(ckv, kpe)


def test_reversed_halves():
    buf = torch.zeros(4, 16, DC + DP, dtype=torch.bfloat16)
    kpe, ckv = torch.split(buf, [DP, DC], -1)
    assert mlacore.combined_kv_view(ckv, kpe) is None
    assert "reversed" in mlacore.explain_kv_layout(ckv, kpe)


def test_padded_rows():
    buf = torch.zeros(4, 16, 640, dtype=torch.bfloat16)
    ckv, kpe, _ = torch.split(buf, [DC, DP, 640 - DC - DP], -1)
    assert mlacore.combined_kv_view(ckv, kpe) is None
    text = mlacore.explain_kv_layout(ckv, kpe)
    assert "640" in text and "padded" in text


def test_mismatched_dtypes_and_non_contiguous_last_dim():
    buf = torch.zeros(4, 16, DC + DP, dtype=torch.float16)
    ckv, kpe = split(buf)
    assert mlacore.combined_kv_view(ckv, kpe.view(torch.bfloat16)) is None
    assert "float16 and kpe_cache bfloat16" in mlacore.explain_kv_layout(ckv, kpe.view(torch.bfloat16))
    # Every other element: same start addresses, but the last dims are strided.
    wide = torch.zeros(4, 16, 2 * (DC + DP), dtype=torch.float16)
    c2 = wide[..., 0:2 * DC:2]
    assert mlacore.combined_kv_view(c2, kpe) is None
    assert "not contiguous" in mlacore.explain_kv_layout(c2, kpe)


def test_shapes_that_are_not_caches_raise():
    four = torch.zeros(2, 4, 1, DC + DP, dtype=torch.bfloat16)
    ckv, kpe = split(four)
    with pytest.raises(ValueError, match=r"ckv_cache: expected a 3-D .*4-D"):
        mlacore.combined_kv_view(ckv, kpe)
    with pytest.raises(ValueError, match="ckv_cache: expected a 3-D"):
        mlacore.explain_kv_layout(ckv, kpe)
    buf = torch.zeros(4, 16, DC + DP)
    ckv, kpe = split(buf)
    with pytest.raises(ValueError, match="kpe_cache: expected a 3-D"):
        mlacore.combined_kv_view(ckv, kpe[0])
    with pytest.raises(ValueError, match=r"kpe_cache: expected size 4 \(num_pages of ckv_cache\) in dim 0"):
        mlacore.combined_kv_view(ckv, kpe[:3])
    with pytest.raises(ValueError, match=r"kpe_cache: expected size 16 \(page_size of ckv_cache\) in dim 1"):
        mlacore.combined_kv_view(ckv, kpe[:, :8])
    with pytest.raises(TypeError, match="kpe_cache"):
        mlacore.combined_kv_view(ckv, None)


def test_swapped_arguments_are_not_adjacent():
    ckv, kpe = split(torch.zeros(4, 16, DC + DP))
    assert mlacore.combined_kv_view(kpe, ckv) is None
    assert mlacore.explain_kv_layout(kpe, ckv).startswith("not adjacent")


def test_compiled_fullgraph_view_matches_eager():
    buf = torch.randn(4, 8, DC + DP)

    def step(ckv, kpe):
        view = mlacore.combined_kv_view(ckv, kpe)
        return view.sum(-1) if view is not None else torch.cat([ckv, kpe], -1).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    ckv, kpe = split(buf)
    torch.testing.assert_close(compiled(ckv, kpe), buf.sum(-1))
    sep_ckv, sep_kpe = ckv.contiguous(), kpe.contiguous()
    torch.testing.assert_close(compiled(sep_ckv, sep_kpe), buf.sum(-1))


@requires_cuda
def test_gpu_and_cross_device_pairs():
    buf = torch.zeros(4, 16, DC + DP, dtype=torch.bfloat16, device="cuda")
    ckv, kpe = split(buf)
    view = mlacore.combined_kv_view(ckv, kpe)
    assert view is not None and view.device == buf.device and view.data_ptr() == buf.data_ptr()
    cpu_kpe = kpe.cpu()
    assert mlacore.combined_kv_view(ckv, cpu_kpe) is None
    assert "on cuda:0 and kpe_cache on cpu" in mlacore.explain_kv_layout(ckv, cpu_kpe)
