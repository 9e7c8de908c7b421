"""Benchmark: ours vs eager reference vs torch.compile vs fla, same run, KernelBench timing.

    python bench.py --out DIR [--shapes S0,S1,...] [--sweep] [--configs] [--compile] [--eager-max-s 1.0]
                    [--benchmarks BENCHMARKS.md] [--from-json DIR/bench.json]

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

--benchmarks FILE puts the tables (with the command, date, card and torch version) into FILE between
the lines BEGIN_MARK and END_MARK, leaving the rest of the file alone. --from-json FILE skips the
measurements and regenerates the table (and, with --sweep, the plot) from an earlier bench.json, so
that step runs on a machine without a GPU.
"""
import argparse
import json
import os
import sys
import time

import torch

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

    def prep(q, k, v, gate, beta):
        return q, (k * beta.unsqueeze(-1)).contiguous(), v, gate.float().log().to(q.dtype)

    return {
        "fla_chunk": (prep, lambda q, kb, v, g: chunk_simple_gla(q, kb, v, g=g, scale=1.0)[0]),
        "fla_fused_recurrent": (prep, lambda q, kb, v, g: fused_recurrent_simple_gla(q, kb, v, g=g, scale=1.0)[0]),
    }


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


def tables(result):
    """bench.md: the shapes table, and the floor table when the run has one."""
    md = markdown(result["rows"])
    return md + ("\n\n" + floor_markdown(result["floor"]) if result.get("floor") else "")


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
              "date": time.strftime("%Y-%m-%d"), "command": " ".join(["bench.py"] + sys.argv[1:]), "rows": []}
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
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
