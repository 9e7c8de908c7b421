"""Benchmark: ours vs eager reference vs torch.compile vs fla, same run, KernelBench timing.

    python bench.py --out DIR [--shapes S0,S1,...] [--sweep] [--configs] [--compile] [--eager-max-s 1.0]
                    [--decode] [--benchmarks BENCHMARKS.md] [--from-json DIR/bench.json]

An empty --shapes ("") measures no shape (with --decode: the decode table alone).

--sweep adds the T sweeps (B=1, H=8, D=128, fp32 and bf16, T = 256 .. 65536) and DIR/bench.png, time
against T on log-log axes for ours, fla, eager and the floor, both dtypes.

Floors, measured in the same run (bench.json's "rates"): memory = the bytes of q, k, v, gate, beta read
and y written over the bandwidth of a 1 GiB device copy; compute = the chunked form's multiply-adds
(chunks of 64: 2 C (D_k + D_v) + 4 D_k D_v flops a token and head) times the terms the accuracy bar needs
(bf16: hi + lo, 2; fp32: 3xTF32, 3; fp16: one TF32 product) over the measured rate of a large bf16 or
TF32 torch.matmul. The table shows both and ours over the larger. The count is issue 14's definition (every
product with the full split and the whole C x C block), and torch's TF32 rate is below our own wgmma
probe's (dev/wgmma_probe.py): a reference level for the chunked form, not a strict lower bound.

Per-call time: CUDA events around one call, synchronize after it, 256 MB L2 flush before it,
3 warm-ups, median of --trials calls (KernelBench's method). Writes DIR/bench.json and
DIR/bench.md (the table for BENCHMARKS.md). fla runs when importable, with g = log(gate),
k * beta and scale = 1.0 prepared outside the timed region.

With S0 (the KernelBench shape) among the shapes, a second table sets ours beside its floor, an
output allocation plus one tiny kernel (`torch.empty_like(v).zero_()`), in fp32, fp16 and bf16:
KernelBench median and mean, CUDA-graph replay per call, and host time per call (perf_counter around
2000 calls without synchronizing).

--decode adds table D1, the in-place decode step (gated_recurrence_decode_) at T = 1, H = 32,
D_k = D_v = 128, bf16 inputs, a float32 pool of B slots named by a random permutation (int64), B = 1 .. 512:
ours by KernelBench median (L2 flushed) and by CUDA-graph replay (one call captured, replayed 200 times
between two events, no flush), its bytes (states read and written, q, k, v, y, gate, beta, indices) over
the run's copy bandwidth as the memory floor, today's path (gated_recurrence from a gathered S_0 with
output_final_state=True, S_0 prepared outside the timed region, no scatter back) and fla's
fused_recurrent_simple_gla from the same S_0, and y's rel-L2 against naive.recurrent_naive in float64
(B <= 64). bench.json's "decode" (rows) and "decode_floor" (floor_call at B = 1, timed alike).

--benchmarks FILE puts the tables (with the command, date, card and torch version) into FILE between
the lines BEGIN_MARK and END_MARK, leaving the rest of the file alone. --from-json FILE skips the
measurements and regenerates the table (and, with --sweep, the plot) from an earlier bench.json, so
that step runs on a machine without a GPU.
"""
import argparse
import json
import os
import shlex
import sys
import time

import torch

import naive
import reference
from timing import call_times_us, floor_call, kernelbench_time, rel_l2

SHAPES = {  # name: (B, T, H, D, dtype)
    "S0": (2, 128, 4, 24, torch.float32),
    "S1": (4, 1024, 8, 64, torch.float32),
    "S2": (8, 2048, 16, 128, torch.float32),
    "S3": (1, 8192, 8, 128, torch.float32),
    "S2-bf16": (8, 2048, 16, 128, torch.bfloat16),
    "S3-bf16": (1, 8192, 8, 128, torch.bfloat16),
    "S4": (16, 4096, 32, 128, torch.float32),
    "S4-bf16": (16, 4096, 32, 128, torch.bfloat16),
}
SWEEP_T = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SWEEP = {**{f"T{T}": (1, T, 8, 128, torch.float32) for T in SWEEP_T},
         **{f"T{T}-bf16": (1, T, 8, 128, torch.bfloat16) for T in SWEEP_T}}
