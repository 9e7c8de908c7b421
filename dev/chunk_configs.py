"""chunk_v2 launch configurations (column tile NV, segments) against the plan, at the issue's shapes:
KernelBench per-call median and rel-L2 against float64. Writes $OUT/chunk_configs.json.

    python3 tools/chunk_configs.py [--trials 15]
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

SHAPES = [("S1", (4, 1024, 8, 64), torch.float32), ("S2", (8, 2048, 16, 128), torch.float32),
          ("S3", (1, 8192, 8, 128), torch.float32), ("S2", (8, 2048, 16, 128), torch.bfloat16),
          ("S3", (1, 8192, 8, 128), torch.bfloat16), ("T16384", (1, 16384, 8, 128), torch.float32)]
SEGMENTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=15)
args = ap.parse_args()
rows = []
for name, (B, T, H, D), dtype in SHAPES:
    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
    with torch.no_grad():
        ref = reference.Model()(*[x.double() for x in xs])
    planned = solution.plan(B, T, H, D, D)
    chunks = -(-T // 32)
    for nv in (32, 64):
        for nseg in SEGMENTS:
            if nseg > chunks or B * H * -(-D // nv) * nseg > 8 * 264:
                continue
            fn = lambda *x, c=(32, nv, nseg): solution.gated_recurrence_with(*x, algorithm="chunk_v2", config=c)  # noqa: E731
            row = {"shape": name, "dtype": str(dtype)[6:], "NV": nv, "segments": nseg, "planned": planned,
                   "err": rel_l2(fn(*xs), ref), "ms": kernelbench_time(fn, xs, trials=args.trials)["median"]}
            rows.append(row)
            print(f"{name} {row['dtype']:8s} NV={nv} seg={nseg:3d}: {row['ms'] * 1e3:8.1f} us  err {row['err']:.1e}"
                  f"   (plan: {planned})", flush=True)
save("chunk_configs.json", rows)
