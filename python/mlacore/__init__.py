"""mlacore: the glue between an LLM serving engine and MLA decode kernels over a paged KV cache.

The torch-facing API. Heavy lifting happens in libmlacore (C++/CUDA/HIP); this
package allocates outputs, registers torch custom ops and shapes the API.
"""

from . import _mlacore
from ._append import append_paged_kv_cache, append_paged_mla_kv_cache
from ._append import concat_and_cache_mla
from ._backends import backends
from ._mla_decode import BatchMLAPagedAttentionWrapper, workspace_bytes
from ._kv_layout import combined_kv_view, explain_kv_layout
from ._paths import get_cmake_dir, get_include, get_library_dir, get_pkgconfig_dir
from ._plan import MlaPlan, PlanInfo, default_max_work, plan_schedule_size
from ._slot_mapping import get_batch_indices_positions, get_seq_lens, page_indices_from_block_table, slot_mapping
from . import mla, page  # FlashInfer's module paths: flashinfer.mla / flashinfer.page

__version__ = _mlacore.version()


def built_with(feature: str) -> bool:
    """True when libmlacore was built with the GPU backend `feature` ("cuda" or "hip")."""
    return _mlacore.built_with(feature)


__all__ = [
    "__version__",
    "built_with",
    "backends",
    "append_paged_mla_kv_cache",
    "append_paged_kv_cache",
    "concat_and_cache_mla",
    "MlaPlan",
    "PlanInfo",
    "default_max_work",
    "plan_schedule_size",
    "BatchMLAPagedAttentionWrapper",
    "workspace_bytes",
    "get_include",
    "get_library_dir",
    "get_pkgconfig_dir",
    "get_cmake_dir",
    "combined_kv_view",
    "explain_kv_layout",
    "slot_mapping",
    "page_indices_from_block_table",
    "get_batch_indices_positions",
    "get_seq_lens",
    "mla",
    "page",
]