FLOOR_CHUNK = 64  # the chunk of the compute floor's count
SPLIT = {"float32": 3, "bfloat16": 2, "float16": 1}  # product terms the accuracy bar needs


def measure_rates():
    """The floors' rates on this device, now: a 1 GiB device copy (TB/s, bytes read plus written) and a
    8192^3 torch.matmul in bf16 and in TF32 (TFLOPS)."""
    x = torch.empty(2 ** 28, device="cuda")
    y = torch.empty_like(x)
    t = kernelbench_time(lambda: y.copy_(x), [], trials=10, flush=False)["median"] * 1e-3
    rates = {"copy_TBps": 2 * x.numel() * 4 / t / 1e12}
    del x, y
    n = 8192
    tf32 = torch.backends.cuda.matmul.allow_tf32
    for name, dtype, allow in (("bf16_TFLOPS", torch.bfloat16, tf32), ("tf32_TFLOPS", torch.float32, True)):
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        torch.backends.cuda.matmul.allow_tf32 = allow
        t = kernelbench_time(lambda: a @ b, [], trials=10, flush=False)["median"] * 1e-3
        rates[name] = 2 * n ** 3 / t / 1e12
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return rates


def floors_ms(B, T, H, D, dtype, rates):
    """(memory floor, compute floor) in ms for a (B, T, H, D) call in dtype (its name), at rates."""
    es = 4 if dtype == "float32" else 2
    bytes_ = B * T * H * (4 * D + 2) * es  # q, k, v, y and gate, beta
    flops = B * T * H * (2 * FLOOR_CHUNK * 2 * D + 4 * D * D) * SPLIT[dtype]
    rate = rates["bf16_TFLOPS"] if dtype == "bfloat16" else rates["tf32_TFLOPS"]
    return bytes_ / (rates["copy_TBps"] * 1e12) * 1e3, flops / (rate * 1e12) * 1e3


def fla_peers():
    """fla's two simple-GLA kernels as callables on our inputs, or {} when fla is missing."""
    if os.environ.get("BENCH_NO_FLA") == "1":
        return {}
    from importlib.util import find_spec
    if find_spec("fla") is None:
        print("fla not importable: fla peers skipped", file=sys.stderr)
        return {}
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    return {
        "fla_chunk": (fla_prep, lambda q, kb, v, g: chunk_simple_gla(q, kb, v, g=g, scale=1.0)[0]),
        "fla_fused_recurrent": (fla_prep, lambda q, kb, v, g: fused_recurrent_simple_gla(q, kb, v, g=g, scale=1.0)[0]),
    }


def fla_prep(q, k, v, gate, beta):
    """Our inputs in simple GLA's terms: q, k * beta, v, g = log(gate) in q's dtype."""
    return q, (k * beta.unsqueeze(-1)).contiguous(), v, gate.float().log().to(q.dtype)


def reference64(inputs):
    with torch.no_grad():
        return reference.Model()(*[x.double() for x in inputs])


def bench_shape(name, shape, args, sol, peers):
    B, T, H, D, dtype = shape
    gen = torch.Generator().manual_seed(0)
    inputs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
    row = {"shape": name, "B": B, "T": T, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""),
           "plan": sol.plan(B, T, H, D, D, dtype)}
    ref = reference64(inputs) if args.check else None
    y = sol.gated_recurrence(*inputs)
    if ref is not None:
        row["ours_err"] = rel_l2(y, ref)
    row["ours_ms"] = kernelbench_time(sol.gated_recurrence, inputs, trials=args.trials)["median"]
    model = reference.Model().cuda()
    est = T * 8 * 15e-6  # ~8 launches a step
    if est < args.eager_max_s:
        with torch.no_grad():
            row["eager_ms"] = kernelbench_time(model, inputs, trials=max(3, min(args.trials, int(2 / est))))["median"]
    if args.compile and est < args.eager_max_s:
        t0 = time.time()
        cmodel = torch.compile(model)
        with torch.no_grad():
            cmodel(*inputs)
            row["compile_s"] = time.time() - t0
            row["compile_ms"] = kernelbench_time(cmodel, inputs, trials=args.trials)["median"]
    for pname, (prep, fn) in peers.items():
        pin = prep(*inputs)
        out = fn(*pin)
        if ref is not None:
            row[pname + "_err"] = rel_l2(out, ref)
        row[pname + "_ms"] = kernelbench_time(fn, pin, trials=args.trials)["median"]
    return row


