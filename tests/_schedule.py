"""A plain Python decode schedule in the layout of core/src/plan/schedule.h.

Tests use it to force particular splits (chunk sizes the plan builder would
not pick) and feed them straight to the core's decode; the package itself
always plans through mlacore.MlaPlan.
"""

import torch

_TILE_TOKENS = 64  # kDecodeTileTokens
_HDR_SIZE = 8      # kHdrSize


def _layout(max_batch, max_work):
    """Offsets of ScheduleLayout (core/src/plan/schedule.h): last_page_len, split_indptr, work, total."""
    last_page_len = _HDR_SIZE
    split_indptr = last_page_len + max_batch
    work = (split_indptr + max_batch + 1 + 3) // 4 * 4
    return last_page_len, split_indptr, work, work + 4 * max_work


def host_schedule(qo_indptr, kv_len, page_size, num_heads, max_batch=None, max_work=None, chunk_tokens=None,
                   num_sms=132):
    """A plain host schedule in the layout of decode_schedule.h, int32 on the CPU.

    Splits every request into chunks of `chunk_tokens` (a multiple of 64;
    default: the total KV spread over `num_sms`). Used by tests to force
    particular splits, and by plan() only when mlacore.MlaPlan is absent.
    Returns (metadata, max_batch, max_work, max_qo_len).
    """
    qo = [int(x) for x in torch.as_tensor(qo_indptr).tolist()]
    lens = [int(x) for x in torch.as_tensor(kv_len).tolist()]
    batch = len(lens)
    tiles = [-(-n // _TILE_TOKENS) for n in lens]
    if chunk_tokens is None:
        chunk = max(1, -(-sum(tiles) // max(num_sms, 1)))
        chunk_tokens = min(chunk, max(tiles + [1])) * _TILE_TOKENS
    if chunk_tokens <= 0 or chunk_tokens % _TILE_TOKENS:
        raise ValueError(f"chunk_tokens: expected a positive multiple of {_TILE_TOKENS}, got {chunk_tokens}")
    splits = [max(1, -(-n // chunk_tokens)) for n in lens]
    max_batch = max(batch, 1) if max_batch is None else max_batch
    max_work = max(sum(splits), 1) if max_work is None else max_work
    if max_batch < batch or max_work < sum(splits):
        raise ValueError(f"capacity too small: batch {batch} > {max_batch} or work {sum(splits)} > {max_work}")
    lpl_off, split_off, work_off, total = _layout(max_batch, max_work)
    md = [0] * total
    items, partials = [], 0
    for b in range(batch):
        md[split_off + b] = partials
        pages = -(-lens[b] // page_size)
        md[lpl_off + b] = lens[b] - (pages - 1) * page_size if lens[b] > 0 else 0
        for i in range(splits[b]):
            begin, end = i * chunk_tokens, min((i + 1) * chunk_tokens, lens[b])
            items.append((b, begin, max(end, begin), partials + i if splits[b] > 1 else -1))
        if splits[b] > 1:
            partials += splits[b]
    for b in range(batch, max_batch + 1):
        md[split_off + b] = partials
    for w in range(max_work):
        md[work_off + 4 * w: work_off + 4 * w + 4] = items[w] if w < len(items) else (-1, 0, 0, -1)
    max_qo = max([qo[b + 1] - qo[b] for b in range(batch)] + [1])
    md[0:8] = [len(items), partials, batch, max_qo, max(lens + [0]), chunk_tokens, qo[batch] if batch else 0, 0]
    return torch.tensor(md, dtype=torch.int32), max_batch, max_work, max_qo


