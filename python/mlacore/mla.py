"""FlashInfer's `flashinfer.mla` name for MLA decode, mapped onto mlacore:
`mlacore.mla.BatchMLAPagedAttentionWrapper` replaces
`flashinfer.mla.BatchMLAPagedAttentionWrapper` (see mlacore._mla_decode)."""

from ._mla_decode import BatchMLAPagedAttentionWrapper, workspace_bytes

__all__ = ["BatchMLAPagedAttentionWrapper", "workspace_bytes"]