def floor_rows(sol, trials):
    """The KernelBench shape in each dtype: the floor (allocation plus one tiny kernel) and ours, timed
    alike."""
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        inputs = [x.cuda().to(dtype) for x in reference.get_inputs()]
        fns = [("floor: empty_like(v).zero_()", floor_call),
               ("ours: " + sol.plan(2, 128, 4, 24, 24, dtype).split()[0], sol.ModelNew("accurate"))]
        if dtype != torch.float32:  # ModelNew's default there: Model's own rounding, one step at a time
            fns.append(("ModelNew(): recurrent, numerics=reference", sol.ModelNew()))
        for what, fn in fns:
            rows.append({"what": what, "dtype": str(dtype).replace("torch.", ""), **call_times_us(fn, inputs, trials)})
    return rows


def floor_markdown(rows):
    out = ["| KernelBench shape (2,128,4,24) | dtype | KernelBench median | KernelBench mean | CUDA-graph replay / call "
           "| host time / call |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['what']} | {r['dtype']} | {r['kb_median_us']:.2f} us | {r['kb_mean_us']:.2f} us | "
                   f"{r['graph_us']:.2f} us | {r['host_us']:.2f} us |")
    return "\n".join(out)


DECODE_B = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_SHAPE = (1, 32, 128, 128, torch.bfloat16)  # T, H, D_k, D_v, dtype of q, k, v, gate, beta
DECODE_TRIALS = 50  # KernelBench trials a decode measurement
DECODE_REPLAYS = 200  # graph replays between the two events
DECODE_CHECK_MAX_B = 64  # y's error against the float64 loop up to this B


def decode_bytes(B, T, H, Dk, Dv):
    """Bytes one decode call moves: the states read and written (float32), q, k, v, y (bf16), gate and
    beta (bf16) and the int64 indices."""
    return 2 * B * H * Dk * Dv * 4 + B * T * H * (2 * Dk + 2 * Dv) * 2 + 2 * B * T * H * 2 + B * 8


def graph_call_us(fn, args, replays=DECODE_REPLAYS):
    """Per-call time in us of one call captured in a CUDA graph (after a warm-up call on a side stream),
    replayed `replays` times between two CUDA events; no L2 flush."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays * 1e3


def fla_decode_peer():
    """fla's fused_recurrent_simple_gla from given states (the carried fla-core 0.6.0: initial_state
    (B, H, D_k, D_v) float32) as fn(q, k * beta, v, log(gate), S_0) -> y, or None when fla is missing."""
    if os.environ.get("BENCH_NO_FLA") == "1":
        return None
    from importlib.util import find_spec
    if find_spec("fla") is None:
        print("fla not importable: fla decode peer skipped", file=sys.stderr)
        return None
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    def call(q, kb, v, g, s0):
        return fused_recurrent_simple_gla(q, kb, v, g=g, scale=1.0, initial_state=s0, output_final_state=True)[0]
    return call


def decode_inputs(B, gen):
    """Table D1's inputs at batch B: q, k, v, gate, beta (bf16), a float32 pool of B random states and a
    random permutation of the slots as int64 state_indices, all on the device."""
    T, H, Dk, Dv, dtype = DECODE_SHAPE
    xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda", generator=gen)
    pool = torch.randn(B, H, Dk, Dv, generator=gen).cuda()
    idx = torch.randperm(B, generator=gen).cuda()
    return xs, pool, idx


def decode_row(sol, B, rates, fla, gen):
    """One row of table D1: ours (KernelBench and graph replay), its bytes and memory floor, today's path,
    fla, and y's error against the float64 loop (B <= DECODE_CHECK_MAX_B)."""
    T, H, Dk, Dv, dtype = DECODE_SHAPE
    xs, pool, idx = decode_inputs(B, gen)
    s0 = pool[idx].contiguous()  # today's path and fla: the gathered states, outside the timed region
    row = {"B": B, "T": T, "H": H, "D_k": Dk, "D_v": Dv, "dtype": str(dtype).replace("torch.", ""),
           "plan": sol.plan_decode(B, T, H, Dk, Dv, dtype), "bytes": decode_bytes(B, T, H, Dk, Dv)}
    if B <= DECODE_CHECK_MAX_B:
        fresh = pool.clone()
        y = sol.gated_recurrence_decode_(*xs, fresh, idx)
        y_ref, s_ref = naive.recurrent_naive(*xs, initial_state=s0)
        row["y_err"], row["state_err"] = rel_l2(y, y_ref), rel_l2(fresh[idx], s_ref)
        row["today_err"] = rel_l2(sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True)[0], y_ref)
        del fresh
    args = (*xs, pool, idx)
    row["ours_kb_us"] = kernelbench_time(sol.gated_recurrence_decode_, args, trials=DECODE_TRIALS)["median"] * 1e3
    row["ours_graph_us"] = graph_call_us(sol.gated_recurrence_decode_, args)
    row["mem_floor_us"] = row["bytes"] / (rates["copy_TBps"] * 1e12) * 1e6
    row["ours_TBps"] = row["bytes"] / (row["ours_kb_us"] * 1e-6) / 1e12
    today = lambda *x: sol.gated_recurrence(*x, initial_state=s0, output_final_state=True)  # noqa: E731
    row["today_kb_us"] = kernelbench_time(today, xs, trials=DECODE_TRIALS)["median"] * 1e3
    if fla is not None:
        pin = (*fla_prep(*xs), s0)
        if "y_err" in row:
            row["fla_fused_recurrent_err"] = rel_l2(fla(*pin), y_ref)
        row["fla_fused_recurrent_kb_us"] = kernelbench_time(fla, pin, trials=DECODE_TRIALS)["median"] * 1e3
    return row


