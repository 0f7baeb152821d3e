"""FlashInfer's MLA decode (BatchMLAPagedAttentionWrapper, default backend) and mlacore's on the same
inputs against a float64 reference, for caches whose used pages sit at growing element offsets:
contiguous [pages, page_size, 512] / [.., 64] caches and split views of one [pages, page_size, 576]
buffer, page sizes 64 and 1. The batch (4 requests of 1000 tokens, heads 16) uses the highest page
ids of the pool, so the largest offsets are the ones read.

  POOLS64=70000,140000,193728 POOLS1=4500000,9000000 python3 research/probes/flashinfer_mla_large_pool.py

Needs a GPU with about 30 GB free for the largest pools, FlashInfer and mlacore importable."""
import math, torch, flashinfer, mlacore.mla as mmla
dev = "cuda"; torch.manual_seed(0)
def case(layout, pool_pages, page_size, heads=16, B=4, L=1000, mod=None):
    pages_per = -(-L // page_size)
    ids = torch.arange(pool_pages - B * pages_per, pool_pages, dtype=torch.int32)  # the highest page ids
    ids = ids[torch.randperm(ids.numel())]
    kv_indptr = torch.arange(0, B * pages_per + 1, pages_per, dtype=torch.int32)
    kv_len = torch.full((B,), L, dtype=torch.int32); qo = torch.arange(B + 1, dtype=torch.int32)
    if layout == "split":
        buf = torch.zeros(pool_pages, page_size, 576, dtype=torch.bfloat16, device=dev)
        ckv, kpe = torch.split(buf, [512, 64], -1)
    else:
        ckv = torch.zeros(pool_pages, page_size, 512, dtype=torch.bfloat16, device=dev)
        kpe = torch.zeros(pool_pages, page_size, 64, dtype=torch.bfloat16, device=dev)
    used = ids.long().to(dev)
    ckv[used] = (torch.randn(used.numel(), page_size, 512, device=dev) * 0.5).to(torch.bfloat16)
    kpe[used] = (torch.randn(used.numel(), page_size, 64, device=dev) * 0.5).to(torch.bfloat16)
    qn = (torch.randn(B, heads, 512, device=dev) * 0.5).to(torch.bfloat16); qp = (torch.randn(B, heads, 64, device=dev) * 0.5).to(torch.bfloat16)
    scale = 1 / math.sqrt(192); res = {}
    for name, m in (("flashinfer", flashinfer.mla), ("mlacore", mmla)):
        w = m.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev))
        w.plan(qo.to(dev), kv_indptr.to(dev), ids.to(dev), kv_len.to(dev), heads, 512, 64, page_size, False, scale, torch.bfloat16, torch.bfloat16)
        res[name] = w.run(qn, qp, ckv, kpe).double()
    worst = {k: 0.0 for k in res}
    for b in range(B):
        pg = ids[b * pages_per:(b + 1) * pages_per].long().to(dev)
        pos = torch.arange(L, device=dev)
        kv = torch.cat([ckv[pg[pos // page_size], pos % page_size], kpe[pg[pos // page_size], pos % page_size]], -1).double()
        q = torch.cat([qn[b], qp[b]], -1).double()
        ref = torch.softmax(q @ kv.T * scale, -1) @ kv[:, :512]
        for k in res: worst[k] = max(worst[k], (res[k][b] - ref).abs().max().item())
    elems = pool_pages * page_size * ckv.stride(1)
    print(f"{layout:>10} pool {pool_pages:7d} pages x {page_size:2d}, ckv elements to the last page {elems:.3e} (2^31 = 2.147e9): "
          + "  ".join(f"max|{k}-ref| {v:.2e}" for k, v in worst.items()), flush=True)
    del ckv, kpe
    torch.cuda.empty_cache()
import os
pools = {64: [int(x) for x in os.environ.get("POOLS64", "5000,70000").split(",")],
         1: [int(x) for x in os.environ.get("POOLS1", "20000,4500000").split(",")]}
for ps in (64, 1):
    for layout in ("contiguous", "split"):
        for pool in pools[ps]:
            case(layout, pool, ps)
