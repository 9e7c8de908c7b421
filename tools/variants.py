"""A/B of compile-time switches in solution.py's CUDA source, one process: each variant is a copy of
solution.py with `#define NAME VALUE` lines changed (its own extension build), timed at the issue's
shapes against the unchanged file, calls interleaved so that drift hits both alike.

    python3 tools/variants.py GR_PDL=0 [old/solution.py ...] [--trials 30]     (writes $OUT/variants.json)
"""
import argparse
import importlib.util
import os
import re
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import reference  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from common import save  # noqa: E402  (tools/common.py: the script's folder is on sys.path)

SHAPES = [("S0", (2, 128, 4, 24), torch.float32), ("S0", (2, 128, 4, 24), torch.bfloat16),
          ("S1", (4, 1024, 8, 64), torch.float32), ("S1", (4, 1024, 8, 64), torch.bfloat16),
          ("S2", (8, 2048, 16, 128), torch.float32), ("S2", (8, 2048, 16, 128), torch.bfloat16),
          ("S3", (1, 8192, 8, 128), torch.float32), ("S3", (1, 8192, 8, 128), torch.bfloat16),
          ("L", (16, 4096, 32, 128), torch.float32), ("L", (16, 4096, 32, 128), torch.bfloat16)]


def load_variant(defines):
    """solution.py with `#define`s changed, or (one argument ending in .py) another copy of it."""
    if len(defines) == 1 and defines[0].endswith(".py"):
        src, tag, defines = open(defines[0]).read(), os.path.basename(defines[0])[:-3], []
    else:
        src, tag = open(os.path.join(ROOT, "solution.py")).read(), "base"
    for i, d in enumerate(defines):
        name, value = d.split("=")
        src, n = re.subn(rf"#define {name} \S+", f"#define {name} {value}", src)
        assert n == 1, f"{name}: {n} definitions"
        tag = (tag + "_" if i else "") + f"{name.lower()}_{value}"
    path = f"/tmp/variants/solution_{tag}.py"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"solution_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return tag, mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=VALUE[,NAME=VALUE] or a .py file, per variant")
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    mods = [load_variant([])] + [load_variant(v.split(",")) for v in args.variants]
    rows = []
    for name, (B, T, H, D), dtype in SHAPES:
        xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
        ref = reference.Model()(*[x.double() for x in xs]) if B * T * H <= 8 * 2048 * 16 else None
        times = {tag: [] for tag, _ in mods}
        for _ in range(3):  # interleaved rounds
            for tag, mod in mods:
                times[tag].append(kernelbench_time(mod.gated_recurrence, xs, trials=args.trials)["median"])
        for tag, mod in mods:
            row = {"shape": name, "dtype": str(dtype)[6:], "variant": tag, "ms": sorted(times[tag])[1],
                   "err": rel_l2(mod.gated_recurrence(*xs), ref) if ref is not None else None}
            rows.append(row)
            print(f"{name:7s} {row['dtype']:9s} {tag:20s} {row['ms'] * 1e3:8.1f} us  err {row['err']}", flush=True)
    save("variants.json", rows)


if __name__ == "__main__":
    main()
