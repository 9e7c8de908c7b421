"""Benchmark: ours vs eager reference vs torch.compile vs fla, same run, KernelBench timing.

    python bench.py --out DIR [--shapes S0,S1,...] [--sweep] [--configs] [--compile] [--eager-max-s 1.0]
                    [--decode] [--varlen] [--train [--train-shapes S0,S2,...]] [--benchmarks BENCHMARKS.md]
                    [--from-json DIR/bench.json[,DIR2/bench.json,...]]

An empty --shapes ("") measures no shape (with --decode, --varlen or --train: those tables alone).

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

--varlen adds table V1, packed variable-length prefill: 64 sequences of lengths torch.randint(1, 4097, (64,))
from a CPU generator seeded 0 (140210 tokens, longest 4034), H = 32, D_k = D_v = 128, bf16 inputs drawn as
reference.make_inputs draws them, int32 cu_seqlens. Rows, all in one process, timed in 3 interleaved rounds of
KernelBench medians (fla's rows first each round; a row's time is the median of its three): ours
gated_recurrence(cu_seqlens=..., max_seqlen=..., cu_seqlens_cpu=...) (the serving case), ours with cu_seqlens
alone (its one device-to-host copy included), ours on the same tokens as one dense (32, ceil(total / 32)) batch
(the uniform comparison, target: varlen <= 1.15x it), that batch forced to the kernel the varlen plan takes when
the dense plan takes another (_gated_recurrence_with), fla's chunk_simple_gla with int64 cu_seqlens on the
packed tensors (and with cu_seqlens_cpu too where that fla takes it) and on the dense batch; each row's memory
floor (q, k, v, gate, beta read and y written over the run's copy bandwidth) and plan (plan(..., varlen=True)
with B = sequences and T = the longest). Unless --no-check, y's rel-L2 against the float64 loop on the first 4
sequences truncated to 512 tokens (ours and fla) and whether the unhinted call is bitwise the hinted one.
bench.json's "varlen".

--train adds the training table (forward + backward) at --train-shapes (default S0,S2,S2-bf16,S3-bf16,S4-bf16), inputs
drawn as the shapes table draws them with q, k, v, gate, beta requiring grad and a fixed dy (randn, y's dtype).
Rows: ours forward alone; ours backward alone (_backward_with(dy, None, q, k, v, gate, beta), eagerly); ours
forward + backward (gated_recurrence, then torch.autograd.grad of <y, dy> for all five inputs); fla's
chunk_simple_gla (the forward call of the shapes table) forward alone and forward + backward (autograd.grad for q,
k * beta, v, g), with k * beta and g = log(gate) (float32) made as leaves outside the timed region, so fla's chain
back to k, beta and gate is not timed. Timed in 2 interleaved rounds of KernelBench medians (fla first each round);
a method's time is the min of its rounds'. Unless --no-check, the gradients' rel-L2 on the first B = 1, H = 2 and
T <= 512 of the inputs against float64 autograd through naive.recurrent_naive: ours the max over the five, fla the
max over dq and dv (its others are w.r.t. k * beta and log(gate)). fla is skipped where it is missing or raises.
--fla-640-guard-off runs fla's chunk backward where fla refuses it (fla#640: Triton 3.4 to 3.7.0 on Hopper), for
its time; the fla grad err column then shows how far its gradients are off. bench.json's "train" (a list of rows).

--benchmarks FILE puts the tables (with the command, date, card and torch version) into FILE between
the lines BEGIN_MARK and END_MARK, leaving the rest of the file alone. --from-json FILE skips the
measurements and regenerates the table (and, with --sweep, the plot) from an earlier bench.json, so
that step runs on a machine without a GPU. Several files (comma-separated: runs split over processes or
device calls) merge in order: shapes and training rows concatenated, other tables from the first file that
has them, every run's command named in the generated section.

bench.json is rewritten after every row, so a run stopped at a time limit leaves the rows it finished.
"""
import argparse
import json
import os
import shlex
import statistics
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


def copy_rate():
    """A 1 GiB device copy's rate (TB/s, bytes read plus written); its buffers freed on return."""
    x = torch.empty(2 ** 28, device="cuda")
    y = torch.empty_like(x)
    t = kernelbench_time(lambda: y.copy_(x), [], trials=10, flush=False)["median"] * 1e-3
    return 2 * x.numel() * 4 / t / 1e12