def decode_floor_row():
    """The launch floor beside table D1: floor_call on D1's B = 1 inputs, by call_times_us and by the
    graph replay ours gets (one call a graph)."""
    xs, _, _ = decode_inputs(1, torch.Generator().manual_seed(0))
    return {"what": "floor: empty_like(v).zero_()", "B": 1, **call_times_us(floor_call, xs, trials=DECODE_TRIALS),
            "graph_call_us": graph_call_us(floor_call, xs)}


def warm_fla(fla, calls=20):
    """fla's first calls (Triton compiles, B = 1 specialized apart) before any row times it."""
    gen = torch.Generator().manual_seed(1)
    for B in (1, 2):
        xs, pool, idx = decode_inputs(B, gen)
        pin = (*fla_prep(*xs), pool[idx].contiguous())
        for _ in range(calls):
            fla(*pin)
    torch.cuda.synchronize()


def decode_rows(sol, rates):
    """Table D1's rows, B = DECODE_B, and its launch floor."""
    fla = fla_decode_peer()
    if fla is not None:
        warm_fla(fla)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in DECODE_B:
        rows.append(decode_row(sol, B, rates, fla, gen))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    return rows, decode_floor_row()


def fmt_us(x):
    return "-" if x is None else (f"{x:.1f}" if x >= 100 else f"{x:.2f}")


def decode_markdown(rows, floor=None, copy_TBps=None):
    """Table D1 with its one-line header (the method) and the launch floor line."""
    T, H, Dk, Dv = (rows[0][k] for k in ("T", "H", "D_k", "D_v"))
    bw = f" ({copy_TBps:.2f} TB/s)" if copy_TBps else ""
    out = [f"Decode step D1, `gated_recurrence_decode_` (T = {T}, H = {H}, D_k = {Dk}, D_v = {Dv}, {rows[0]['dtype']} "
           "inputs, float32 pool of B slots, permuted int64 state_indices): KernelBench median with L2 flush; graph "
           f"replay per call without flush (one call captured, {DECODE_REPLAYS} replays between two events); floor = "
           f"bytes / copy bandwidth of the same run{bw}; today's path = `gated_recurrence(initial_state=S_0, "
           "output_final_state=True)` with S_0 gathered outside the timed region (no scatter back); fla from the same "
           f"S_0; y err = rel-L2 against the float64 loop (B <= {DECODE_CHECK_MAX_B}).", ""]
    out += ["| B | plan | ours KB us | ours graph us | TB/s | memory floor us | ours / floor | today's path us "
            "| fla fused_recurrent us | y err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [str(r["B"]), r["plan"], fmt_us(r["ours_kb_us"]), fmt_us(r["ours_graph_us"]), f"{r['ours_TBps']:.2f}",
                 fmt_us(r["mem_floor_us"]), f"{r['ours_kb_us'] / r['mem_floor_us']:.2f}x", fmt_us(r.get("today_kb_us")),
                 fmt_us(r.get("fla_fused_recurrent_kb_us")), f"{r['y_err']:.1e}" if "y_err" in r else "-"]
        out.append("| " + " | ".join(cells) + " |")
    if floor:
        out += ["", f"Launch floor (`{floor['what'].split(': ', 1)[1]}` on the B = {floor['B']} inputs): KernelBench "
                f"median {floor['kb_median_us']:.2f} us, graph replay {floor['graph_call_us']:.2f} us per call (one "
                f"call a graph, as ours), {floor['graph_us']:.2f} us per call with 20 calls a graph, host "
                f"{floor['host_us']:.2f} us per call."]
    return "\n".join(out)


