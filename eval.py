"""Correctness and timing harness for KernelBench problem pairs, stricter than KernelBench.

    python eval.py [--ref reference.py] [--solution solution.py] [--precision fp32|fp16|bf16]
                   [--trials 5] [--perf-trials 100] [--seed 42] [--device cuda|cpu]
                   [--shapes 'B,T,H,D;...'] [--compile] [--backward] [--json PATH]

KernelBench semantics: the problem file gives Model, get_inputs, get_init_inputs; the solution
gives ModelNew. Inputs are moved to the GPU and, for --precision fp16/bf16, floating inputs are
cast. Five correctness trials with fresh seeds (allclose at atol=rtol=1e-4 for fp32, 1e-2 else),
then timing: 3 warm-ups, CUDA events around each single call, 256 MB L2 flush before each.

Each check below is a small named function that returns (ok, reason). Where KernelBench is silent
the checks close its known holes: stale memory, cross-call caching, input mutation, deferred
(side-stream) work, output integrity, scale-aware tolerance, and the static rules.

--backward (for training): every floating input's gradient of <output, dy> against float64 autograd
through the reference, and forward + backward timed against the reference's eager autograd.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import sys
import time

import torch

from timing import graph_replay_time, kernelbench_time, rel_l2

HERE = os.path.dirname(os.path.abspath(__file__))
ATOL_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
REL_L2_TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}
GRAD_ROUNDING_FACTOR = 2.0  # fp16 / bf16 gradients: within 2x the error of float64's gradient rounded to that dtype
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------------------------
# Static rules: the regexes harnesses apply to the whole solution file (comments after '#' or '//'
# stripped per line; docstrings and embedded CUDA strings are checked).
# ------------------------------------------------------------------------------------------------
STATIC_ERRORS = {
    "try/except fallback": [r"\btry\s*:", r"\bexcept\s*:", r"\bexcept\s+\w+"],
    "the word 'pass' (inheritance bypass)": [r"\bpass\b"],
    "threading / multiprocessing": [r"threading\.Thread\s*\(", r"import\s+threading", r"from\s+threading\s+import",
                                    r"multiprocessing\.(Process|Pool|Manager|Queue|Pipe)", r"import\s+multiprocessing",
                                    r"concurrent\.futures", r"ThreadPoolExecutor", r"ProcessPoolExecutor"],
    "tensor subclass / lazy tensor": [r"_make_subclass", r"class\s+\w+.*\(torch\.Tensor\)", r"class\s+\w+.*\(Tensor\)",
                                      r"torch\.Tensor\.__new__"],
    "timer monkey-patching": [r"torch\.cuda\.Event\.record\s*=", r"torch\.cuda\.Event\.elapsed_time\s*=",
                              r"torch\.cuda\.synchronize\s*=", r"torch\.cuda\.Event\s*=", r"time\.perf_counter\s*=",
                              r"time\.time\s*="],
}
STATIC_WARNINGS = {
    "torch.nn compute layer": [r"torch\.nn\.(?!(Module|parameter|Parameter|ParameterList|ParameterDict|ModuleList|ModuleDict|init)\b)"],
    "torch compute op": [r"\btorch\.(mm|bmm|matmul|einsum|softmax|sigmoid|tanh|relu|clamp|logsumexp|linear)(?=\s*\(|\s|$)",
                         r"torch\.nn\.functional\.\w+", r"\bnn\.functional\.\w+"],
    "CUDA streams": [r"torch\.cuda\.Stream\s*\(", r"cuda\.Stream\s*\(", r"with\s+torch\.cuda\.stream",
                     r"\.wait_stream\s*\(", r"\.record_stream\s*\("],
    "precision downgrade": [r"\.half\s*\(", r"\.bfloat16\s*\(", r"torch\.float16\b", r"torch\.bfloat16\b",
                            r"allow_tf32\s*=\s*True", r"set_float32_matmul_precision"],
}


def _strip_comments(code):
    out = []
    for line in code.split("\n"):
        for mark in ("#", "//"):
            if mark in line:
                line = line[: line.index(mark)]
        out.append(line)
    return "\n".join(out)


def _find(rules, code):
    hits = []
    for name, patterns in rules.items():
        for p in patterns:
            m = re.search(p, code)
            if m:
                hits.append(f"{name}: line {code[: m.start()].count(chr(10)) + 1}: {m.group(0)!r}")
                break
    return hits


def static_rules(path):
    """(errors, warnings) of the solution file's text."""
    code = _strip_comments(open(path).read())
    errors = _find(STATIC_ERRORS, code)
    if "__global__" not in code:
        errors.append("no __global__ kernel outside comments")
    if "load_inline" not in code and "cpp_extension" not in code:
        errors.append("no load_inline / cpp_extension")
    return errors, _find(STATIC_WARNINGS, code)


