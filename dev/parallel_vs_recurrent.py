"""The parallel kernel against the recurrent one (and the floor) on the device: a correctness smoke,
the KernelBench shape's four numbers (KernelBench median/mean, CUDA-graph replay per call, host time per
call) beside the floor row (an output allocation plus one tiny kernel, timed the same way), and a
crossover grid over B*H, T and D that decides the plan's boundary between the two.

    python3 dev/parallel_vs_recurrent.py [--trials 50] [--no-grid] [--baseline old/solution.py ...]
                                                              (writes $OUT/parallel_vs_recurrent.json)
--baseline (repeatable) adds another copy of solution.py's planned call and ModelNew to the
KernelBench-shape rows (same process, same inputs), for an A/B of a kernel change.
"""
import argparse
import importlib.util
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import reference  # noqa: E402
import solution  # noqa: E402
from timing import call_times_us, floor_call, kernelbench_time, rel_l2  # noqa: E402


def run(kernel):
    return lambda *x: solution._gated_recurrence_with(*x, kernel=kernel)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--baseline", action="append", default=[], help="another solution.py to time beside this one")
    args = ap.parse_args()
    out = {"smoke": [], "spec": [], "grid": []}
    # ---- correctness smoke (the test suite has the full matrix)
    for shape, gate in [((2, 128, 4, 24, 24), None), ((3, 63, 5, 7, 33), (-1.2, 1.2)), ((1, 255, 2, 64, 100), 1.02),
                        ((2, 200, 3, 128, 32), (0.0, 0.05)), ((1, 33, 2, 256, 256), None)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            xs = reference.make_inputs(*shape, dtype=dtype, device="cuda")
            if isinstance(gate, float):
                xs[3] = torch.full_like(xs[3], gate)
            elif gate is not None:
                xs[3] = torch.empty_like(xs[3]).uniform_(*gate)
            ref = reference.Model()(*[x.double() for x in xs])
            y = run("parallel")(*xs)
            row = {"shape": shape, "dtype": str(dtype)[6:], "err": rel_l2(y, ref), "floor": rel_l2(ref.to(dtype), ref),
                   "nan": bool(torch.isnan(y).any())}
            out["smoke"].append(row)
            print(f"smoke {shape} {row['dtype']:9s} err {row['err']:.2e} (dtype floor {row['floor']:.2e}) nan={row['nan']}")
    # ---- accuracy with gates above 1 (the products grow 1.02^T), every kernel on the same inputs
    out["accuracy"] = []
    for shape in [(1, 255, 2, 64, 100), (1, 255, 2, 32, 32), (1, 128, 2, 32, 32), (2, 200, 3, 24, 24)]:
        for gate in (1.02, 1.0):
            xs = reference.make_inputs(*shape, device="cuda", generator=torch.Generator().manual_seed(1))
            xs[3] = torch.full_like(xs[3], gate)
            ref = reference.Model()(*[x.double() for x in xs])
            row = {"shape": shape, "gate": gate}
            for kern in ("parallel", "recurrent", "chunk_tf32"):
                row[kern] = rel_l2(run(kern)(*xs), ref)
            out["accuracy"].append(row)
            print(f"accuracy {shape} gate {gate}: " + ", ".join(f"{k} {row[k]:.2e}" for k in ("parallel", "recurrent", "chunk_tf32")))
    # ---- the KernelBench shape: planned (parallel), recurrent, and the floor row, in each dtype
    bases = []
    for i, path in enumerate(args.baseline):
        spec = importlib.util.spec_from_file_location(f"solution_baseline{i}", path)
        bases.append((os.path.basename(path), importlib.util.module_from_spec(spec)))
        spec.loader.exec_module(bases[-1][1])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
        fns = [("floor: empty_like(v).zero_()", floor_call),
               ("planned: " + solution.plan(2, 128, 4, 24, 24, dtype), solution.gated_recurrence),
               ("recurrent", run("recurrent")), ("ModelNew", solution.ModelNew())]
        for tag, base in bases:
            fns += [(f"{tag} planned", base.gated_recurrence), (f"{tag} ModelNew", base.ModelNew())]
        for name, fn in fns:
            row = {"what": name, "dtype": str(dtype)[6:], **call_times_us(fn, xs, trials=200)}
            out["spec"].append(row)
            print(f"spec {row['dtype']:8s} {name[:40]:40s} KB median {row['kb_median_us']:6.2f} mean "
                  f"{row['kb_mean_us']:6.2f} graph {row['graph_us']:6.2f} host {row['host_us']:6.2f} us", flush=True)
    # ---- crossover grid (fp32; bf16 at a few)
    for BH in () if args.no_grid else (8, 64, 512):
        for T in (32, 64, 128, 255):
            for D in (24, 64, 128):
                B, H = (1, BH) if BH <= 64 else (BH // 64, 64)
                for dtype in ((torch.float32, torch.bfloat16) if D == 64 else (torch.float32,)):
                    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
                    plan = solution.plan(B, T, H, D, D, dtype)
                    row = {"B": B, "T": T, "H": H, "D": D, "dtype": str(dtype)[6:], "plan": plan.split()[0]}
                    for kern in ("parallel", "recurrent"):
                        try:
                            row[kern + "_us"] = kernelbench_time(run(kern), xs, trials=args.trials)["median"] * 1e3
                        except ValueError:  # parallel's staging over the shared memory
                            row[kern + "_us"] = float("nan")
                    out["grid"].append(row)
                    print(f"grid B*H={BH:4d} T={T:4d} D={D:4d} {row['dtype']:9s} parallel {row['parallel_us']:8.1f} "
                          f"recurrent {row['recurrent_us']:8.1f} us  plan {row['plan']}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "parallel_vs_recurrent.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