def tables(result):
    """bench.md: the shapes table (when the run measured shapes), the floor table and the decode table when
    the run has them."""
    parts = [markdown(result["rows"])] if result.get("rows") else []
    if result.get("floor"):
        parts.append(floor_markdown(result["floor"]))
    if result.get("decode"):
        parts.append(decode_markdown(result["decode"], result.get("decode_floor"),
                                     result.get("rates", {}).get("copy_TBps")))
    return "\n\n".join(parts)


def config_sweep(sol, args):
    """Time recurrent launch configurations (R, G, JB, TC) at the shapes given."""
    rows = []
    for name, cfgs in CONFIGS.items():
        B, T, H, D, dtype = SHAPES[name]
        inputs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
        ref = reference64(inputs)
        for cfg in cfgs:
            fn = lambda *x, c=cfg: sol._gated_recurrence_with(*x, kernel="recurrent", config=c)  # noqa: E731
            try:
                err = rel_l2(fn(*inputs), ref)
            except ValueError as e:  # a configuration this shape cannot launch
                print(f"  {name} cfg={cfg} skipped: {e}", flush=True)
                continue
            ms = kernelbench_time(fn, inputs, trials=args.trials)["median"]
            rows.append({"shape": name, "R,G,JB,TC": cfg, "err": err, "ms": ms})
            print(f"  {name} cfg={cfg} err={err:.2e} {ms * 1e3:.1f} us", flush=True)
    return rows


CONFIGS = {  # (R, G, JB, TC); the default plan first
    "S0": [(6, 4, 24, 128), (6, 4, 8, 128), (6, 8, 16, 64), (8, 4, 8, 128)],
    "S1": [(8, 8, 32, 75), (8, 8, 16, 64), (6, 16, 16, 48), (8, 8, 32, 32)],
}


def fmt_ms(x):
    return "-" if x is None else (f"{x * 1e3:.1f} us" if x < 1 else f"{x:.2f} ms")


def markdown(rows):
    # chunk_v2: a column of older stored runs (bf16 rows: the TF32 kernel chunk_bf16 replaced)
    cols = ["ours"] + (["chunk_v2"] if any("chunk_v2_ms" in r for r in rows) else []) + \
        ["eager", "compile", "fla_chunk", "fla_fused_recurrent"]
    floors = any("mem_floor_ms" in r for r in rows)  # runs before the tenth session have none
    fcols = ["memory floor", "compute floor", "ours / floor"] if floors else []
    out = ["| shape | dtype | plan | " + " | ".join(cols + fcols) + " | ours err | fla_chunk err |",
           "|---|---|---|" + "---|" * len(cols + fcols) + "---|---|"]
    for r in rows:
        shape = f"{r['shape']} ({r['B']},{r['T']},{r['H']},{r['D']})"
        cells = [fmt_ms(r.get(c + "_ms")) for c in cols]
        if floors:
            cells += [fmt_ms(r.get("mem_floor_ms")), fmt_ms(r.get("compute_floor_ms")),
                      f"{r['ours_ms'] / max(r['mem_floor_ms'], r['compute_floor_ms']):.1f}x" if "mem_floor_ms" in r else "-"]
        errs = [f"{r[k]:.1e}" if k in r else "-" for k in ("ours_err", "fla_chunk_err")]
        out.append(f"| {shape} | {r['dtype']} | {r['plan']} | " + " | ".join(cells) + " | " + " | ".join(errs) + " |")
    return "\n".join(out)


BEGIN_MARK = "<!-- bench.py: generated table, begin -->"
END_MARK = "<!-- bench.py: generated table, end -->"


