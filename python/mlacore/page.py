"""FlashInfer's `flashinfer.page` names, mapped one to one onto mlacore.

An engine that imports `flashinfer.page` switches with
`import mlacore.page as page` (or `from mlacore.page import ...`): same
functions, same arguments, same semantics.
"""

from ._append import append_paged_kv_cache, append_paged_mla_kv_cache
from ._slot_mapping import get_batch_indices_positions, get_seq_lens

__all__ = ["append_paged_kv_cache", "append_paged_mla_kv_cache", "get_batch_indices_positions", "get_seq_lens"]
