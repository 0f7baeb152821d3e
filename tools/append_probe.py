"""GPU probe of the paged appends (run by tools/append_probe.sh on the H200, mlacore installed).

  python3 tools/append_probe.py kernels          every kernel one call launches (decode steps of PROBE_NNZ
                                                 tokens, default 32,512), with its duration
  python3 tools/append_probe.py launch           one call's device time three ways: CUDA events around an
                                                 eager call (the bench's measure), events around the replay
                                                 of a CUDA graph holding the call, and the kernels' own
                                                 durations (torch.profiler); L2 flushed before each call
  python3 tools/append_probe.py sweep            device time per call over nnz for the kernel that
                                                 MLACORE_APPEND_KERNEL picks (set by the caller), with copy_
                                                 and FlashInfer of the same call beside it
Prints compact tables (us) on stdout."""

import os
import statistics
import sys

import torch

import mlacore
from mlacore.bench._timing import L2Flush, device_ms, kernel_us
from mlacore.bench.append import HEADS, HEAD_DIM, STEP_MAX_NNZ, Problem

DEV = "cuda"


def _fi():
    try:
        import flashinfer

        return flashinfer
    except Exception:  # noqa: BLE001 (the probe goes on without it)
        return None


def calls(nnz, page_size, fi, order="scrambled"):
    """name -> callable for one point: the three mlacore ops and their FlashInfer counterparts
    (the bench's shapes: a decode step up to STEP_MAX_NNZ tokens, chunks above)."""
    gen = torch.Generator().manual_seed(nnz + page_size)
    p = Problem(nnz, page_size, DEV, False, gen, order, step=nnz <= STEP_MAX_NNZ)
    src, ckv, kpe, buf = p.mla()
    a, b = src[:, :512], src[:, 512:]
    key, value, cache = p.mha()
    idx, tab, slots = p.index_args(), p.table_args(), p.slot_mapping
    out = {
        "mla": lambda: mlacore.append_paged_mla_kv_cache(a, b, *idx, ckv, kpe, *tab),
        "mha": lambda: mlacore.append_paged_kv_cache(key, value, *idx, cache, *tab),
        "concat": lambda: mlacore.concat_and_cache_mla(a, b, buf, slots, "auto", None),
    }
    if fi is not None:
        out["fi_mla"] = lambda: fi.page.append_paged_mla_kv_cache(a, b, *idx, ckv, kpe, *tab)
        out["fi_mha"] = lambda: fi.page.append_paged_kv_cache(key, value, *idx, cache, *tab, kv_layout="NHD")
    mla_src = torch.empty(nnz * 576, dtype=torch.bfloat16, device=DEV)
    mla_dst = torch.empty_like(mla_src)
    mha_src = torch.empty(2 * nnz * HEADS * HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    mha_dst = torch.empty_like(mha_src)
    out["copy_mla"] = lambda: mla_dst.copy_(mla_src)
    out["copy_mha"] = lambda: mha_dst.copy_(mha_src)
    out["_keep"] = (p, src, ckv, kpe, buf, key, value, cache, mla_src, mla_dst, mha_src, mha_dst)
    return out


def kernels():
    """torch.profiler: every kernel (and memcpy/memset) one call launches, with its device time
    (decode steps of PROBE_NNZ tokens, default 32 and 512)."""
    fi = _fi()
    print(f"MLACORE_APPEND_KERNEL={os.environ.get('MLACORE_APPEND_KERNEL', '(unset)')}")
    print(f"{'op':<10} {'page':>4}  {'kernels per call: name x count, mean device us':<}")
    flush = L2Flush(DEV)
    for nnz, page_size in [(n, ps) for n in map(int, os.environ.get("PROBE_NNZ", "32,512").split(",")) for ps in (1, 16, 64)]:
        cs = calls(nnz, page_size, fi)
        for name in ("mla", "mha", "concat", "fi_mla", "fi_mha", "copy_mla"):
            if name not in cs:
                continue
            fn = cs[name]
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 50
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    flush()
                    fn()
                torch.cuda.synchronize()
            per = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and "zero_" not in e.name and "fill" not in e.name.lower():
                    per.setdefault(e.name, []).append(e.time_range.elapsed_us())
            desc = "; ".join(f"{k[:60]} x{len(v) / n:g} {statistics.median(v):.2f}us" for k, v in per.items())
            print(f"{name:<10} {page_size:>4}  nnz {nnz}: {desc}")
            # CUDA events around the call, as the bench measures it.
            ms = device_ms(fn, repeats=50, flush=flush)
            print(f"{'':<10} {'':>4}  events: {ms * 1e3:.2f} us per call")


def _graphed(fn):
    """fn captured in a CUDA graph (warmed up on a side stream first, as torch asks), and its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g, g.replay


def launch():
    fi = _fi()
    flush = L2Flush(DEV)
    names = ["mla", "mha", "concat", "fi_mla", "fi_mha", "copy_mla"]
    print(f"{'op':<9} {'nnz':>5} {'page':>4}  {'events us':>9} {'graph us':>9} {'kernel us':>9}  "
          f"{'events-kernel':>13} {'graph-kernel':>12}   (medians of 3 rounds x 100 calls)")
    for nnz in map(int, os.environ.get("PROBE_NNZ", "32,512").split(",")):
        for page_size in (1, 16):
            cs = calls(nnz, page_size, fi)
            live = [n for n in names if n in cs]
            graphs = {n: _graphed(cs[n]) for n in live}
            res = {n: ([], [], []) for n in live}
            for r in range(3):
                for k in range(len(live)):
                    n = live[(k + r) % len(live)]
                    res[n][0].append(device_ms(cs[n], repeats=100, flush=flush, settle_s=0.02) * 1e3)
                    res[n][1].append(device_ms(graphs[n][1], repeats=100, flush=flush, settle_s=0.02) * 1e3)
                    res[n][2].append(kernel_us([cs[n]], flush, calls=100, rounds=1)[0])
            for n in live:
                ev, gr, ku = (statistics.median(v) for v in res[n])
                print(f"{n:<9} {nnz:>5} {page_size:>4}  {ev:>9.2f} {gr:>9.2f} {ku:>9.2f}  {ev - ku:>13.2f} {gr - ku:>12.2f}")
            del graphs, cs
    sys.stdout.flush()


def sweep():
    fi = _fi()
    flush = L2Flush(DEV)
    sizes = [int(x) for x in os.environ.get("PROBE_SIZES", "1,32,512,1024,2048,4096,16384,65536").split(",")]
    choice = os.environ.get("MLACORE_APPEND_KERNEL", "auto")
    names = ["mla", "mha", "concat"] + (["fi_mla", "fi_mha"] if fi is not None else []) + ["copy_mla", "copy_mha"]
    for page_size in (1, 16):
        print(f"== device us per call, MLACORE_APPEND_KERNEL={choice}, page {page_size}, scrambled pages")
        print(f"{'nnz':>6} " + " ".join(f"{n:>9}" for n in names) + "   mla/copy  mla/fi  mha/copy  mha/fi")
        for nnz in sizes:
            cs = calls(nnz, page_size, fi)
            us = {n: device_ms(cs[n], repeats=30, flush=flush) * 1e3 for n in names}
            ratios = [us["mla"] / us["copy_mla"], us["mla"] / us.get("fi_mla", float("nan")),
                      us["mha"] / us["copy_mha"], us["mha"] / us.get("fi_mha", float("nan"))]
            print(f"{nnz:>6} " + " ".join(f"{us[n]:>9.2f}" for n in names) + "   "
                  + "  ".join(f"{r:7.3f}" for r in ratios))
            del cs
    sys.stdout.flush()


if __name__ == "__main__":
    {"kernels": kernels, "launch": launch, "sweep": sweep}[sys.argv[1]]()
