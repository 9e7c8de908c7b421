"""A dense chunked call: this solution.py against other copies (--baseline LABEL=PATH, repeatable; e.g.
`git show HEAD~1:solution.py > ab/old/solution.py`): bitwise y and final state on a few cases (segments, an
initial state, a ragged end), then KernelBench medians interleaved over --reps rounds, per shape.

    python3 tools/chunk_ab.py --baseline old=ab/old/solution.py [--shapes S2,S4,S3] [--dtype float32] [--no-bitwise]
    (writes $OUT/chunk_ab.json with OUT set)"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import solution as new  # noqa: E402
import reference  # noqa: E402
from bench import SHAPES  # noqa: E402
from tools.common import load_copies  # noqa: E402
from timing import kernelbench_time  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--baseline", action="append", required=True, help="LABEL=PATH of another solution.py")
ap.add_argument("--shapes", default="S2,S4,S3")
ap.add_argument("--dtype", default="float32")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--trials", type=int, default=30)
ap.add_argument("--no-bitwise", dest="bitwise", action="store_false", help="timing only (other kernels planned)")
args = ap.parse_args()
mods = load_copies(args.baseline, new)
dtype = getattr(torch, args.dtype)
gen = torch.Generator().manual_seed(3)
bad = 0
for (B, T, H, D) in [(2, 300, 3, 128), (1, 4100, 2, 128), (4, 2048, 1, 128)] if args.bitwise else []:
    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
    s0 = torch.randn(B, H, D, D, generator=gen).cuda()
    outs = {k: m.gated_recurrence(*xs, initial_state=s0, output_final_state=True) for k, m in mods.items()}
    for k, (y, s) in outs.items():
        same = torch.equal(y, outs["new"][0]) and torch.equal(s, outs["new"][1])
        bad += not same
        print("bitwise", (B, T, H, D), k, "==", "new", same)
print("bitwise bad:", bad)
res = {}
for name in args.shapes.split(","):
    B, T, H, D, _ = SHAPES[name]
    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
    print(name, new.plan(B, T, H, D, D, dtype))
    for rep in range(args.reps):
        for k, m in mods.items():
            res.setdefault(f"{name}_{k}", []).append(
                round(kernelbench_time(m.gated_recurrence, xs, trials=args.trials)["median"] * 1e3, 1))
for k, v in res.items():
    print(f"{k:12s} us {v}  median {sorted(v)[len(v) // 2]}")
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "chunk_ab.json"), "w") as f:
        json.dump({"bitwise_bad": bad, "us": res}, f, indent=1)
