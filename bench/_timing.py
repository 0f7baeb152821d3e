"""Timing helpers. Host time: perf_counter over many calls (the Python-visible
cost of a call). Device time: CUDA events around each call, medians, with the
L2 flushed before every timed call unless the caller says the data is meant
to be warm. CPU time (CPU runs): the fastest of several warmed-up samples."""

import statistics
import time


def host_us_per_call(fn, calls=2000, rounds=7, drain=None, burst=64):
    """Median over rounds of the mean host time of one call, in microseconds.

    With `drain` (a device synchronize), each round times bursts of `burst`
    calls and drains the device between bursts, untimed: a kernel that runs
    longer than its launch takes would otherwise fill the launch queue and
    make the host wait, timing the device instead of the call."""
    return host_us_paired([fn], calls, rounds, drain, burst)[0]


def host_us_paired(fns, calls=2000, rounds=7, drain=None, burst=64):
    """host_us_per_call for several callables whose ratio is the point, timed in
    alternation: each round times every fn once (the order rotating by round),
    so drift of the machine between rounds (clocks, the GPU's idle state) hits
    all of them alike. Returns one median per fn, in microseconds."""
    for fn in fns:
        for _ in range(min(calls, 200)):
            fn()
    if drain is not None:
        drain()
    per_fn = [[] for _ in fns]
    for r in range(rounds):
        for k in range(len(fns)):
            i = (k + r) % len(fns)
            per_fn[i].append(_round_us(fns[i], calls, drain, burst))
    return [statistics.median(v) for v in per_fn]


def _round_us(fn, calls, drain, burst):
    """Mean host time of one call over `calls` calls (bursts of `burst` with `drain`)."""
    spent, done = 0.0, 0
    while done < calls:
        n = min(burst if drain is not None else calls, calls - done)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        spent += time.perf_counter() - t0
        done += n
        if drain is not None:
            drain()
    return spent / calls * 1e6


class L2Flush:
    """Writes a buffer larger than the L2 so the next kernel starts cold."""

    def __init__(self, device, nbytes=256 << 20):
        import torch

        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self):
        self.buf.zero_()


def device_ms(fn, repeats=50, warmup=5, flush=None, settle_s=0.1):
    """Median device time of fn() in milliseconds, CUDA events, L2 flushed between calls.

    The warm-up runs at least `warmup` calls and at least `settle_s` seconds: right
    after a step that freed and allocated gigabytes (`--mode cat`, a pool row), whatever
    kernel ran first was about 10% slow for tens of milliseconds, longer than five calls,
    so it landed in that row's median (docs/PERFORMANCE.md, Method, has the numbers)."""
    import torch

    t0, done = time.perf_counter(), 0
    while done < warmup or time.perf_counter() - t0 < settle_s:
        if flush is not None:
            flush()
        fn()
        done += 1
        if done % 8 == 0:  # keeps the host within a few calls of the device
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def alternating(measure, fns, rounds):
    """Medians of `measure(fn)` for several callables whose ratios are the point, in
    `rounds` alternating rounds (the order rotating by round), so drift of the
    machine between rounds (clocks, temperature) hits all of them alike: the
    median over rounds of each one's per-round median. None entries give NaN."""
    live = [i for i, fn in enumerate(fns) if fn is not None]
    per = {i: [] for i in live}
    for r in range(rounds):
        for k in range(len(live)):
            i = live[(k + r) % len(live)]
            per[i].append(measure(fns[i]))
    return [statistics.median(per[i]) if i in per else float("nan") for i in range(len(fns))]


def settle(fns, flush=None, settle_s=0.1):
    """Runs the callables in turn (L2 flushed before each) for at least `settle_s`
    seconds: device_ms's warm-up, paid once for a row whose contenders are then
    timed in alternating rounds with settle_s=0 (paid per measurement, it made a
    decode-step row of the append bench take seconds)."""
    import torch

    t0, done = time.perf_counter(), 0
    while done < 2 * len(fns) or time.perf_counter() - t0 < settle_s:
        fn = fns[done % len(fns)]
        if flush is not None:
            flush()
        fn()
        done += 1
        if done % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()


def kernel_us(fns, flush, calls=50, rounds=3):
    """Device time of one call of each callable by the durations of the device work it
    launches (kernels, copies; torch.profiler), in microseconds: what the device spends on
    the call without the ~3 us that CUDA events around a call add on an H200. The L2 is
    flushed before every call (the flush's own kernels, named by profiling it alone, are not
    counted); alternating rounds, the median over rounds of each round's mean per call.
    None entries, and a profiler that records no device activity, give NaN."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def device_events(prof):
        return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush()
        torch.cuda.synchronize()
    flush_names = {e.name for e in device_events(prof)}

    def one_round(fn):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                flush()
                fn()
            torch.cuda.synchronize()
        us = [e.time_range.elapsed_us() for e in device_events(prof) if e.name not in flush_names]
        return sum(us) / calls if us else float("nan")  # no device events: a profiler without CUPTI

    return alternating(one_round, fns, rounds)


def cpu_ms(fn, repeats=20, warmup=3, settle_s=0.05, min_sample_s=0.002):
    """Wall time of fn() on the CPU in milliseconds: the fastest of `repeats` samples.

    The warm-up runs at least `warmup` calls and `settle_s` seconds, so a
    cold first call (page faults, lazy initialization, caches) is never timed.
    A call shorter than `min_sample_s` is timed as the mean of a loop long
    enough to reach it, so microsecond calls are not lost in timer noise. On a
    shared CPU other processes only ever add time (a descheduled thread pool
    stalls a small call for a whole time slice), so the fastest sample, taken
    alike for a call and its baseline, is what keeps their ratio from run to run."""
    t0, done, fastest = time.perf_counter(), 0, float("inf")
    while done < warmup or time.perf_counter() - t0 < settle_s:
        t1 = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - t1)
        done += 1
    inner = max(1, min(10000, int(min_sample_s / max(fastest, 1e-9)) + 1))
    best = float("inf")
    for _ in range(max(repeats, 5)):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e3