# ------------------------------------------------------------------------------------------------
# Loading and inputs
# ------------------------------------------------------------------------------------------------
def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_inputs(problem, seed, precision, device):
    torch.manual_seed(seed)
    xs = problem.get_inputs()
    return [x.to(device=device, dtype=DTYPES[precision] if x.is_floating_point() else x.dtype)
            if torch.is_tensor(x) else x for x in xs]


def clone_inputs(xs):
    return [x.clone() if torch.is_tensor(x) else x for x in xs]


def upcast(xs):
    return [x.double() if torch.is_tensor(x) and x.is_floating_point() else x for x in xs]


def poison_allocator(device, nbytes=256 << 20):
    """Overwrite freed caching-allocator blocks with NaN so that reused memory holds no answer."""
    if torch.device(device).type == "cuda":
        torch.empty(nbytes // 4, device=device).fill_(float("nan"))
        torch.cuda.synchronize()


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Ctx:
    """What every check needs: the two modules, their models, precision, device and options."""

    def __init__(self, problem, candidate, precision, device, seed, trials):
        self.problem, self.candidate = problem, candidate
        self.precision, self.device, self.seed, self.trials = precision, device, seed, trials
        init = problem.get_init_inputs()
        torch.manual_seed(seed)
        self.ref_model = problem.Model(*init).to(device)
        torch.manual_seed(seed)
        self.new_model = candidate.ModelNew(*init).to(device)

    def inputs(self, k):
        return make_inputs(self.problem, self.seed + 1000 * k + 1, self.precision, self.device)

    def reference(self, xs):
        with torch.no_grad():
            return self.ref_model(*xs)

    def model64(self):
        """A fresh reference model in float64."""
        return self.problem.Model(*self.problem.get_init_inputs()).to(self.device).double()

    def reference64(self, xs):
        """The reference on float64-upcast inputs, when the problem runs in float64; else None."""
        with torch.no_grad():
            out = self.model64()(*upcast(xs))
        return out if torch.is_tensor(out) and out.dtype == torch.float64 else None

    def run(self, xs):
        with torch.no_grad():
            return self.new_model(*xs)


# ------------------------------------------------------------------------------------------------
# Checks: each returns (ok, reason)
# ------------------------------------------------------------------------------------------------
def compare(ctx, out, xs, ref=None, ref64=None):
    """Output integrity, then KernelBench allclose, then scale-aware relative L2 against float64 (ref64:
    the float64 run when the caller has it already)."""
    ref = ctx.reference(xs) if ref is None else ref
    if not torch.is_tensor(out):
        return False, f"output is {type(out).__name__}, not a tensor"
    if out.shape != ref.shape:
        return False, f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        return False, f"output dtype {out.dtype} != reference {ref.dtype}"
    if out.device != ref.device:
        return False, f"output on {out.device}, reference on {ref.device}"
    finite = torch.isfinite(ref)
    if not torch.isfinite(out[finite]).all():
        return False, "non-finite output where the reference is finite"
    tol = ATOL_RTOL[ctx.precision]
    if not torch.allclose(out, ref, atol=tol, rtol=tol, equal_nan=True):
        diff = (out.double() - ref.double()).abs()[finite].max().item()
        return False, f"allclose(atol=rtol={tol}) fails: max abs diff {diff:.3e}"
    ref64 = ctx.reference64(xs) if ref64 is None else ref64
    if ref64 is not None:
        err = rel_l2(out[finite], ref64[finite])
        if err > REL_L2_TOL[ctx.precision]:
            return False, f"relative L2 error {err:.3e} > {REL_L2_TOL[ctx.precision]} against float64"
        if ref64.numel() > 1 and ref64[finite].std() > 0 and out[finite].double().std() == 0:
            return False, "constant output where the reference varies"
    return True, ""


def check_correctness(ctx):
    """KernelBench's trials: fresh seeded inputs, candidate vs reference. The reason also gives the error
    against float64 of both, worst trial: at fp16/bf16 the reference rounds in that precision, so a more
    accurate candidate can fail the harness's allclose while being nearer the exact answer."""
    worst, errors = {"candidate": 0.0, "reference": 0.0}, ""
    for k in range(ctx.trials):
        xs = ctx.inputs(k)
        out, ref = ctx.run(xs), ctx.reference(xs)
        ref64 = ctx.reference64(xs)
        if ref64 is not None and torch.is_tensor(out) and out.shape == ref64.shape and out.device == ref64.device:
            finite = torch.isfinite(ref64)
            worst["candidate"] = max(worst["candidate"], rel_l2(out[finite], ref64[finite]))
            worst["reference"] = max(worst["reference"], rel_l2(ref[finite], ref64[finite]))
            errors = (f"; rel-L2 against float64: candidate {worst['candidate']:.2e}, "
                      f"reference {worst['reference']:.2e}")
        ok, why = compare(ctx, out, xs, ref, ref64)
        if not ok:
            return False, f"trial {k}: {why}{errors}"
    return True, f"{ctx.trials} trials{errors}"


def check_stale_memory(ctx):
    """The candidate runs on fresh inputs before the reference saw them, on NaN-poisoned allocator
    memory, and again while the reference output is alive."""
    xs = ctx.inputs(101)
    poison_allocator(ctx.device)
    out = ctx.run(xs)
    sync(ctx.device)
    first = out.clone()
    ok, why = compare(ctx, first, xs)
    if not ok:
        return False, "first call, before the reference ran: " + why
    xs2 = ctx.inputs(102)
    ref2 = ctx.reference(xs2)
    poison_allocator(ctx.device)
    ok, why = compare(ctx, ctx.run(xs2), xs2, ref2)
    return (True, "") if ok else (False, "while the reference output was alive: " + why)


def check_cross_call_caching(ctx):
    """Input set B copied into the same tensors as A (same data_ptr and objects): both right."""
    xs = ctx.inputs(201)
    ok, why = compare(ctx, ctx.run(xs).clone(), clone_inputs(xs))
    if not ok:
        return False, "input set A: " + why
    for x, y in zip(xs, ctx.inputs(202)):
        if torch.is_tensor(x):
            x.copy_(y)
    ok, why = compare(ctx, ctx.run(xs), xs)
    return (True, "") if ok else (False, "input set B in A's tensors: " + why)


def check_input_mutation(ctx):
    xs = ctx.inputs(301)
    before = clone_inputs(xs)
    ctx.run(xs)
    sync(ctx.device)
    for i, (x, b) in enumerate(zip(xs, before)):
        if torch.is_tensor(x) and not torch.equal(x, b) and not (x.isnan().equal(b.isnan()) and
                                                               torch.equal(x.nan_to_num(), b.nan_to_num())):
            return False, f"input {i} was modified by the candidate"
    return True, ""


def check_deferred_work(ctx):
    """The output must be right once the current stream is done (no device-wide sync), and the
    CUDA-event time must agree with host wall time around a full synchronize."""
    if torch.device(ctx.device).type != "cuda":
        return True, "skipped on CPU"
    xs = ctx.inputs(401)
    ref = ctx.reference(xs)
    torch.cuda.synchronize()
    out = ctx.run(xs)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()  # the current stream only
    snapshot = out.clone() if torch.is_tensor(out) else out
    torch.cuda.current_stream().synchronize()
    ok, why = compare(ctx, snapshot, xs, ref)
    if not ok:
        return False, "output not ready when the current stream finished: " + why
    ev, wall = [], []
    for _ in range(10):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        ctx.run(xs)
        end.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ev.append(start.elapsed_time(end))
    ev_med, wall_med = sorted(ev)[5], sorted(wall)[5]
    if wall_med > 3 * ev_med + 0.5:  # ms: launch overhead and Python stay well under this
        return False, f"event time {ev_med:.3f} ms but synchronized wall time {wall_med:.3f} ms: work outside the timed stream"
    return True, f"event {ev_med:.3f} ms, wall {wall_med:.3f} ms"


def check_output_integrity(ctx):
    """No storage shared with an input, and not a buffer that a later call overwrites."""
    xs = ctx.inputs(501)
    out = ctx.run(xs)
    keep = out.clone()
    ptrs = {x.untyped_storage().data_ptr() for x in xs if torch.is_tensor(x)}
    if out.untyped_storage().data_ptr() in ptrs:
        return False, "output shares storage with an input"
    ctx.run(ctx.inputs(502))
    sync(ctx.device)
    if not torch.equal(out.nan_to_num(), keep.nan_to_num()):
        return False, "output of call 1 changed during call 2 (a persistent buffer)"
    return compare(ctx, out, xs)


def check_timing_rechecks(ctx, samples=5):
    """Outputs stay right on changed inputs in the same tensors, call after call. When timing runs,
    time_models repeats this inside the timed loop and its result replaces this one."""
    xs = ctx.inputs(601)
    for k in range(samples):
        for x, y in zip(xs, ctx.inputs(602 + k)):
            if torch.is_tensor(x):
                x.copy_(y)
        ok, why = compare(ctx, ctx.run(xs), xs)
        if not ok:
            return False, f"timed call {k} on changed inputs: {why}"
    return True, ""


def grad_inputs(ctx, k):
    """Input set k with every floating tensor a fresh leaf that requires grad, and the indices of those."""
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) if torch.is_tensor(x) else x for x in ctx.inputs(k)]
    return xs, [i for i, x in enumerate(xs) if torch.is_tensor(x) and x.requires_grad]


