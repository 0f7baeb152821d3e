# Kernels and CUDA runtime calls of one append at decode-step sizes, mlacore and
# FlashInfer side by side with copy_: torch.profiler for the kernel list and
# durations, CUDA events around the call (L2 flushed) for the device time.
#   python3 research/probes/append_profile.py   (mlacore installed; FlashInfer optional)
import torch, collections, sys
import mlacore
from mlacore.bench.append import Problem
try:
    import flashinfer
except Exception as e:
    print("no flashinfer", e); flashinfer = None
from torch.profiler import profile, ProfilerActivity
dev = "cuda"
def prof(fn, n=50):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += 1; agg[e.name][1] += e.device_time_total if hasattr(e,'device_time_total') else e.cuda_time_total
    rt = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CPU and (e.name.startswith("cuda") or e.name.startswith("cu")):
            rt[e.name][0] += 1; rt[e.name][1] += e.cpu_time_total
    return {k: (v[0] / n, v[1] / v[0]) for k, v in agg.items()}, {k: (v[0] / n, v[1] / v[0]) for k, v in rt.items()}
def ev(fn, n=200):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    ts = []
    for i in range(n + 10):
        flush.zero_()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        if i >= 10: ts.append(s.elapsed_time(e) * 1000)
    ts.sort(); return ts[len(ts) // 2]
gen = torch.Generator().manual_seed(0)
for nnz in (32, 1024):
    for ps in (1, 64):
        pb = Problem(nnz, ps, dev, False, gen)
        ckv_src, kpe_src, ckv, kpe = pb.mla()
        bi, pos = pb.index_args(); ki, kp, kl = pb.table_args()
        runs = {"mlacore_mla": lambda: mlacore.append_paged_mla_kv_cache(ckv_src, kpe_src, bi, pos, ckv, kpe, ki, kp, kl)}
        if flashinfer:
            runs["flashinfer_mla"] = lambda: flashinfer.page.append_paged_mla_kv_cache(ckv_src, kpe_src, bi, pos, ckv, kpe, ki, kp, kl)
        src = torch.randn(nnz, 576, device=dev, dtype=torch.bfloat16); dst = torch.empty_like(src)
        runs["copy_"] = lambda: dst.copy_(src)
        k, v, (kc, vc) = pb.mha()
        runs["mlacore_mha"] = lambda: mlacore.append_paged_kv_cache(k, v, bi, pos, (kc, vc), ki, kp, kl)
        if flashinfer:
            runs["flashinfer_mha"] = lambda: flashinfer.page.append_paged_kv_cache(k, v, bi, pos, (kc, vc), ki, kp, kl)
        for name, fn in runs.items():
            kern, api = prof(fn)
            t = ev(fn)
            print(f"nnz={nnz} page={ps} {name}: event median {t:.2f} us")
            for kn, (c, d) in sorted(kern.items(), key=lambda x: -x[1][1]):
                print(f"    kernel x{c:.1f} {d:.2f} us  {kn[:110]}")
            for kn, (c, d) in sorted(api.items(), key=lambda x: -x[1][0] * x[1][1])[:6]:
                print(f"    api x{c:.1f} {d:.2f} us  {kn[:80]}")