def measure_rates():
    """The floors' rates on this device, now: a 1 GiB device copy (TB/s, bytes read plus written) and a
    8192^3 torch.matmul in bf16 and in TF32 (TFLOPS)."""
    rates = {"copy_TBps": copy_rate()}
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


VARLEN_N = 64  # sequences of table V1
VARLEN_MAX_LEN = 4096  # lengths: torch.randint(1, VARLEN_MAX_LEN + 1, (VARLEN_N,)), CPU generator seeded 0
VARLEN_SHAPE = (32, 128, 128, torch.bfloat16)  # H, D_k, D_v, dtype of q, k, v, gate, beta
VARLEN_UNIFORM_B = 32  # the uniform comparison: the same tokens as this many sequences of equal length
VARLEN_ROUNDS = 3  # interleaved rounds; a row's time is the median of its rounds' KernelBench medians
VARLEN_CHECK_SEQS, VARLEN_CHECK_T = 4, 512  # the float64 check: the first sequences, each truncated


def varlen_lengths():
    """Table V1's sequence lengths (int64, CPU): the issue's draw, about 140K tokens in all."""
    return torch.randint(1, VARLEN_MAX_LEN + 1, (VARLEN_N,), generator=torch.Generator().manual_seed(0))


def varlen_inputs(lengths, gen):
    """Table V1's inputs from one draw of VARLEN_UNIFORM_B * T_u tokens (T_u = ceil(total / VARLEN_UNIFORM_B)):
    the packed (1, total, H, D) tensors, a copy of its first total tokens (storage of their own), with
    cu_seqlens (int32 on the device and on the host), and the uniform dense batch (VARLEN_UNIFORM_B, T_u, H, D)
    of all of them (the same tokens and T_u * VARLEN_UNIFORM_B - total more)."""
    H, Dk, Dv, dtype = VARLEN_SHAPE
    total = int(lengths.sum())
    Tu = -(-total // VARLEN_UNIFORM_B)
    xs = reference.make_inputs(1, VARLEN_UNIFORM_B * Tu, H, Dk, Dv, dtype=dtype, device="cuda", generator=gen)
    packed = [x[:, :total].clone() for x in xs]
    dense = [x.view(VARLEN_UNIFORM_B, Tu, *x.shape[2:]) for x in xs]
    cu_cpu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    return packed, dense, cu_cpu.cuda(), cu_cpu, Tu


def fla_varlen_peer():
    """fla's chunk_simple_gla on packed sequences as fn(q, k * beta, v, log(gate), cu_seqlens int64[, host
    copy]) -> y, and whether this fla takes cu_seqlens_cpu; (None, False) when fla is missing."""
    if os.environ.get("BENCH_NO_FLA") == "1":
        return None, False
    from importlib.util import find_spec
    if find_spec("fla") is None:
        print("fla not importable: fla varlen peers skipped", file=sys.stderr)
        return None, False
    import inspect

    from fla.ops.simple_gla import chunk_simple_gla
    try:
        takes_cpu = "cu_seqlens_cpu" in inspect.signature(chunk_simple_gla).parameters
    except (TypeError, ValueError):
        takes_cpu = False

    def call(q, kb, v, g, cu, cu_cpu=None):
        extra = {"cu_seqlens_cpu": cu_cpu} if cu_cpu is not None else {}
        return chunk_simple_gla(q, kb, v, g=g, scale=1.0, cu_seqlens=cu, output_final_state=False, **extra)[0]
    return call, takes_cpu


def varlen_check(y, packed, cu_cpu, refs=None):
    """rel-L2 of y (packed) against the float64 loop on the first VARLEN_CHECK_SEQS sequences, each truncated
    to its first VARLEN_CHECK_T tokens (y's first tokens depend on those alone), and those references (given:
    reused)."""
    spans = []
    for i in range(min(VARLEN_CHECK_SEQS, cu_cpu.numel() - 1)):
        s = int(cu_cpu[i])
        spans.append((s, min(int(cu_cpu[i + 1]), s + VARLEN_CHECK_T)))
    if refs is None:
        refs = [reference64([x[:, s:e] for x in packed]) for s, e in spans]
    return rel_l2(torch.cat([y[:, s:e] for s, e in spans], 1), torch.cat(refs, 1)), refs


def varlen_rows(sol, rates, args):
    """Table V1: packed variable-length prefill (VARLEN_N sequences, VARLEN_SHAPE), ours with and without the
    host hints, ours on the uniform dense batch (planned, and forced to the kernel the varlen plan takes when
    that differs), fla on the packed tensors and on the uniform batch. All rows in one process, VARLEN_ROUNDS
    interleaved rounds of KernelBench medians (fla first each round); returns bench.json's "varlen"."""
    import inspect
    if "cu_seqlens" not in inspect.signature(sol.gated_recurrence).parameters:
        sys.exit("--varlen: solution.gated_recurrence takes no cu_seqlens")
    H, Dk, Dv, dtype = VARLEN_SHAPE
    lengths = varlen_lengths()
    total, max_len = int(lengths.sum()), int(lengths.max())
    packed, dense, cu, cu_cpu, Tu = varlen_inputs(lengths, torch.Generator().manual_seed(0))
    hints = {"cu_seqlens": cu, "max_seqlen": max_len, "cu_seqlens_cpu": cu_cpu}
    plan_varlen = sol.plan(VARLEN_N, max_len, H, Dk, Dv, dtype, varlen=True) or "-"
    plan_uniform = sol.plan(VARLEN_UNIFORM_B, Tu, H, Dk, Dv, dtype) or "-"
    kernel_varlen, kernel_uniform = plan_varlen.split()[0], plan_uniform.split()[0]
    out = {"N": VARLEN_N, "H": H, "D_k": Dk, "D_v": Dv, "dtype": str(dtype).replace("torch.", ""),
           "lengths": lengths.tolist(), "total": total, "max_seqlen": max_len, "uniform_B": VARLEN_UNIFORM_B,
           "uniform_T": Tu, "rounds": VARLEN_ROUNDS, "trials": args.trials, "plan_varlen": plan_varlen,
           "plan_uniform": plan_uniform, "kernel_varlen": kernel_varlen, "kernel_uniform": kernel_uniform}

    ours_hints = lambda *x: sol.gated_recurrence(*x, **hints)  # noqa: E731
    ours_plain = lambda *x: sol.gated_recurrence(*x, cu_seqlens=cu)  # noqa: E731
    # (key, what, fn, args, tokens, plan); the table's order: ours, then fla
    rows = [("ours_varlen_hints", "ours varlen, max_seqlen + cu_seqlens_cpu hints", ours_hints, packed, total,
             plan_varlen),
            ("ours_varlen", "ours varlen, no hints (one device-to-host copy)", ours_plain, packed, total, plan_varlen),
            ("ours_uniform", f"ours uniform dense batch ({VARLEN_UNIFORM_B}, {Tu}), planned", sol.gated_recurrence,
             dense, VARLEN_UNIFORM_B * Tu, plan_uniform)]
    if kernel_varlen not in (kernel_uniform, "-") and hasattr(sol, "_gated_recurrence_with"):
        forced = lambda *x: sol._gated_recurrence_with(*x, kernel=kernel_varlen)  # noqa: E731
        try:
            forced(*dense)
            rows.append(("ours_uniform_kernel", f"ours uniform dense batch ({VARLEN_UNIFORM_B}, {Tu}), forced to "
                         f"{kernel_varlen} (varlen's kernel)", forced, dense, VARLEN_UNIFORM_B * Tu,
                         f"{kernel_varlen} forced (`_gated_recurrence_with(kernel=\"{kernel_varlen}\")`)"))
        except (ValueError, RuntimeError) as e:
            print(f"  dense batch forced to {kernel_varlen} skipped: {e}", flush=True)
    fla, fla_takes_cpu = fla_varlen_peer()
    out["fla_takes_cu_seqlens_cpu"] = fla_takes_cpu
    fla_rows = []
    if fla is not None:
        cu64, cu64_cpu = cu.long(), cu_cpu.long()
        fpacked, fdense = fla_prep(*packed), fla_prep(*dense)
        fla_rows.append(("fla_varlen", "fla chunk_simple_gla, varlen (cu_seqlens int64)",
                         lambda *x: fla(*x, cu64), fpacked, total, "-"))
        if fla_takes_cpu:
            fla_rows.append(("fla_varlen_hints", "fla chunk_simple_gla, varlen, cu_seqlens_cpu given",
                             lambda *x: fla(*x, cu64, cu64_cpu), fpacked, total, "-"))
        fla_rows.append(("fla_uniform", f"fla chunk_simple_gla, uniform dense batch ({VARLEN_UNIFORM_B}, {Tu})",
                         lambda *x: fla(*x, None), fdense, VARLEN_UNIFORM_B * Tu, "-"))
    if args.check:
        y = ours_hints(*packed)
        out["ours_err"], refs = varlen_check(y, packed, cu_cpu)
        out["no_hints_bitwise"] = bool(torch.equal(ours_plain(*packed), y))
        if fla is not None:
            yf = fla(*fla_prep(*packed), cu.long())
            out["fla_err"] = varlen_check(yf, packed, cu_cpu, refs)[0]
            del yf
        out["check"] = {"seqs": len(refs), "max_T": VARLEN_CHECK_T, "tokens": sum(r.shape[1] for r in refs)}
        print(json.dumps({k: out[k] for k in ("ours_err", "fla_err", "no_hints_bitwise") if k in out}), flush=True)
        del y, refs
        torch.cuda.empty_cache()
    order = fla_rows + rows  # measured: fla first each round
    times = {key: [] for key, *_ in order}
    for r in range(VARLEN_ROUNDS):
        for key, what, fn, xs, *_ in order:
            times[key].append(kernelbench_time(fn, xs, trials=args.trials)["median"])
            print(f"  V1 round {r} {key}: {times[key][-1]:.3f} ms", flush=True)
    out["rows"] = []
    for key, what, fn, xs, tokens, plan_text in rows + fla_rows:
        row = {"key": key, "what": what, "ms": statistics.median(times[key]), "ms_rounds": times[key],
               "tokens": tokens, "mem_floor_ms": floors_ms(1, tokens, H, Dk, out["dtype"], rates)[0],
               "plan": plan_text}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    return out


VARLEN_UNIFORM_OF = {"ours_varlen_hints": "ours_uniform", "ours_varlen": "ours_uniform", "ours_uniform": "ours_uniform",
                     "ours_uniform_kernel": "ours_uniform", "fla_varlen": "fla_uniform",
                     "fla_varlen_hints": "fla_uniform", "fla_uniform": "fla_uniform"}


def varlen_markdown(v, copy_TBps=None):
    """Table V1 with its header (the method, the check) and the same-kernel ratio."""
    ms = {r["key"]: r["ms"] for r in v["rows"]}
    bw = f" ({copy_TBps:.2f} TB/s)" if copy_TBps else ""
    errs = [f"{name} {v[k]:.1e}" for name, k in (("ours", "ours_err"), ("fla", "fla_err")) if k in v]
    if errs:
        chk = v.get("check", {})
        check = (f"y err = rel-L2 against the float64 loop on the first {chk.get('seqs', VARLEN_CHECK_SEQS)} "
                 f"sequences, each truncated to {chk.get('max_T', VARLEN_CHECK_T)} tokens: " + ", ".join(errs)
                 + ("; no hints bitwise the hinted call" if v.get("no_hints_bitwise") else
                    "; no hints NOT bitwise the hinted call" if "no_hints_bitwise" in v else "") + ".")
    else:
        check = "no correctness check (--no-check)."
    pad = v["uniform_B"] * v["uniform_T"] - v["total"]
    out = [f"Packed variable-length prefill V1, `gated_recurrence(cu_seqlens=...)` ({v['N']} sequences, lengths "
           f"`torch.randint(1, {VARLEN_MAX_LEN + 1}, ({v['N']},))` seeded 0: {v['total']} tokens, longest "
           f"{v['max_seqlen']}; H = {v['H']}, D_k = {v['D_k']}, D_v = {v['D_v']}, {v['dtype']} inputs, int32 "
           f"cu_seqlens): KernelBench median with L2 flush, the median of {v['rounds']} interleaved rounds' medians "
           f"({v['trials']} trials each, fla first each round); uniform = the same tokens as {v['uniform_B']} "
           f"sequences of T = ceil({v['total']} / {v['uniform_B']}) = {v['uniform_T']} in one dense batch ({pad} "
           "tokens more); / uniform = the row over the uniform batch of the same library (ours: target <= 1.15); "
           "/ fla varlen = the row over fla's chunk_simple_gla on the packed tensors (int64 cu_seqlens); memory "
           f"floor = the bytes of q, k, v, gate, beta read and y written / copy bandwidth of the same run{bw}; "
           + check, ""]
    out += ["| V1 row | ms | tokens | / uniform | / fla varlen | memory floor ms | plan |",
            "|---|---|---|---|---|---|---|"]
    for r in v["rows"]:
        uni, fla = ms.get(VARLEN_UNIFORM_OF.get(r["key"], "")), ms.get("fla_varlen")
        cells = [r["what"], f"{r['ms']:.3f}", str(r["tokens"]), f"{r['ms'] / uni:.2f}x" if uni else "-",
                 f"{r['ms'] / fla:.2f}x" if fla else "-", f"{r['mem_floor_ms']:.3f}", r["plan"]]
        out.append("| " + " | ".join(cells) + " |")
    notes = [f"Plans: varlen `{v['plan_varlen']}`; uniform `{v['plan_uniform']}`."]
    if v["kernel_varlen"] == v["kernel_uniform"]:
        notes.append(f"Both take {v['kernel_varlen']}: the uniform row is the same-kernel comparison.")
    elif "ours_uniform_kernel" in ms and "ours_varlen_hints" in ms:
        notes.append(f"Same kernel ({v['kernel_varlen']}): ours varlen with hints / the uniform batch forced to it = "
                     f"{ms['ours_varlen_hints'] / ms['ours_uniform_kernel']:.2f}x.")
    return "\n".join(out + [""] + [" ".join(notes)])


TRAIN_SHAPES = "S0,S2,S2-bf16,S3-bf16,S4-bf16"  # --train-shapes' default (names of SHAPES or SWEEP)
TRAIN_ROUNDS = 2  # interleaved rounds (fla first each round); a method's time is the min of its rounds' medians
TRAIN_CHECK = (1, 512, 2)  # the gradient check's slice: the first B, T (at most) and H of the timed inputs
GRAD_NAMES = ("dq", "dk", "dv", "dgate", "dbeta")


def fla_train_peer(guard_off=False):
    """fla's training peers, tried in order, as [(name, fn(q, k * beta, v, g) -> o)]: chunk_simple_gla (the
    forward call of fla_peers), then fused_recurrent_simple_gla (fla refuses its chunk backward on Hopper with
    Triton 3.4 to 3.7.0, fla#640); None when fla is missing. guard_off (--fla-640-guard-off): fla's fla#640 check
    switched off, so its chunk backward runs on that Triton, named "chunk, fla#640 guard off": a time for the
    issue's peer, whose gradients fla itself calls wrong there (the gradient check's fla column says how wrong)."""
    if os.environ.get("BENCH_NO_FLA") == "1":
        return None
    from importlib.util import find_spec
    if find_spec("fla") is None:
        print("fla not importable: fla training peer skipped", file=sys.stderr)
        return None
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    name = "chunk"
    if guard_off:
        import fla.ops.common.chunk_o as chunk_o  # its module global, read at call time
        if getattr(chunk_o, "TRITON_ABOVE_3_7_1", True) is False:
            chunk_o.TRITON_ABOVE_3_7_1 = True
            name = "chunk, fla#640 guard off"
    return [(name, lambda q, kb, v, g: chunk_simple_gla(q, kb, v, g=g, scale=1.0)[0]),
            ("fused_recurrent", lambda q, kb, v, g: fused_recurrent_simple_gla(q, kb, v, g=g, scale=1.0)[0])]


def fla_train_leaves(q, k, v, gate, beta):
    """fla's leaves for a training step on our inputs: q, k * beta, v (the inputs' dtype) and g = log(gate) in
    float32, each a leaf requiring grad. k * beta and log(gate) are computed here, outside any timed region, so
    their products and the chain of kb's and g's gradients back to k, beta and gate are never timed."""
    with torch.no_grad():
        kb = (k * beta.unsqueeze(-1)).contiguous()
        g = gate.float().log()
    return [x.detach().requires_grad_() for x in (q, kb, v, g)]


def grad_step(fn, dy):
    """A training step of fn(*leaves) -> y: y, then torch.autograd.grad of <y, dy> for every leaf (fresh
    gradients, nothing accumulated, nothing to zero between calls)."""
    return lambda *xs: torch.autograd.grad(fn(*xs), xs, dy)


def train_check(sol, inputs, dy, fla):
    """Gradient errors on the TRAIN_CHECK slice of the inputs and dy: rel-L2 of ours' dq, dk, dv, dgate, dbeta
    (torch.autograd.grad through gated_recurrence) against float64 autograd through naive.recurrent_naive on
    the same (rounded) inputs, and of fla's dq and dv (its other gradients are w.r.t. k * beta and log(gate));
    returns ({name: err}, {name: err} or None, the slice's (B, T, H))."""
    B, T, H = (min(n, m) for n, m in zip(TRAIN_CHECK, inputs[0].shape[:3]))
    xs = [x.detach()[:B, :T, :H].contiguous() for x in inputs]
    w = dy[:B, :T, :H].contiguous()
    with torch.enable_grad():
        leaves64 = [x.double().requires_grad_() for x in xs]
        ref = torch.autograd.grad(naive.recurrent_naive(*leaves64)[0], leaves64, w.double())
        del leaves64
        leaves = [x.clone().requires_grad_() for x in xs]
        got = torch.autograd.grad(sol.gated_recurrence(*leaves), leaves, w)
        ours = {n: rel_l2(g, r) for n, g, r in zip(GRAD_NAMES, got, ref)}
        theirs = None
        if fla is not None:
            try:
                fl = fla_train_leaves(*xs)
                fg = torch.autograd.grad(fla(*fl), fl, w)
                theirs = {"dq": rel_l2(fg[0], ref[0]), "dv": rel_l2(fg[2], ref[2])}
            except Exception as e:  # noqa: BLE001 (fla's failures: Triton, shapes; its row says so)
                print(f"  fla gradient check skipped: {type(e).__name__}: {e}", flush=True)
    return ours, theirs, (B, T, H)


def train_row(sol, name, shape, args, fla):
    """One row of the training table: ours forward alone, backward alone (_backward_with) and forward + backward
    (autograd), fla's chunk_simple_gla forward and forward + backward, TRAIN_ROUNDS interleaved rounds of
    KernelBench medians (fla first each round, the min of a method's medians), and the gradient errors."""
    B, T, H, D, dtype = shape
    gen = torch.Generator().manual_seed(0)
    inputs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
    dy = torch.randn(B, T, H, D, generator=gen).to("cuda", dtype)  # fixed: made once, as y
    row = {"shape": name, "B": B, "T": T, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""),
           "rounds": TRAIN_ROUNDS, "trials": args.trials, "plan": sol.plan(B, T, H, D, D, dtype) or "-",
           "plan_backward": (sol.plan_backward(B, T, H, D, D, dtype) or "-") if hasattr(sol, "plan_backward") else "-"}
    leaves = [x.detach().requires_grad_() for x in inputs]  # the same storage as inputs
    ours_step = grad_step(sol.gated_recurrence, dy)
    fla_fns, fla_fn = [], None
    for fla_name, fn in fla or []:  # the first of fla's peers that runs this shape
        fl = fla_train_leaves(*inputs)
        try:
            fla_step = grad_step(fn, dy)
            fla_step(*fl)
            torch.cuda.synchronize()
            fla_fns, fla_fn, row["fla_kernel"] = [("fla_fwdbwd", fla_step, fl), ("fla_fwd", fn, [x.detach() for x in fl])], fn, fla_name
            break
        except Exception as e:  # noqa: BLE001 (a shape or dtype this fla cannot run: the row says why)
            row["fla_skipped"] = row.get("fla_skipped", "") + f"{fla_name}: {type(e).__name__}: {e}".splitlines()[0][:160] + " "
            print(f"  train {name}: fla {fla_name} skipped: {row['fla_skipped']}", flush=True)
            del fl
    if args.check:
        row["grad_errs"], fla_errs, row["check_BTH"] = train_check(sol, inputs, dy, fla_fn)
        row["max_grad_err"] = max(row["grad_errs"].values())
        if fla_errs is not None:
            row["fla_grad_errs"] = fla_errs
            row["fla_max_grad_err"] = max(fla_errs.values())
        torch.cuda.empty_cache()
    ours_fns = [("ours_fwdbwd", ours_step, leaves),
                ("ours_bwd", lambda *x: sol._backward_with(dy, None, *x), inputs),
                ("ours_fwd", sol.gated_recurrence, inputs)]  # inputs require no grad: nothing recorded
    order = fla_fns + ours_fns  # fla first each round
    times = {key: [] for key, *_ in order}
    for r in range(TRAIN_ROUNDS):
        for key, fn, xs in order:
            times[key].append(kernelbench_time(fn, xs, trials=args.trials)["median"])
            print(f"  train {name} round {r} {key}: {times[key][-1]:.3f} ms", flush=True)
    for key in ("ours_fwd", "ours_bwd", "ours_fwdbwd", "fla_fwd", "fla_fwdbwd"):
        row[key + "_ms"] = min(times[key]) if key in times else None
    row["rounds_ms"] = times
    row["fla_over_ours"] = row["fla_fwdbwd_ms"] / row["ours_fwdbwd_ms"] if row["fla_fwdbwd_ms"] else None
    return row


