"""Sweep of the chunk kernels' launch configuration (column tile NV, segments) against the plan, at
the issue's shapes: KernelBench per-call median and rel-L2 against float64, through the private hook
`solution._gated_recurrence_with(..., kernel="chunk_tf32", config=(NV, segments))` (chunk_bf16 for the
bf16 shapes, which chunk_tf32 refuses; --kernel forces one kernel and skips the dtypes it refuses).
Writes $OUT/chunk_configs.json. Last run (as tools/chunk_configs.py on chunk_v2, which took bf16 too,
third session): docs/chunk-configs-2026-11-29.json, tabled in BENCHMARKS.md.

    python3 dev/chunk_configs.py [--trials 15] [--kernel chunk_tf32]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
import reference  # noqa: E402
import solution  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402

SHAPES = [("S1", (4, 1024, 8, 64), torch.float32), ("S2", (8, 2048, 16, 128), torch.float32),
          ("S3", (1, 8192, 8, 128), torch.float32), ("S2", (8, 2048, 16, 128), torch.bfloat16),
          ("S3", (1, 8192, 8, 128), torch.bfloat16), ("T16384", (1, 16384, 8, 128), torch.float32)]
SEGMENTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
KERNEL = {torch.float32: "chunk_tf32", torch.float16: "chunk_tf32", torch.bfloat16: "chunk_bf16"}


def save(name, obj):
    """obj as indented JSON in $OUT/name (the current folder without OUT)."""
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(obj, f, indent=1, default=str)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--kernel", default=None, help="one kernel for every shape (default: chunk_tf32, chunk_bf16 for bf16)")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (B, T, H, D), dtype in SHAPES:
        kernel = args.kernel or KERNEL[dtype]
        xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
        with torch.no_grad():
            ref = reference.Model()(*[x.double() for x in xs])
        planned = solution.plan(B, T, H, D, D, dtype)
        chunks = -(-T // 32)
        configs = [(nv, nseg) for nv in (32, 64) for nseg in SEGMENTS
                   if nseg <= chunks and B * H * -(-D // nv) * nseg <= 8 * 2 * sms]
        for nv, nseg in configs:
            def fn(*x, c=(nv, nseg)):
                return solution._gated_recurrence_with(*x, kernel=kernel, config=c)

            row = {"shape": name, "dtype": str(dtype)[6:], "kernel": kernel, "NV": nv, "segments": nseg,
                   "planned": planned}
            try:
                row["err"] = rel_l2(fn(*xs), ref)
            except TypeError as e:  # the kernel does not take this dtype: next shape
                print(f"{name} {row['dtype']}: {kernel} refused ({e}), skipped", flush=True)
                break
            except ValueError as e:  # a configuration the kernel refuses
                row["refused"] = str(e)
                rows.append(row)
                print(f"{name} {row['dtype']:8s} NV={nv} seg={nseg:3d}: refused ({e})", flush=True)
                continue
            row["ms"] = kernelbench_time(fn, xs, trials=args.trials)["median"]
            rows.append(row)
            print(f"{name} {row['dtype']:8s} {kernel} NV={nv} seg={nseg:3d}: {row['ms'] * 1e3:8.1f} us  "
                  f"err {row['err']:.1e}   (plan: {planned})", flush=True)
    save("chunk_configs.json", rows)


if __name__ == "__main__":
    main()
