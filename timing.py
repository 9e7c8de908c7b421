"""Timing and error metrics shared by eval.py, bench.py and the tests (torch only)."""
import statistics
import time

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # KernelBench thrashes 256 MB (H200 L2: 60 MB)
_flush_buf = {}


def flush_l2():
    device = torch.cuda.current_device()
    buf = _flush_buf.get(device)
    if buf is None:
        buf = _flush_buf[device] = torch.empty(L2_FLUSH_BYTES // 8, dtype=torch.int64, device=device)
    buf.fill_(42)


def stats(times_ms):
    return {"median": statistics.median(times_ms), "mean": statistics.fmean(times_ms),
            "std": statistics.pstdev(times_ms), "min": min(times_ms), "max": max(times_ms),
            "num_trials": len(times_ms)}


def kernelbench_time(fn, args, trials=100, warmup=3, flush=True, before=None, after=None):
    """KernelBench's per-call method: warm-ups, then per trial an L2 flush, CUDA events around one
    call and a synchronize after it. Returns stats in milliseconds. `before(i)` and `after(i, out)`
    run outside the timed region of call i (eval.py re-checks outputs on changed inputs there)."""
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for i in range(trials):
        if before is not None:
            before(i)
        if flush:
            flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        if after is not None:
            after(i, out)
    return stats(times)


def graph_replay_time(fn, args, trials=100, calls_per_graph=20):
    """Per-call time from replaying a CUDA graph of `calls_per_graph` calls: launch overhead removed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls_per_graph)
    return stats(times)


def host_us(fn, args, calls=2000):
    """Host time per call in us: perf_counter around `calls` calls, no synchronize (the queue absorbs the
    kernels; the KernelBench timing above cannot see this cost)."""
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    dt = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return dt


def floor_call(q, k, v, gate, beta):
    """The floor row of a call: its output allocation plus one tiny kernel."""
    return torch.empty_like(v).zero_()


def call_times_us(fn, args, trials=100):
    """One call timed three ways, in us: KernelBench median and mean, CUDA-graph replay per call, host."""
    kb = kernelbench_time(fn, args, trials=trials)
    return {"kb_median_us": kb["median"] * 1e3, "kb_mean_us": kb["mean"] * 1e3,
            "graph_us": graph_replay_time(fn, args, trials=50)["median"] * 1e3, "host_us": host_us(fn, args)}


def rel_l2(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out has NaN where ref has none."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any() and not torch.isnan(ref).any():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den > 0 else num
