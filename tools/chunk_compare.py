"""The chunk kernels against each other at S1, S2, S3 in fp32 and bf16, same run: rel-L2 against
float64 (and against the exact answer rounded to bf16, the floor) and KernelBench per-call median.
chunk_v3 runs on bf16 only. Writes $OUT/chunk_compare.json.

    python3 tools/chunk_compare.py [--trials 30] [--algos chunk_v2,chunk_v3] [--dtypes bfloat16]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import reference  # noqa: E402
import solution  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from common import save  # noqa: E402  (tools/common.py: the script's folder is on sys.path)

SHAPES = {"S1": (4, 1024, 8, 64), "S2": (8, 2048, 16, 128), "S3": (1, 8192, 8, 128)}

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=30)
ap.add_argument("--algos", default="chunk_v1,chunk_v2,chunk_v3")
ap.add_argument("--dtypes", default="float32,bfloat16")
args = ap.parse_args()
rows = []
for name, (B, T, H, D) in SHAPES.items():
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
        with torch.no_grad():
            ref = reference.Model()(*[x.double() for x in xs])
        floor = rel_l2(ref.to(dtype), ref) if dtype != torch.float32 else 0.0
        for algo in [a for a in args.algos.split(",") if a != "chunk_v3" or dtype == torch.bfloat16]:
            fn = lambda *x, a=algo: solution.gated_recurrence_with(*x, algorithm=a)  # noqa: E731
            row = {"shape": name, "dtype": str(dtype)[6:], "algo": algo, "err": rel_l2(fn(*xs), ref), "floor": floor,
                   "ms": kernelbench_time(fn, xs, trials=args.trials)["median"]}
            rows.append(row)
            print(f"{name} {row['dtype']:8s} {algo}: {row['ms'] * 1e3:8.1f} us  rel-L2 {row['err']:.2e} (floor {floor:.2e})", flush=True)
save("chunk_compare.json", rows)
