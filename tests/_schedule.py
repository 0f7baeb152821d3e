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


def _capacity(batch, items, max_batch, max_work):
    """(max_batch, max_work): the given ones, checked, or the least that hold the batch."""
    max_batch = max(batch, 1) if max_batch is None else max_batch
    max_work = max(items, 1) if max_work is None else max_work
    if max_batch < batch or max_work < items:
        raise ValueError(f"capacity too small: batch {batch} > {max_batch} or work {items} > {max_work}")
    return max_batch, max_work


def host_schedule(qo_indptr, kv_len, page_size, num_heads, max_batch=None, max_work=None, chunk_tokens=None,
                   num_sms=132):
    """A plain host schedule in the layout of decode_schedule.h, int32 on the CPU.

    Splits every request into chunks of `chunk_tokens` (a multiple of 64;
    default: the total KV spread over `num_sms`). Used by tests to force
    particular splits, and by plan() only when mlacore.MlaPlan is absent.
    Returns (schedule, max_batch, max_work, max_qo_len).
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
    max_batch, max_work = _capacity(batch, sum(splits), max_batch, max_work)
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




def balanced_parts(kv_tiles, num_parts, fixed_tiles=5):
    """The balanced split of docs/design/2026-12-03-balanced-schedule.md, in the spirit of
    FlashMLA's get_mla_metadata: `num_parts` CTA lists (a persistent CTA, or a pair of query
    tiles, walks one), each a list of pieces (request, first tile, end tile), with
    near-equal cost. Cost counts a request's KV tiles plus `fixed_tiles` per piece (its query
    load, its output or partial, its share of the merge). Requests are walked in order; a
    list takes whole requests while they fit its payload and cuts the next one where the
    payload ends, so a long request spans several lists and short ones share one.

    Every list holds at most max(ceil(sum(tiles + fixed) / num_parts) + fixed, 2 fixed) of cost, every
    tile lands in exactly one piece, and there are at most len(kv_tiles) + num_parts - 1
    pieces (each list boundary cuts at most one request), so the pieces fit today's
    default_max_work. An empty request gets one empty piece (the kernel writes zeros and
    a -inf LSE). Returns the lists; trailing ones may be empty.
    """
    B = len(kv_tiles)
    total = sum(k + fixed_tiles for k in kv_tiles)
    # At least two fixed costs, as FlashMLA: a list always has room for a piece with tiles.
    payload = max(-(-total // max(num_parts, 1)) + fixed_tiles, 2 * fixed_tiles)
    parts, b, t = [], 0, 0
    for _ in range(max(num_parts, 1)):
        part, remain = [], payload
        while b < B:
            left = kv_tiles[b] - t
            if remain >= left + fixed_tiles:
                part.append((b, t, kv_tiles[b]))
                remain -= left + fixed_tiles
                b, t = b + 1, 0
                continue
            take = remain - fixed_tiles
            if take > 0:
                part.append((b, t, t + take))
                t += take
            break
        parts.append(part)
    assert b == B, "the payload bound covers every tile"
    return parts


def balanced_schedule(qo_indptr, kv_len, page_size, num_heads, num_sms=132, max_batch=None, max_work=None,
                      fixed_tiles=5):
    """The balanced split laid out as today's schedule (core/src/plan/schedule.h): every piece
    of balanced_parts() a work item, list after list, so the current kernels (one CTA per
    work item and query tile) execute it and the combine merges the pieces of every split
    request. num_parts = num_sms // query tiles, so one list's query tiles fill one SM each.
    Returns (schedule, max_batch, max_work, max_qo_len, parts)."""
    qo = [int(x) for x in torch.as_tensor(qo_indptr).tolist()]
    lens = [int(x) for x in torch.as_tensor(kv_len).tolist()]
    batch = len(lens)
    max_qo = max([qo[b + 1] - qo[b] for b in range(batch)] + [1])
    q_tiles = max(-(-max_qo * num_heads // _TILE_TOKENS), 1)
    parts = balanced_parts([-(-n // _TILE_TOKENS) for n in lens], max(num_sms // q_tiles, 1), fixed_tiles)
    pieces = [p for part in parts for p in part]
    count = [0] * batch
    for b, _, _ in pieces:
        count[b] += 1
    max_batch, max_work = _capacity(batch, len(pieces), max_batch, max_work)
    lpl_off, split_off, work_off, total = _layout(max_batch, max_work)
    md = [0] * total
    first, partials = [0] * batch, 0
    for b in range(batch):
        first[b] = partials
        md[split_off + b] = partials
        pages = -(-lens[b] // page_size)
        md[lpl_off + b] = lens[b] - (pages - 1) * page_size if lens[b] > 0 else 0
        partials += count[b] if count[b] > 1 else 0
    for b in range(batch, max_batch + 1):
        md[split_off + b] = partials
    seen = [0] * batch
    for w in range(max_work):
        if w < len(pieces):
            b, t0, t1 = pieces[w]
            item = (b, t0 * _TILE_TOKENS, min(t1 * _TILE_TOKENS, lens[b]), first[b] + seen[b] if count[b] > 1 else -1)
            seen[b] += 1
        else:
            item = (-1, 0, 0, -1)
        md[work_off + 4 * w: work_off + 4 * w + 4] = item
    longest = max([t1 - t0 for _, t0, t1 in pieces] + [1])
    md[0:8] = [len(pieces), partials, batch, max_qo, max(lens + [0]), longest * _TILE_TOKENS,
               qo[batch] if batch else 0, 0]
    return torch.tensor(md, dtype=torch.int32), max_batch, max_work, max_qo, parts
