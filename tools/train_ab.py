"""The training step of this solution.py against other copies (--baseline LABEL=PATH, repeatable), in one process:
per shape (bench.py's SHAPES names), `gated_recurrence` with q, k, v, gate, beta requiring grad, then
`torch.autograd.grad` of <y, dy> (what `_backward_with` cannot show: work moved between the forward and the
backward, such as checkpoints written by the forward), and the forward alone without grad (an inference A/B of the
same kernels). KernelBench medians (L2 flush), interleaved over --reps rounds in a rotated order; the min of the
rounds. Also each copy's gradients against the first copy's (rel-L2, a sanity check: tests hold the accuracy), and
with --fla flash-linear-attention's chunk_simple_gla forward + backward (k * beta and log(gate) made outside the
timed region, as in bench.py, with fla's fla#640 guard off as bench.py --fla-640-guard-off does: on Hopper with
Triton 3.4 to 3.7.0 fla refuses its chunk backward) in the same rounds. --profile: each run's kernels' mean times.

    python3 tools/train_ab.py --baseline old=scratch/old.py [--shapes S4-bf16,S2-bf16] [--reps 3] [--fla] [--profile]
    (every copy's units are built first, all at once; writes $OUT/train_ab.json with OUT set)"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from tools.common import add_copy_args, copies, profile_kernels, report, rounds  # noqa: E402

ap = argparse.ArgumentParser()
add_copy_args(ap, "S4-bf16,S2-bf16", reps=3, trials=5)
ap.add_argument("--fla", action="store_true", help="also fla's chunk_simple_gla forward + backward (fla#640 guard off)")
ap.add_argument("--units", default="chunk_sm90,chunk_bf16,chunk_tf32,backward,backward_sm90,backward_sm90_fp32",
                help="the units each copy builds first (the rest build on first use); e.g. chunk_sm90,backward_sm90 "
                     "for bf16 shapes on Hopper")
args = ap.parse_args()
mods = copies(args, args.units.split(","))
new = mods["new"]

import reference  # noqa: E402
from bench import SHAPES, fla_train_leaves, fla_train_peer, grad_step  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402

gen = torch.Generator().manual_seed(11)
times, diffs = {}, {}
for name in [n for n in args.shapes.split(",") if n]:
    B, T, H, D, dtype = SHAPES[name]
    xs = [x.requires_grad_() for x in reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)]
    dy = torch.randn(B, T, H, D, generator=gen).to("cuda", dtype)
    print(name, new.plan(B, T, H, D, D, dtype).splitlines()[0][:90], flush=True)

    def step(*a, m):
        return torch.autograd.grad(m.gated_recurrence(*a), a, dy)

    def forward(*a, m):
        with torch.no_grad():
            return m.gated_recurrence(*a)

    runs = []
    for label, m in mods.items():
        runs += [(f"{label} fwd+bwd", lambda *a, m=m: step(*a, m=m)), (f"{label} fwd", lambda *a, m=m: forward(*a, m=m))]
    fx = []
    if args.fla:
        fla_name, fla_fn = fla_train_peer(guard_off=True)[0]
        fx = fla_train_leaves(*(x.detach() for x in xs))
        runs.append((f"fla fwd+bwd ({fla_name})", grad_step(fla_fn, dy)))
    first = None
    for label, m in mods.items():  # the gradients, against the first copy's
        got = step(*xs, m=m)
        first = got if first is None else first
        diffs[f"{name} {label}"] = max(rel_l2(a.float().cpu(), b.float().cpu()) for a, b in zip(got, first))
        print(f"  {name} {label}: gradients vs the first copy rel-L2 {diffs[f'{name} {label}']:.2e}", flush=True)
    rounds(runs, args.reps, lambda label, fn: kernelbench_time(fn, fx if label.startswith("fla") else xs,
                                                               trials=args.trials)["median"], times, name)
    if args.profile:
        profile_kernels([(lbl, fn) for lbl, fn in runs if not lbl.startswith("fla")], xs, times, name)
report(times, "train_ab.json", {"grad_vs_first": diffs})
