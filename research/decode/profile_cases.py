"""Runs one benchmark shape a few times, for a profiler (ncu) to pick a launch.

    python research/decode/profile_cases.py decode BATCH KV HEADS PAGE
    python research/decode/profile_cases.py decode-flashmla BATCH KV HEADS 64   (FlashMLA, when importable)
    python research/decode/profile_cases.py append-mla NNZ PAGE
    python research/decode/profile_cases.py append-mha NNZ PAGE
"""
import sys
import types

import torch

import mlacore
from bench import _mla
from bench.append import Problem

kind, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
dev = torch.device("cuda")
if kind in ("decode", "decode-flashmla"):
    batch, kv, heads, page = args
    ctx = types.SimpleNamespace(device=dev, gpu=True, separate=False)
    pages = (batch * -(-kv // page)) * 2
    case = _mla.DecodeCase(ctx, batch, kv, heads, page, pages, torch.bfloat16)
    run = case.run
    if kind == "decode-flashmla":
        run, why = _mla.flashmla_runner(ctx, case)  # checked against mlacore's output first
        if run is None:
            sys.exit(why or "FlashMLA runs page size 64 only")
else:
    nnz, page = args
    p = Problem(nnz, page, dev, False, torch.Generator().manual_seed(0))
    if kind == "append-mla":
        a_ckv, a_kpe, ckv, kpe = p.mla()
        run = lambda: mlacore.append_paged_mla_kv_cache(a_ckv, a_kpe, *p.index_args(), ckv, kpe, *p.table_args())
    else:
        key, value, cache = p.mha()
        run = lambda: mlacore.append_paged_kv_cache(key, value, *p.index_args(), cache, *p.table_args())
for _ in range(4):
    run()
torch.cuda.synchronize()
print(kind, args, "ok")