def output_grad(ctx, out, k):
    """A fixed random dy of the output's shape (float64 on the CPU: each side casts it)."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(ctx.seed + k), dtype=torch.float64)


def check_gradients(ctx):
    """The candidate's gradients of <out, dy> for every floating input against float64 autograd through the
    reference (inputs upcast after the precision's cast): present, in the input's dtype and shape, finite where
    float64's is, and within the bar: fp32 relative L2 1e-5; fp16 / bf16 twice the error of float64's gradient
    rounded to that dtype."""
    xs, idx = grad_inputs(ctx, 801)
    with torch.enable_grad():
        out = ctx.new_model(*xs)
    if not torch.is_tensor(out) or not out.requires_grad:
        return False, "the output does not require grad: the candidate has no backward"
    dy = output_grad(ctx, out, 801)
    got = torch.autograd.grad(out, [xs[i] for i in idx], dy.to(out.device, out.dtype), allow_unused=True)
    xs64 = [x.detach().double().requires_grad_(True) if i in idx else x for i, x in enumerate(xs)]
    with torch.enable_grad():
        out64 = ctx.model64()(*xs64)
    want = torch.autograd.grad(out64, [xs64[i] for i in idx], dy.to(out64.device), allow_unused=True)
    worst = 0.0
    for i, g, w in zip(idx, got, want):
        if w is None:  # the reference does not depend on this input
            continue
        if g is None:
            return False, f"input {i}: no gradient where the reference has one"
        if g.shape != xs[i].shape or g.dtype != xs[i].dtype:
            return False, f"input {i}: gradient {tuple(g.shape)} {g.dtype}, input {tuple(xs[i].shape)} {xs[i].dtype}"
        finite = torch.isfinite(w)
        if not torch.isfinite(g[finite]).all():
            return False, f"input {i}: non-finite gradient where float64's is finite"
        err = rel_l2(g[finite], w[finite])
        bar = REL_L2_TOL["fp32"] if g.dtype == torch.float32 else \
            max(GRAD_ROUNDING_FACTOR * rel_l2(w.to(g.dtype)[finite], w[finite]), 1e-7)
        if err > bar:
            return False, f"input {i}: gradient relative L2 error {err:.3e} > {bar:.3e} against float64"
        worst = max(worst, err)
    return True, f"{len(idx)} inputs, worst gradient rel-L2 {worst:.2e} against float64"


def time_training(ctx, perf_trials):
    """Forward + backward (autograd.grad of <out, dy> for every floating input) of candidate and reference."""
    res = {}
    for name, model in (("candidate", ctx.new_model), ("reference", ctx.ref_model)):
        xs, idx = grad_inputs(ctx, 0)
        with torch.enable_grad():
            dy = output_grad(ctx, model(*xs), 0).to(ctx.device, xs[idx[0]].dtype)

            def step(*a, model=model):
                return torch.autograd.grad(model(*a), [a[i] for i in idx], dy, allow_unused=True)
            res[name] = kernelbench_time(step, xs, trials=perf_trials if name == "candidate" else min(perf_trials, 10))
    res["speedup_median"] = res["reference"]["median"] / res["candidate"]["median"]
    return res


CHECKS = [
    ("correctness", check_correctness),
    ("stale_memory", check_stale_memory),
    ("cross_call_caching", check_cross_call_caching),
    ("input_mutation", check_input_mutation),
    ("deferred_work", check_deferred_work),
    ("output_integrity", check_output_integrity),
    ("timing_rechecks", check_timing_rechecks),
]


# ------------------------------------------------------------------------------------------------
# Timing and report
# ------------------------------------------------------------------------------------------------
def time_models(ctx, perf_trials, compile_ref, recheck_every=10):
    """Times candidate and reference. Every `recheck_every`-th timed candidate call first gets new
    inputs copied into the same tensors; its output is checked against the reference afterwards."""
    xs = ctx.inputs(0)
    res, saved = {}, []

    def before(i):
        if i % recheck_every == recheck_every - 1:
            for x, y in zip(xs, ctx.inputs(700 + i)):
                if torch.is_tensor(x):
                    x.copy_(y)

    def after(i, out):
        if i % recheck_every == recheck_every - 1:
            saved.append((i, clone_inputs(xs), out.clone()))

    with torch.no_grad():
        res["candidate"] = kernelbench_time(ctx.new_model, xs, trials=perf_trials, before=before, after=after)
        res["rechecks"] = (True, f"{len(saved)} timed calls re-checked")
        for i, inputs, out in saved:
            ok, why = compare(ctx, out, inputs)
            if not ok:
                res["rechecks"] = (False, f"timed call {i} on changed inputs: {why}")
                break
        res["candidate_graph"] = graph_replay_time(ctx.new_model, xs, trials=20)
        res["reference"] = kernelbench_time(ctx.ref_model, xs, trials=perf_trials)
        if compile_ref:
            print("eval.py: torch.compile of the reference: this can take minutes", file=sys.stderr, flush=True)
            cmodel = torch.compile(ctx.ref_model)
            t0 = time.time()
            cmodel(*xs)
            res["compile_seconds"] = time.time() - t0
            res["compiled_reference"] = kernelbench_time(cmodel, xs, trials=perf_trials)
    return res


def check_shapes(ctx, shapes, perf_trials, timing):
    """Correctness (and times) at extra shapes, through the problem's make_inputs(B, T, H, D...)."""
    rows = []
    make = getattr(ctx.problem, "make_inputs", None)
    for shape in shapes:
        if make is None:
            rows.append({"shape": shape, "ok": False, "reason": "the problem has no make_inputs helper"})
            continue
        gen = torch.Generator().manual_seed(ctx.seed)
        xs = make(*shape, dtype=DTYPES[ctx.precision], device=ctx.device, generator=gen)
        ok, why = compare(ctx, ctx.run(xs), xs)
        row = {"shape": shape, "ok": ok, "reason": why}
        if ok and timing and torch.device(ctx.device).type == "cuda":
            with torch.no_grad():
                row["runtime_ms"] = kernelbench_time(ctx.new_model, xs, trials=perf_trials)["median"]
                row["ref_runtime_ms"] = kernelbench_time(ctx.ref_model, xs, trials=min(perf_trials, 5))["median"]
        rows.append(row)
    return rows


def evaluate(ref_path, sol_path, precision="fp32", trials=5, perf_trials=100, seed=42, device="cuda",
             compile_ref=False, timing=True, shapes=(), backward=False):
    """Run every check (backward: also the gradients, and training's forward + backward timed); returns a
    dict with KernelBench's field names plus ours."""
    result = {"compiled": False, "correctness": False, "metadata": {}, "runtime": -1.0, "runtime_stats": {},
              "ref_runtime": -1.0, "ref_runtime_stats": {}, "checks": {}}
    errors, warnings = static_rules(sol_path)
    result["checks"]["static_rules"] = {"ok": not errors, "reason": "; ".join(errors)}
    result["metadata"]["static_warnings"] = warnings
    problem = load_module(ref_path, "eval_problem")
    t0 = time.time()
    candidate = load_module(sol_path, "eval_candidate")
    result["metadata"]["load_seconds"] = round(time.time() - t0, 2)
    result["compiled"] = True
    ctx = Ctx(problem, candidate, precision, device, seed, trials)
    for name, fn in CHECKS + ([("gradients", check_gradients)] if backward else []):
        ok, why = fn(ctx)
        result["checks"][name] = {"ok": bool(ok), "reason": why}
    if shapes:
        result["shapes"] = check_shapes(ctx, shapes, perf_trials, timing)
        result["checks"]["extra_shapes"] = {"ok": all(r["ok"] for r in result["shapes"]),
                                            "reason": "; ".join(f"{r['shape']}: {r['reason']}" for r in result["shapes"] if not r["ok"])}
    result["correctness"] = all(c["ok"] for c in result["checks"].values())
    if timing and result["correctness"] and torch.device(device).type == "cuda":
        res = time_models(ctx, perf_trials, compile_ref)
        ok, why = res["rechecks"]
        result["checks"]["timing_rechecks"] = {"ok": ok, "reason": why}
        result["correctness"] = result["correctness"] and ok
        result["runtime"], result["runtime_stats"] = res["candidate"]["mean"], res["candidate"]
        result["ref_runtime"], result["ref_runtime_stats"] = res["reference"]["mean"], res["reference"]
        result["metadata"]["graph_replay"] = res["candidate_graph"]
        result["metadata"]["speedup_median"] = res["reference"]["median"] / res["candidate"]["median"]
        if "compiled_reference" in res:
            result["metadata"]["compiled_reference"] = res["compiled_reference"]
            result["metadata"]["compile_seconds"] = res["compile_seconds"]
            result["metadata"]["speedup_vs_compile"] = res["compiled_reference"]["median"] / res["candidate"]["median"]
        result["metadata"]["device"] = torch.cuda.get_device_name()
        if backward:
            result["metadata"]["training"] = time_training(ctx, perf_trials)
    return result


def report(result):
    lines = ["check                 ok    reason", "-" * 72]
    for name, c in result["checks"].items():
        lines.append(f"{name:<21} {'PASS' if c['ok'] else 'FAIL':<5} {c['reason']}")
    for w in result["metadata"].get("static_warnings", []):
        lines.append(f"{'static warning':<21} {'':<5} {w}")
    if result["runtime"] > 0:
        cand, ref = result["runtime_stats"], result["ref_runtime_stats"]
        g = result["metadata"]["graph_replay"]
        lines += ["", "timing (ms)           median    mean      std       min       max",
                  "-" * 72]
        rows = [("candidate", cand), ("candidate (graph)", g), ("reference", ref)]
        if "compiled_reference" in result["metadata"]:
            rows.append(("torch.compile(ref)", result["metadata"]["compiled_reference"]))
        for name, s in rows:
            lines.append(f"{name:<21} {s['median']:<9.4f} {s['mean']:<9.4f} {s['std']:<9.4f} {s['min']:<9.4f} {s['max']:.4f}")
        lines.append(f"\nspeedup over eager reference (median): {result['metadata']['speedup_median']:.1f}x")
        if "speedup_vs_compile" in result["metadata"]:
            lines.append(f"speedup over torch.compile (median): {result['metadata']['speedup_vs_compile']:.1f}x")
        if "training" in result["metadata"]:
            tr = result["metadata"]["training"]
            lines.append(f"forward + backward (ms, median): candidate {tr['candidate']['median']:.4f}, "
                         f"reference {tr['reference']['median']:.4f}: {tr['speedup_median']:.1f}x")
    for r in result.get("shapes", []):
        t = f"{r['runtime_ms']:.4f} ms vs reference {r['ref_runtime_ms']:.4f} ms" if "runtime_ms" in r else ""
        lines.append(f"shape {str(r['shape']):<19} {'PASS' if r['ok'] else 'FAIL':<5} {r['reason'] or t}")
    lines.append(f"\nverdict: {'CORRECT' if result['correctness'] else 'INCORRECT'}")
    return "\n".join(lines)


class _HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormat)
    ap.add_argument("--ref", default=os.path.join(HERE, "reference.py"),
                    help="the KernelBench problem: Model, get_inputs, get_init_inputs")
    ap.add_argument("--solution", default=os.path.join(HERE, "solution.py"), help="the candidate: ModelNew")
    ap.add_argument("--precision", choices=list(DTYPES), default="fp32",
                    help="cast Model, ModelNew and the inputs to this precision, as KernelBench does")
    ap.add_argument("--trials", type=int, default=5, help="correctness trials, each on fresh random inputs")
    ap.add_argument("--perf-trials", type=int, default=100, help="timed calls (median of these)")
    ap.add_argument("--seed", type=int, default=42, help="seed of the first trial's inputs")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu: correctness checks only, for pure-torch pairs")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the reference (compiles for minutes)")
    ap.add_argument("--shapes", default="", help="extra shapes for the problem's make_inputs, e.g. '2,63,3,33;1,1024,8,64'")
    ap.add_argument("--backward", action="store_true",
                    help="also check every floating input's gradient against float64 autograd through the reference, "
                         "and time forward + backward")
    ap.add_argument("--json", help="write KernelBench's fields plus ours here")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("eval.py: no CUDA device is visible; this harness times CUDA kernels and needs one "
              "(use --device cpu for the correctness checks of a pure-torch pair)", file=sys.stderr)
        return 2
    if not args.device.startswith("cuda") and re.search(r"\bload_inline\s*\(|\bload\s*\(\s*name\s*=", open(args.solution).read()):
        print(f"eval.py: {args.solution} compiles CUDA kernels and needs a CUDA device; --device cpu runs "
              "only pure-torch pairs", file=sys.stderr)
        return 2
    shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part.strip()]
    result = evaluate(args.ref, args.solution, args.precision, args.trials, args.perf_trials, args.seed,
                      args.device, args.compile, shapes=shapes, backward=args.backward)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    return 0 if result["correctness"] else 1


if __name__ == "__main__":
    sys.exit(main())
