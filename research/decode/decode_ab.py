"""heads=128 decode, mlacore and FlashInfer's fa3 side by side, one line per shape.

For A/B comparisons of decode variants that differ by build or by a switch a
process reads once (MLACORE_DECODE_KERNEL): run this once per variant,
alternating, and compare each variant's "x fa3" (fa3 time over mlacore time,
both measured in the same process with the L2 flushed before every timed
call, as `python -m mlacore bench --mode attn` does).

    PYTHONPATH=<repo root> python research/decode/decode_ab.py LABEL [REPEATS]
"""

import sys
from types import SimpleNamespace

import torch

from bench import Context
from bench._mla import DecodeCase, flashinfer_runner, flops, timer

SHAPES = [(8, 32768), (32, 8192), (32, 32768)]
HEADS = 128


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    ctx = Context(SimpleNamespace(device="cuda", size="full", separate=False, repeats=0))
    measure = timer(ctx, int(sys.argv[2]) if len(sys.argv) > 2 else 30)
    for batch, kv in SHAPES:
        for page_size in (1, 64):
            num_pages = batch * -(-kv // page_size) + 8
            case = DecodeCase(ctx, batch, kv, HEADS, page_size, num_pages, torch.bfloat16)
            ms = measure(case.run)
            fi, why = flashinfer_runner(ctx, case.idx, HEADS, page_size, torch.bfloat16, case.q_nope, case.q_pe,
                                        case.ckv, case.kpe)
            fi_ms = measure(fi) if fi else float("nan")
            tf = flops(batch, kv, HEADS, 1) / ms / 1e9
            print(f"{label} b={batch} kv={kv} page={page_size}: mlacore {ms:.4f} ms ({tf:.0f} TFLOP/s), "
                  f"fa3 {fi_ms:.4f} ms, x fa3 {fi_ms / ms:.3f}" + (f" ({why})" if why else ""), flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