def update_benchmarks(path, result):
    """Replace the generated section of a BENCHMARKS.md with this result's table; True if it was there."""
    text = open(path).read()
    if BEGIN_MARK not in text or END_MARK not in text:
        return False
    head, rest = text.split(BEGIN_MARK, 1)
    tail = rest.split(END_MARK, 1)[1]
    body = (f"`python3 {result['command']}` on {result['date']}, {result['device']}, torch {result['torch']}.\n\n"
            + tables(result))
    with open(path, "w") as f:
        f.write(head + BEGIN_MARK + "\n" + body + "\n" + END_MARK + tail)
    return True


def plot(rows, path):
    """Time against T (log-log) for the sweep rows: ours, fla's two kernels, eager where measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["shape"].startswith("T")]
    fig, ax = plt.subplots(figsize=(8, 5))
    series = [("ours_ms", "ours (solution.py)", "C0"), ("ours_v1_ms", "ours, chunk_v1 (earlier run)", "C5"),
              ("fla_chunk_ms", "fla chunk_simple_gla", "C1"), ("fla_fused_recurrent_ms", "fla fused_recurrent_simple_gla", "C2"),
              ("eager_ms", "PyTorch eager", "C3"), ("floor_ms", "floor (the larger of memory and compute)", "k")]
    for dtype, style in (("float32", "-"), ("bfloat16", "--")):  # one colour a series, one line style a dtype
        for key, label, color in series:
            pts = [(r["T"], r[key] if key != "floor_ms" else max(r["mem_floor_ms"], r["compute_floor_ms"]))
                   for r in rows if r.get("dtype", "float32") == dtype and (key in r or (key == "floor_ms" and "mem_floor_ms" in r))]
            if pts:
                ax.plot(*zip(*pts), style, color=color, marker="o" if key != "floor_ms" else None, label=f"{label}, {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (B=1, H=8, D_k=D_v=128; solid fp32, dashed bf16)")
    ax.set_ylabel("ms per call (KernelBench median, L2 flushed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--configs", action="store_true", help="also sweep recurrent_v1 launch configurations")
    ap.add_argument("--sweep", action="store_true", help="add the T sweep and its plot (bench.png)")
    ap.add_argument("--compile", action="store_true", help="add torch.compile of the reference (compiles for minutes)")
    ap.add_argument("--eager-max-s", type=float, default=1.0, help="skip eager where one call would take longer")
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--decode", action="store_true", help="add table D1, the in-place decode step at B = 1 .. 512")
    ap.add_argument("--benchmarks", help="a BENCHMARKS.md whose generated section gets the table")
    ap.add_argument("--from-json", help="regenerate the table and plot from this bench.json; measure nothing")
    args = ap.parse_args()
    if args.from_json:
        result = json.load(open(args.from_json))
    else:
        result = measure(args)
    os.makedirs(args.out, exist_ok=True)
    md = tables(result)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if args.sweep:
        plot(result["rows"], os.path.join(args.out, "bench.png"))
    if args.benchmarks and not update_benchmarks(args.benchmarks, result):
        sys.exit(f"{args.benchmarks} has no '{BEGIN_MARK}' ... '{END_MARK}' section")


def measure(args):
    """Every requested shape, ours and the peers in one process; writes and returns bench.json's dict."""
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA device (or --from-json)")
    import solution as sol
    peers = fla_peers()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "command": shlex.join(["bench.py"] + sys.argv[1:]), "rows": []}
    names = [n for n in args.shapes.split(",") if n] + (list(SWEEP) if args.sweep else [])
    result["rates"] = measure_rates()
    print(json.dumps(result["rates"]), flush=True)
    for name in names:
        row = bench_shape(name, {**SHAPES, **SWEEP}[name], args, sol, peers)
        row["mem_floor_ms"], row["compute_floor_ms"] = floors_ms(row["B"], row["T"], row["H"], row["D"], row["dtype"],
                                                                 result["rates"])
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    if "S0" in names:
        result["floor"] = floor_rows(sol, args.trials)
        print(floor_markdown(result["floor"]), flush=True)
    if args.configs:
        result["configs"] = config_sweep(sol, args)
    if args.decode:
        result["decode"], result["decode_floor"] = decode_rows(sol, result["rates"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
