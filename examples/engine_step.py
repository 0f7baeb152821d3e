"""A DeepSeek-V3-shaped MLA decode loop, driven the way vLLM drives FlashInfer.

Every step of the loop does what an engine's decode step does:
  1. scheduling: requests arrive (their prompt is written to the cache),
     every running request gains one token, requests finish;
  2. block bookkeeping: a block table per request, a new block from a free
     list when a request crosses a page boundary, and per step freshly
     allocated index tensors (slot mapping, kv_indptr, kv_indices, kv_len);
  3. the cache write of the step's new latent (512) and rope key (64) for
     every layer into a per-layer [num_blocks, page_size, 576] buffer;
  4. plan() once per step into the CUDA-graph buffers of the wrapper captured
     for the padded batch size, then one CUDA-graph replay that runs the
     attention of every layer.

`--backend mlacore` runs mlacore (`import mlacore.mla as mla, mlacore.page
as page`), `--backend flashinfer` the same loop on FlashInfer
(`flashinfer.mla`, `flashinfer.page`: the import is the only difference),
`--backend both` runs the two side by side on identical inputs and checks
their outputs against each other every step (exit status 1 on a mismatch).
Per-step times are CUDA-event times of plan + replay.

`--device cpu` is a dry check without a GPU: the eager path (no graphs), a
few steps, each output checked against a float64 torch reference.

Examples:
  python examples/engine_step.py --backend both --heads 16 128 --page-size 1 64
  python examples/engine_step.py --device cpu --steps 3 --layers 2
"""

import argparse
import math
import random
import sys
import time

import torch

CKV, KPE = 512, 64


def load_backend(name):
    """The module pair an engine imports: (mla, page). The only line that differs between backends."""
    if name == "mlacore":
        import mlacore.mla as mla
        import mlacore.page as page
    else:
        import flashinfer.mla as mla
        import flashinfer.page as page
    return mla, page


class Requests:
    """The scheduler's view: live requests with their lengths and blocks (one shared free list)."""

    def __init__(self, rng, num_blocks, page_size, max_batch, max_prompt, max_new):
        self.rng, self.page_size, self.max_batch = rng, page_size, max_batch
        self.max_prompt, self.max_new = max_prompt, max_new
        self.free = list(range(num_blocks))
        rng.shuffle(self.free)  # pages of a request are scattered, as in a long-running engine
        self.live = []  # dicts: id, len, target, blocks
        self.next_id = 0

    def _blocks_for(self, req, length):
        while len(req["blocks"]) * self.page_size < length:
            req["blocks"].append(self.free.pop())

    def admit(self, count):
        """New requests with their prompts; returns [(req, first_new_pos)] whose tokens must be written."""
        added = []
        for _ in range(count):
            if len(self.live) >= self.max_batch:
                break
            prompt = self.rng.randint(1, self.max_prompt)
            req = dict(id=self.next_id, len=0, target=prompt + self.rng.randint(1, self.max_new), blocks=[])
            self.next_id += 1
            self._blocks_for(req, prompt)
            req["len"] = prompt
            self.live.append(req)
            added.append((req, 0))
        return added

    def grow(self, skip=()):
        """Every running request not in `skip` (ids) gains one token; returns [(req, its new position)]."""
        grown = []
        for req in self.live:
            if req["id"] in skip:
                continue
            self._blocks_for(req, req["len"] + 1)
            req["len"] += 1
            grown.append((req, req["len"] - 1))
        return grown

    def retire(self):
        done = [r for r in self.live if r["len"] >= r["target"]]
        for r in done:
            self.free.extend(r["blocks"])
        self.live = [r for r in self.live if r["len"] < r["target"]]
        return len(done)


def token_data(req_id, pos, layer, dtype, device):
    """Deterministic latent + rope key of one token (same on every backend)."""
    g = torch.Generator().manual_seed((req_id * 1_000_003 + pos) * 97 + layer)
    x = torch.randn(CKV + KPE, generator=g) * 0.5
    return x.to(dtype)