def train_rows(sol, args, rows, save):
    """The training table's rows, --train-shapes in order, appended to rows (bench.json's "train"); save() after each."""
    if not hasattr(sol, "_backward_with"):
        sys.exit("--train: solution has no _backward_with (no backward)")
    fla = fla_train_peer(args.fla_640_guard_off)
    for name in [n for n in args.train_shapes.split(",") if n]:
        rows.append(train_row(sol, name, {**SHAPES, **SWEEP}[name], args, fla))
        print(json.dumps(rows[-1]), flush=True)
        save()
        torch.cuda.empty_cache()


def short_plan(text):
    """plan_backward()'s text as one table cell: each line's kernel name ("recurrent_bwd; dq: chunk_sm90")."""
    return "; ".join(ln.split(" (")[0] for ln in text.splitlines()) if text else "-"


def train_markdown(rows):
    """The training table (forward + backward) with its header: the method and the gradient check."""
    r0 = rows[0]
    chk = next((r["check_BTH"] for r in rows if "check_BTH" in r), None)
    check = (f"grad err = rel-L2 against float64 autograd through the loop (naive.recurrent_naive) on the first "
             f"B = {chk[0]}, H = {chk[2]} and T <= {TRAIN_CHECK[1]} of the same inputs and dy: ours the max over dq, "
             "dk, dv, dgate, dbeta; fla the max over dq, dv (its other gradients are w.r.t. k * beta and log(gate))."
             if chk else "no gradient check (--no-check).")
    out = ["Training step (forward + backward), `gated_recurrence` with q, k, v, gate, beta requiring grad and a "
           "fixed dy: KernelBench median with L2 flush, the min over "
           f"{r0['rounds']} interleaved rounds' medians ({r0['trials']} trials each, fla first each round). ours "
           "fwd = the forward alone (no autograd recorded); ours bwd = `_backward_with(dy, None, q, k, v, gate, "
           "beta)` alone, eagerly; ours fwd+bwd = `gated_recurrence` then `torch.autograd.grad` of <y, dy> for all "
           "five inputs. fla = `chunk_simple_gla(q, k * beta, v, g=log(gate), scale=1.0)` (g float32; `fused_recurrent_simple_gla` where the cell names it: fla refuses its chunk backward on Hopper with Triton 3.4-3.7.0, fla#640), fwd+bwd = "
           "then `torch.autograd.grad` for q, k * beta, v, g: k * beta and log(gate) are leaves made outside the "
           "timed region, so their products and the chain of their gradients back to k, beta and gate are not "
           "timed (fla's row does a little less work). " + check, ""]
    out += ["| shape | dtype | ours fwd | ours bwd | ours fwd+bwd | fla fwd | fla fwd+bwd | fla / ours (fwd+bwd) "
            "| ours grad err | fla grad err (dq, dv) | backward plan |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r['shape']} ({r['B']},{r['T']},{r['H']},{r['D']})", r["dtype"], fmt_ms(r.get("ours_fwd_ms")),
                 fmt_ms(r.get("ours_bwd_ms")), fmt_ms(r.get("ours_fwdbwd_ms")), fmt_ms(r.get("fla_fwd_ms")),
                 fmt_ms(r.get("fla_fwdbwd_ms")) + (f" ({r['fla_kernel']})" if r.get("fla_kernel", "chunk") != "chunk" else ""), f"{r['fla_over_ours']:.3f}x" if r.get("fla_over_ours") else "-",
                 f"{r['max_grad_err']:.1e}" if "max_grad_err" in r else "-",
                 f"{r['fla_max_grad_err']:.1e}" if "fla_max_grad_err" in r else "-", short_plan(r.get("plan_backward", "-"))]
        out.append("| " + " | ".join(cells) + " |")
    skipped = [f"{r['shape']}: {r['fla_skipped']}" for r in rows if r.get("fla_skipped")]
    if skipped:
        out += ["", "fla skipped (it raised): " + "; ".join(skipped) + "."]
    return "\n".join(out)


