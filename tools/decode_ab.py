"""The decode step at few rows (B = 1 .. 16, T = 1, H = 32, D = 128, bf16): this solution.py against another copy
(--baseline, e.g. `git show HEAD~1:solution.py > /tmp/old/solution.py`), bitwise on seven cases (full-rows and
general instantiations, -1 and duplicate rows, several steps, every dtype), then KernelBench median, graph replay
and the kernel's own duration (profiler, each call after an L2 flush), interleaved, with the launch floor.

    python3 tools/decode_ab.py --baseline /tmp/old/solution.py     (writes $OUT/decode_ab.json with OUT set)

Fifteenth session, device run 3: the rows=full instantiation against the previous file (BENCHMARKS.md)."""
import argparse
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import solution as new  # noqa: E402
import reference  # noqa: E402
from timing import kernelbench_time, flush_l2, floor_call  # noqa: E402
from bench import graph_call_us  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--baseline", required=True, help="another solution.py")
args = ap.parse_args()
spec = importlib.util.spec_from_file_location("solution_old", args.baseline)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
new.build("decode")
old.build("decode")

# bitwise: new == old on the cases the FULL path takes and on those it does not
bad = 0
gen = torch.Generator().manual_seed(1)
for (B, T, H, Dk, Dv, dt, idxkind) in [(1, 1, 32, 128, 128, torch.bfloat16, "perm"), (3, 1, 4, 64, 64, torch.float32, "neg"),
                                       (2, 3, 2, 128, 96, torch.float16, "none"), (4, 2, 3, 256, 32, torch.bfloat16, "dup"),
                                       (2, 1, 2, 100, 64, torch.float32, "perm"), (5, 4, 2, 32, 64, torch.bfloat16, "perm"),
                                       (1, 1, 32, 128, 128, torch.float32, "perm")]:
    xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dt, device="cuda", generator=gen)
    P = B + 2
    pool = torch.randn(P, H, Dk, Dv, generator=gen).cuda()
    if idxkind == "none":
        pool = pool[:B].clone()
        idx = None
    else:
        idx = torch.randperm(P, generator=gen)[:B].cuda()
        if idxkind == "neg":
            idx[1] = -1
        if idxkind == "dup":
            idx[2] = idx[0]
    p1, p2 = pool.clone(), pool.clone()
    y1 = new.gated_recurrence_decode_(*xs, p1, idx)
    y2 = old.gated_recurrence_decode_(*xs, p2, idx)
    same = torch.equal(torch.nan_to_num(y1, 7.0), torch.nan_to_num(y2, 7.0)) and torch.equal(p1, p2)
    bad += not same
    print("bitwise", (B, T, H, Dk, Dv, str(dt), idxkind), same, new.plan_decode(B, T, H, Dk, Dv, dt))
print("bitwise bad:", bad)


def kernel_us(fn, n=40):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            flush_l2()
            fn()
        torch.cuda.synchronize()
    return [round(e.device_time_total / e.count, 3) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total / e.count < 50]


res = {}
gen = torch.Generator().manual_seed(0)
for B in (1, 2, 4, 8, 16):
    xs = reference.make_inputs(B, 1, 32, 128, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
    pool = torch.randn(B, 32, 128, 128, generator=gen).cuda()
    idx = torch.randperm(B, generator=gen).cuda()
    for rep in range(3):
        for name, mod in (("new", new), ("old", old)):
            r = res.setdefault(f"B{B}_{name}", {"kb": [], "graph": [], "kernel": []})
            r["kb"].append(round(kernelbench_time(mod.gated_recurrence_decode_, (*xs, pool, idx), trials=100)["median"] * 1e3, 3))
            r["graph"].append(round(graph_call_us(mod.gated_recurrence_decode_, (*xs, pool, idx)), 3))
            r["kernel"] += kernel_us(lambda: mod.gated_recurrence_decode_(*xs, pool, idx))
    if B == 1:
        for rep in range(3):
            r = res.setdefault("floor", {"kb": [], "graph": [], "kernel": []})
            r["kernel"] += kernel_us(lambda: floor_call(*xs))
            r["kb"].append(round(kernelbench_time(floor_call, xs, trials=100)["median"] * 1e3, 3))
            r["graph"].append(round(graph_call_us(floor_call, xs), 3))
for k, v in res.items():
    print(f"{k:10s}", json.dumps(v))
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "decode_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
