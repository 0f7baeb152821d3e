"""Appending new tokens' KV rows into a paged cache (FlashInfer-compatible).

Token i goes to request batch_indices[i] at absolute position positions[i]:
page kv_indices[kv_indptr[b] + pos // page_size], offset pos % page_size.
The caches are written in place through their strides, so the two halves of
one [P, S, 576] buffer, a layer of [L, P, S, 576], HND and NHD caches are all
valid targets. A token whose batch index, position or page id is out of range
writes nothing. Nothing synchronizes (except strict mode) and nothing is
allocated, so both appends can be captured in a CUDA graph; they run on the
current stream.
"""

from typing import Optional

import torch

from . import _mlacore

# Bound once: the eager path is a Python call, one check and the binding.
_is_compiling = torch.compiler.is_compiling
_mla = _mlacore.append_paged_mla_kv_cache
_kv = _mlacore.append_paged_kv_cache
_concat = _mlacore.concat_and_cache_mla


@torch.library.custom_op("mlacore::append_paged_mla_kv_cache", mutates_args=("ckv_cache", "kpe_cache"))
def _mla_op(append_ckv: torch.Tensor, append_kpe: torch.Tensor, batch_indices: torch.Tensor,
            positions: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor, kv_indices: torch.Tensor,
            kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, backend: str, strict: bool) -> None:
    _mla(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr,
         kv_last_page_len, backend, strict)


@_mla_op.register_fake
def _(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr,
      kv_last_page_len, backend, strict):
    return None


@torch.library.custom_op("mlacore::append_paged_kv_cache", mutates_args=("k_cache", "v_cache"))
def _kv_op(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
           positions: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor], kv_indices: torch.Tensor,
           kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, kv_layout: str, backend: str,
           strict: bool) -> None:
    _kv(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
        kv_last_page_len, kv_layout, backend, strict)


@_kv_op.register_fake
def _(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
      kv_last_page_len, kv_layout, backend, strict):
    return None


def append_paged_mla_kv_cache(append_ckv: torch.Tensor, append_kpe: torch.Tensor, batch_indices: torch.Tensor,
                              positions: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
                              kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                              backend: str = "auto", strict: bool = False) -> None:
    """Writes append_ckv [nnz, 512] and append_kpe [nnz, 64] into ckv_cache [P, S, 512] and
    kpe_cache [P, S, 64] (any dims that match; bfloat16, float16 or float32, the
    sources' dtype equal to the caches').

    batch_indices, positions [nnz], kv_indices, kv_indptr [batch+1] and
    kv_last_page_len [batch] are int32 or int64 on the caches' device
    (kv_last_page_len is checked by shape only). Sources may be strided on dim 0.
    backend: "auto" | "native" | "aiter" (see mlacore.backends()).
    strict (or MLACORE_STRICT=1): synchronize, check every token first and raise
    ValueError naming the first one that cannot be written, writing nothing.
    """
    if _is_compiling():
        return _mla_op(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices,
                       kv_indptr, kv_last_page_len, backend, strict)
    _mla(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr,
         kv_last_page_len, backend, strict)


def _split_cache(paged_kv_cache):
    # The pair by exact type first: isinstance(x, torch.Tensor) goes through
    # torch's metaclass hook, a third of a microsecond of every call.
    if type(paged_kv_cache) not in (tuple, list):
        if isinstance(paged_kv_cache, torch.Tensor):
            return paged_kv_cache, None
        if not isinstance(paged_kv_cache, (tuple, list)):  # else a subclass, e.g. a NamedTuple pair
            raise TypeError("paged_kv_cache: expected a (k_cache, v_cache) tuple or one 5-D tensor, "
                            f"got {type(paged_kv_cache).__name__}")
    if len(paged_kv_cache) != 2:
        raise ValueError(f"paged_kv_cache: expected a (k_cache, v_cache) pair, got {len(paged_kv_cache)} items")
    return paged_kv_cache[0], paged_kv_cache[1]


def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                          positions: torch.Tensor, paged_kv_cache, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, kv_layout: str = "NHD",
                          backend: str = "auto", strict: bool = False) -> None:
    """Writes append_key and append_value [nnz, H, D] into a paged K/V cache.

    paged_kv_cache: a (k_cache, v_cache) tuple of 4-D tensors ([P, S, H, D] for
    kv_layout="NHD", [P, H, S, D] for "HND") or one 5-D tensor ([P, 2, S, H, D]
    or [P, 2, H, S, D], K at index 0). Other arguments as in
    append_paged_mla_kv_cache.
    """
    k_cache, v_cache = _split_cache(paged_kv_cache)
    if _is_compiling():
        return _kv_op(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
                      kv_last_page_len, kv_layout, backend, strict)
    _kv(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
        kv_last_page_len, kv_layout, backend, strict)


@torch.library.custom_op("mlacore::concat_and_cache_mla", mutates_args=("kv_cache",))
def _concat_op(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
               strict: bool) -> None:
    _concat(kv_c, k_pe, kv_cache, slot_mapping, strict)


@_concat_op.register_fake
def _(kv_c, k_pe, kv_cache, slot_mapping, strict):
    return None


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str = "auto", scale=None,
                         strict: bool = False) -> None:
    """vLLM's concat_and_cache_mla: writes kv_c [T, 512] and k_pe [T, 64], side by side,
    into slot slot_mapping[i] (= block * block_size + offset) of kv_cache
    [num_blocks, block_size, 576] (any Dc + Dp; float16, bfloat16 or float32, the
    sources' dtype equal to the cache's).

    kv_cache may be a strided view (one layer of [layers, blocks, block_size, 576])
    with a contiguous last dim; kv_c and k_pe any token stride, contiguous last dim.
    slot_mapping: int64 (or int32) [T] on the cache's device. A negative slot skips
    the token, as in vLLM; a slot at or past num_blocks * block_size writes nothing
    either, silently, unless strict (or MLACORE_STRICT=1): then every slot is checked
    first (one synchronization) and ValueError names the first such token, nothing
    written.
    kv_cache_dtype: "auto" only (the cache holds the sources' dtype); an fp8 value
    raises ValueError: fp8 caches are not supported. scale: vLLM passes its fp8
    scale tensor on every call; it is accepted and ignored for "auto" (a tensor or
    None).
    """
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    if kv_cache_dtype != "auto":
        if kv_cache_dtype.startswith("fp8"):
            raise ValueError(f"kv_cache_dtype: fp8 caches are not supported (got {kv_cache_dtype!r}); "
                             "expected 'auto'")
        raise ValueError(f"kv_cache_dtype: expected 'auto', got {kv_cache_dtype!r}")
    if scale is not None and not isinstance(scale, (torch.Tensor, float, int)):
        raise TypeError(f"scale: expected a tensor, a number or None, got {type(scale).__name__}")
    if _is_compiling():
        return _concat_op(kv_c, k_pe, kv_cache, slot_mapping, strict)
    _concat(kv_c, k_pe, kv_cache, slot_mapping, strict)