def tables(result):
    """bench.md: the shapes table (when the run measured shapes), the floor table, the decode table, the
    varlen table and the training table when the run has them."""
    parts = [markdown(result["rows"])] if result.get("rows") else []
    if result.get("floor"):
        parts.append(floor_markdown(result["floor"]))
    if result.get("decode"):
        parts.append(decode_markdown(result["decode"], result.get("decode_floor"),
                                     result.get("rates", {}).get("copy_TBps")))
    if result.get("varlen"):
        parts.append(varlen_markdown(result["varlen"], result.get("rates", {}).get("copy_TBps")))
    if result.get("train"):
        parts.append(train_markdown(result["train"]))
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
    runs = result.get("commands") or [result["command"]]
    body = (", ".join(f"`python3 {c}`" for c in runs) + (" (one process each)" if len(runs) > 1 else "")
            + f" on {result['date']}, {result['device']}, torch {result['torch']}.\n\n" + tables(result))
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


def merge_results(results):
    """Several bench.json dicts as one (--from-json A,B,...): the first's device, torch, date and rates; shapes and
    training rows concatenated in order; the floor, decode and varlen tables from the first that has them;
    "commands" lists every run's command."""
    out = dict(results[0])
    out["rows"] = [r for res in results for r in res.get("rows", [])]
    train = [r for res in results for r in res.get("train", [])]
    if train:
        out["train"] = train
    for key in ("floor", "decode", "decode_floor", "varlen", "configs"):
        if key not in out:
            have = [res[key] for res in results if key in res]
            if have:
                out[key] = have[0]
    if len(results) > 1:
        out["commands"] = [res["command"] for res in results]
    return out


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
    ap.add_argument("--varlen", action="store_true",
                    help="add table V1, packed variable-length prefill (64 sequences, H = 32, D = 128, bf16)")
    ap.add_argument("--train", action="store_true",
                    help="add the training table: forward + backward, ours and fla, at --train-shapes")
    ap.add_argument("--train-shapes", default=TRAIN_SHAPES, help="shapes of the training table (names of the shapes "
                    f"and the sweep; default {TRAIN_SHAPES})")
    ap.add_argument("--fla-640-guard-off", action="store_true",
                    help="--train: switch fla's fla#640 check off so that its chunk backward runs (a time; fla calls "
                         "its gradients wrong on that Triton, and the table's fla grad err shows them)")
    ap.add_argument("--benchmarks", help="a BENCHMARKS.md whose generated section gets the table")
    ap.add_argument("--from-json", help="regenerate the table and plot from this bench.json (or several, "
                    "comma-separated, merged); measure nothing")
    args = ap.parse_args()
    unknown = [n for n in args.train_shapes.split(",") if n and n not in {**SHAPES, **SWEEP}]
    if args.train and not args.from_json and unknown:
        ap.error(f"--train-shapes: unknown shapes {', '.join(unknown)} (known: {', '.join(SHAPES)}, T256 .. T65536[-bf16])")
    if args.from_json:
        result = merge_results([json.load(open(f)) for f in args.from_json.split(",") if f])
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
    os.makedirs(args.out, exist_ok=True)

    def save():  # after every row: a run stopped at a time limit keeps what it finished
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)

    result["rates"] = measure_rates()
    print(json.dumps(result["rates"]), flush=True)
    for name in names:
        row = bench_shape(name, {**SHAPES, **SWEEP}[name], args, sol, peers)
        row["mem_floor_ms"], row["compute_floor_ms"] = floors_ms(row["B"], row["T"], row["H"], row["D"], row["dtype"],
                                                                 result["rates"])
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        save()
    if "S0" in names:
        result["floor"] = floor_rows(sol, args.trials)
        print(floor_markdown(result["floor"]), flush=True)
    if args.configs:
        result["configs"] = config_sweep(sol, args)
    if args.decode:
        result["decode"], result["decode_floor"] = decode_rows(sol, result["rates"])
    if args.varlen:
        result["varlen"] = varlen_rows(sol, result["rates"], args)
        torch.cuda.empty_cache()
    if args.train:
        result["train"] = []
        train_rows(sol, args, result["train"], save)
    save()
    return result


if __name__ == "__main__":
    main()
