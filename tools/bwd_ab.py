"""The backward: this solution.py against other copies (--baseline LABEL=PATH, repeatable; e.g.
`git show HEAD~1:solution.py > scratch/old.py`). Every copy's backward unit is built first, all at once. Then
each copy's `_backward_with` gradients against float64 autograd through the loop
(naive.recurrent_backward_naive) on a few cases (odd shapes, gate classes, states, each dtype): the worst
rel-L2 per copy and case. Then KernelBench medians of `_backward_with` per shape (bench.py's SHAPES names,
each with its own dtype), interleaved over --reps rounds.

    python3 tools/bwd_ab.py --baseline mma=ab/mma/solution.py [--shapes S0,S2,S2-bf16,S4-bf16] [--reps 2]
        [--segments 1,2,4]   (this copy with chunk_bwd's segments forced, beside the planned ones)
    (writes $OUT/bwd_ab.json with OUT set)"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from tools.common import add_copy_args, copies, profile_kernels, report, rounds  # noqa: E402

ap = argparse.ArgumentParser()
add_copy_args(ap, "S0,S2,S2-bf16,S4-bf16", reps=2, trials=10)
ap.add_argument("--segments", default="", help="also this solution.py with chunk_bwd's segments forced, e.g. 1,2,4")
args = ap.parse_args()
mods = copies(args, ["backward", "backward_sm90"])
new = mods["new"]

import naive  # noqa: E402
import reference  # noqa: E402
from bench import SHAPES  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402

# (B, T, H, D_k, D_v, dtype, gate class, with states)
CASES = [(2, 100, 3, 128, 128, torch.float32, "sigmoid", True), (1, 67, 2, 33, 100, torch.float32, "negative", False),
         (1, 300, 1, 64, 128, torch.float32, "zeros", True), (2, 70, 2, 7, 5, torch.float32, "above-one", True),
         (2, 130, 2, 128, 128, torch.bfloat16, "sigmoid", True), (1, 65, 2, 100, 64, torch.float16, "negative", False)]
gen = torch.Generator().manual_seed(7)
errs = {}
for B, T, H, Dk, Dv, dtype, gates, states in CASES:
    q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, generator=gen)
    g = {"sigmoid": g, "negative": torch.empty_like(g).uniform_(-1, 1, generator=gen),
         "zeros": g.masked_fill(torch.rand(g.shape, generator=gen) < 0.1, 0.0),
         "above-one": torch.empty_like(g).uniform_(0.9, 1.1, generator=gen)}[gates]
    dy = torch.randn(B, T, H, Dv, generator=gen).to(dtype)
    s0 = torch.randn(B, H, Dk, Dv, generator=gen) if states else None
    dfinal = torch.randn(B, H, Dk, Dv, generator=gen) if states else None
    want = naive.recurrent_backward_naive(q, k, v, g, b, dy, initial_state=s0, d_final_state=dfinal)
    cuda = [x.cuda() for x in (dy, q, k, v, g, b)]
    case = f"{(B, T, H, Dk, Dv)} {str(dtype)[6:]} {gates}{' states' if states else ''}"
    for label, m in mods.items():
        got = m._backward_with(cuda[0], None if dfinal is None else dfinal.cuda(), *cuda[1:],
                               None if s0 is None else s0.cuda())
        worst = max(rel_l2(x.cpu(), w) for x, w in zip(got, want) if w is not None and x is not None)
        errs.setdefault(label, {})[case] = worst
        print(f"err {label:8s} {case}: {worst:.2e}", flush=True)

times = {}
for name in [n for n in args.shapes.split(",") if n]:
    B, T, H, D, dtype = SHAPES[name]
    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
    dy = torch.randn(B, T, H, D, generator=gen).to("cuda", dtype)
    print(name, new.plan_backward(B, T, H, D, D, dtype).splitlines()[0][:100], flush=True)
    runs = [(label, m, {}) for label, m in mods.items()]
    runs += [(f"new seg{n}", new, {"kernel": "chunk_bwd", "segments": int(n)}) for n in args.segments.split(",") if n]
    calls = [(label, lambda *a, m=m, kw=kw: m._backward_with(dy, None, *a, **kw)) for label, m, kw in runs]
    rounds(calls, args.reps, lambda label, fn: kernelbench_time(fn, xs, trials=args.trials)["median"], times, name)
    if args.profile:
        profile_kernels(calls, xs, times, name)
report(times, "bwd_ab.json", {"errors": errs})
