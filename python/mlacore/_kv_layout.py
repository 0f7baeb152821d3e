"""Layout detection: is a (ckv, kpe) pair the two halves of one interleaved cache?"""

from typing import Optional

import torch

from . import _mlacore


# Decided by the core from pointers, shapes, strides and dtypes. One check
# the core cannot make is added here: both halves must share a torch storage,
# since a view can only span one (pointers of two separate allocations can
# line up by chance when a cache has a single token).
#
# Under torch.compile the tensors are fake and have no addresses, so the
# decision is taken once, on the real tensors, when the graph is traced
# (assume_constant_result) and baked into the graph. A cache layout is fixed
# for an engine's lifetime; dynamo's guards re-trace on a change of shape,
# stride, dtype or device, but not on a change of address.
def _assume_constant_result(fn):
    """torch.compiler.assume_constant_result without importing torch._dynamo.

    The official decorator imports dynamo (3 of the 6.5 s an `import mlacore`
    took on the CI machine) only to set one attribute on `fn`; this sets the
    same one, and tests/test_torch_compile.py checks that it still is what
    the decorator sets."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _combined_layout(ckv_cache, kpe_cache):
    layout = _mlacore.combined_kv_view(ckv_cache, kpe_cache)
    if layout is None or not _same_storage(ckv_cache, kpe_cache):
        return None
    return layout


def _same_storage(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def combined_kv_view(ckv_cache: torch.Tensor, kpe_cache: torch.Tensor) -> Optional[torch.Tensor]:
    """Zero-copy [num_pages, page_size, Dc + Dp] view over ckv and kpe, or None.

    The view exists when ckv_cache [P, S, Dc] and kpe_cache [P, S, Dp] are the
    halves of one per-token interleaved buffer, as `torch.split(buf, [Dc, Dp], -1)`
    of a [P, S, Dc + Dp] buffer (or of one layer of [L, P, S, Dc + Dp]) makes
    them: same dtype and device, kpe starting Dc elements after ckv, equal page
    and token strides with token stride Dc + Dp, contiguous last dimensions.
    The view keeps ckv's page stride and storage offset. Separate allocations,
    reversed halves, padded rows or mismatched dtypes give None (see
    `explain_kv_layout` for why); caches that are not 3-D with matching
    num_pages and page_size raise ValueError. Never reads the caches' memory.
    """
    layout = _combined_layout(ckv_cache, kpe_cache)
    if layout is None:
        return None
    shape, strides = layout
    return ckv_cache.as_strided(shape, strides)


def explain_kv_layout(ckv_cache: torch.Tensor, kpe_cache: torch.Tensor) -> str:
    """In words, why `combined_kv_view(ckv_cache, kpe_cache)` is or is not a view."""
    text = _mlacore.explain_kv_layout(ckv_cache, kpe_cache)
    if text.startswith("adjacent") and not _same_storage(ckv_cache, kpe_cache):
        return ("not adjacent: ckv_cache and kpe_cache line up in memory but are separate torch "
                "storages, and a view cannot span two")
    return text