def step_index_tensors(live, page_size, padded, device):
    """vLLM's per-step metadata: freshly allocated tensors, the live batch padded with empty requests."""
    lens = [r["len"] for r in live] + [0] * (padded - len(live))
    pages = [-(-n // page_size) for n in lens]
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
    kv_indices = torch.tensor([b for r in live for b in r["blocks"][: -(-r["len"] // page_size)]] or [0],
                              dtype=torch.int32)[: int(kv_indptr[-1])]
    qo_indptr = torch.arange(padded + 1, dtype=torch.int32)
    kv_len = torch.tensor(lens, dtype=torch.int32)
    return [t.to(device, non_blocking=True) for t in (qo_indptr, kv_indptr, kv_indices, kv_len)]


class Engine:
    """One backend: per-layer caches, the cache write, and per padded batch size a graph wrapper."""

    def __init__(self, name, args, heads, page_size, device):
        self.name, self.args, self.heads, self.page_size, self.device = name, args, heads, page_size, device
        self.mla, self.page = load_backend(name)
        self.dtype = torch.bfloat16
        if name == "flashinfer":
            # Two contiguous buffers per layer, as FlashInfer's own tests allocate them (its decode
            # also reads split views of one buffer).
            self.views = [(torch.zeros(args.num_blocks, page_size, CKV, dtype=self.dtype, device=device),
                           torch.zeros(args.num_blocks, page_size, KPE, dtype=self.dtype, device=device))
                          for _ in range(args.layers)]
            self.caches = None
        else:
            # vLLM's layout: one [num_blocks, page_size, 576] buffer per layer, read in place as two halves.
            self.caches = [torch.zeros(args.num_blocks, page_size, CKV + KPE, dtype=self.dtype, device=device)
                           for _ in range(args.layers)]
            self.views = [torch.split(c, [CKV, KPE], dim=-1) for c in self.caches]
        self.graphs = {}  # padded batch -> (wrapper, graph, q_nope, q_pe, outs)
        self.eager = None
        import mlacore
        self.concat = getattr(mlacore, "concat_and_cache_mla", None) if name == "mlacore" else None

    # -- cache write ------------------------------------------------------
    def write(self, tokens, layer, data, reqs_index):
        """Writes `data` [T, 576] of `tokens` [(req, pos)] into this layer's cache."""
        ckv, kpe = self.views[layer]
        ps = self.page_size
        if self.concat is not None:
            # vLLM's slot mapping: page * page_size + offset, int64.
            slots = torch.tensor([r["blocks"][p // ps] * ps + p % ps for r, p in tokens], dtype=torch.int64)
            self.concat(data[:, :CKV], data[:, CKV:], self.caches[layer], slots.to(self.device), "auto",
                        torch.ones((), dtype=torch.float32, device=self.device))
            return
        # FlashInfer's append: batch index and position of each token over the live requests' pages.
        live = reqs_index
        rows = {r["id"]: i for i, r in enumerate(live)}
        lens = [r["len"] for r in live]
        pages = [-(-n // ps) for n in lens]
        kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
        kv_indices = torch.tensor([b for r in live for b in r["blocks"][: -(-r["len"] // ps)]], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if n else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
        batch_indices = torch.tensor([rows[r["id"]] for r, _ in tokens], dtype=torch.int32)
        positions = torch.tensor([p for _, p in tokens], dtype=torch.int32)
        to = lambda t: t.to(self.device)
        self.page.append_paged_mla_kv_cache(data[:, :CKV], data[:, CKV:], to(batch_indices), to(positions), ckv, kpe,
                                            to(kv_indices), to(kv_indptr), to(last))

    # -- attention ----------------------------------------------------------
    def _plan(self, wrapper, idx):
        wrapper.plan(*idx, self.heads, CKV, KPE, self.page_size, False, 1.0 / math.sqrt(192), self.dtype, self.dtype)

    def _graph_for(self, padded, idx):
        if padded in self.graphs:
            return self.graphs[padded]
        dev = self.device
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        bufs = dict(qo_indptr=torch.zeros(padded + 1, dtype=torch.int32, device=dev),
                    kv_indptr=torch.zeros(padded + 1, dtype=torch.int32, device=dev),
                    kv_indices=torch.zeros(self.args.num_blocks, dtype=torch.int32, device=dev),
                    kv_len_arr=torch.zeros(padded, dtype=torch.int32, device=dev))
        wrapper = self.mla.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, **bufs)
        q_nope = torch.zeros(self.args.layers, padded, self.heads, CKV, dtype=self.dtype, device=dev)
        q_pe = torch.zeros(self.args.layers, padded, self.heads, KPE, dtype=self.dtype, device=dev)
        outs = torch.zeros_like(q_nope)
        self._plan(wrapper, idx)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for layer in range(self.args.layers):  # warm-up outside capture
                ckv, kpe = self.views[layer]
                wrapper.run(q_nope[layer], q_pe[layer], ckv, kpe, out=outs[layer])
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for layer in range(self.args.layers):
                ckv, kpe = self.views[layer]
                wrapper.run(q_nope[layer], q_pe[layer], ckv, kpe, out=outs[layer])
        self.graphs[padded] = (wrapper, graph, q_nope, q_pe, outs)
        return self.graphs[padded]

    def attend(self, live, padded, queries):
        """queries [layers, B, heads, 576]; returns outputs [layers, B, heads, 512] and the step's milliseconds."""
        idx = step_index_tensors(live, self.page_size, padded, self.device)
        B = len(live)
        if self.device.type != "cuda" or self.args.eager:
            if self.eager is None:
                ws = torch.empty(128 << 20, dtype=torch.uint8, device=self.device)
                self.eager = self.mla.BatchMLAPagedAttentionWrapper(ws)
            t0 = time.perf_counter()
            self._plan(self.eager, idx)
            outs = []
            for layer in range(self.args.layers):
                ckv, kpe = self.views[layer]
                q = queries[layer]
                qn = torch.zeros(padded, self.heads, CKV, dtype=self.dtype, device=self.device)
                qp = torch.zeros(padded, self.heads, KPE, dtype=self.dtype, device=self.device)
                qn[:B], qp[:B] = q[..., :CKV], q[..., CKV:]
                outs.append(self.eager.run(qn, qp, ckv, kpe)[:B])
            return torch.stack(outs), (time.perf_counter() - t0) * 1e3
        wrapper, graph, q_nope, q_pe, out = self._graph_for(padded, idx)
        q_nope[:, :B].copy_(queries[..., :CKV])
        q_pe[:, :B].copy_(queries[..., CKV:])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._plan(wrapper, idx)  # copies into the graph's buffers: the captured graph stays valid
        graph.replay()
        end.record()
        end.synchronize()
        return out[:, :B].clone(), start.elapsed_time(end)


def reference(engine, live, queries, layer):
    """float64 attention of one layer over an engine's cache (every step on the CPU, the first
    step of each configuration on the GPU)."""
    ps, out = engine.page_size, []
    ckv, kpe = engine.views[layer]
    for i, r in enumerate(live):
        pos = torch.arange(r["len"])
        blocks = torch.tensor(r["blocks"])[pos // ps].to(ckv.device)
        offs = (pos % ps).to(ckv.device)
        kv = torch.cat([ckv[blocks, offs], kpe[blocks, offs]], dim=-1).double()  # [L, 576], this request's rows only
        q = queries[layer, i].double().to(kv.device)  # [H, 576]
        p = torch.softmax(q @ kv.T / math.sqrt(192), dim=-1)
        out.append(p @ kv[:, :CKV])
    return torch.stack(out)


def padded_size(batch, sizes):
    return next(s for s in sizes if s >= batch)


def run_config(args, heads, page_size, device):
    rng = random.Random(args.seed + heads * 7 + page_size)
    names = ["mlacore", "flashinfer"] if args.backend == "both" else [args.backend]
    engines = [Engine(n, args, heads, page_size, device) for n in names]
    reqs = Requests(rng, args.num_blocks, page_size, args.max_batch, args.max_prompt, args.max_new)
    sizes = [s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if s < args.max_batch] + [args.max_batch]
    print(f"== heads={heads} page_size={page_size} layers={args.layers} backends={'+'.join(names)} device={device}")
    worst, failures, qgen = 0.0, 0, torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        # 1. scheduling: arrivals every third step (their whole prompt is written), one token for the others
        arrivals = []
        if step % 3 == 0 or not reqs.live:
            arrivals = reqs.admit(max(1, args.max_batch // 2) if step == 0 else rng.randint(1, max(1, args.max_batch // 4)))
        new_tokens = [(r, p) for r, first in arrivals for p in range(first, r["len"])]
        new_tokens += reqs.grow(skip={r["id"] for r, _ in arrivals})
        live = list(reqs.live)
        # 2-3. the cache write of every layer
        for layer in range(args.layers):
            data = torch.stack([token_data(r["id"], p, layer, torch.bfloat16, "cpu") for r, p in new_tokens])
            data = data.to(device)
            for e in engines:
                e.write(new_tokens, layer, data, live)
        # 4. plan + graph replay of every layer's attention
        B = len(live)
        padded = padded_size(B, sizes)
        queries = (torch.randn(args.layers, B, heads, CKV + KPE, generator=qgen) * 0.5).to(torch.bfloat16).to(device)
        results = [e.attend(live, padded, queries) for e in engines]
        line = f"step {step:3d} batch {B:3d} (graph {padded:3d}) max_len {max(r['len'] for r in live):5d}  " + \
               "  ".join(f"{e.name} {ms:7.3f} ms" for e, (_, ms) in zip(engines, results))
        if len(results) == 2:
            diff = (results[0][0].float() - results[1][0].float()).abs().max().item()
            worst = max(worst, diff)
            ok = diff <= args.atol
            failures += not ok
            line += f"  max|mlacore-flashinfer| {diff:.2e}{'' if ok else '  MISMATCH'}"
        if device.type == "cpu" or step == 0:
            for e, (out, _) in zip(engines, results):
                ref_worst = 0.0
                for layer in range(args.layers):
                    want = reference(e, live, queries, layer).to(out.device)
                    ref_worst = max(ref_worst, (out[layer].double() - want).abs().max().item())
                ok = ref_worst <= args.atol
                failures += not ok
                worst = max(worst, ref_worst)
                line += f"  max|{e.name}-ref| {ref_worst:.2e}{'' if ok else '  MISMATCH'}"
        print(line, flush=True)
        reqs.retire()
        if not reqs.live:
            reqs.admit(1)
    return failures, worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["mlacore", "flashinfer", "both"], default="mlacore")
    p.add_argument("--device", default="cuda", help="cuda (graphs) or cpu (eager dry check, mlacore only)")
    p.add_argument("--heads", type=int, nargs="+", default=[16, 128])
    p.add_argument("--page-size", type=int, nargs="+", default=[1, 64])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=3000)
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--num-blocks", type=int, default=None, help="cache pages per layer (default: enough)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs on the GPU either")
    p.add_argument("--atol", type=float, default=2e-2, help="tolerance of the output checks")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        if args.backend != "mlacore":
            p.error("--device cpu runs mlacore only (FlashInfer needs a GPU)")
        args.eager = True
        # The float64 reference is slow: a small batch of short requests unless asked otherwise.
        for flag, name, small in (("--max-prompt", "max_prompt", 200), ("--max-batch", "max_batch", 4)):
            if flag not in (argv if argv is not None else sys.argv):
                setattr(args, name, small)
    elif not torch.cuda.is_available():
        p.error("no CUDA device: use --device cpu for the dry check")
    total_fail = 0
    asked_blocks = args.num_blocks
    for heads in args.heads:
        for page_size in args.page_size:
            # Pages for every request at its longest, twice over; per configuration, so page size 64
            # does not inherit page size 1's pool (--num-blocks raises it).
            need = args.max_batch * (-(-(args.max_prompt + args.max_new + 1) // page_size) + 1) * 2
            args.num_blocks = max(asked_blocks or 0, need)
            fails, worst = run_config(args, heads, page_size, device)
            total_fail += fails
            print(f"   heads={heads} page_size={page_size}: {'OK' if not fails else f'{fails} checks failed'} "
                  f"(worst difference {worst:.2e})")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
