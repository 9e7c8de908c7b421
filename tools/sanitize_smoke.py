"""Small calls for compute-sanitizer (memcheck / racecheck): every dtype, padded rows and columns,
several chunks, strided and aligned layouts.

    compute-sanitizer --tool memcheck python tools/sanitize_smoke.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reference  # noqa: E402
import solution  # noqa: E402

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for B, T, H, Dk, Dv in [(2, 37, 3, 24, 24), (1, 20, 2, 33, 100), (1, 9, 1, 256, 8), (1, 50, 1, 7, 5)]:
        xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
        solution.gated_recurrence(*xs)
        solution.gated_recurrence(*[x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 4 else x for x in xs])
    xs = reference.make_inputs(1, 40, 2, 24, 24, dtype=dtype, device="cuda")
    solution.gated_recurrence_config(*xs, 6, 4, 8, 7)  # 6 chunks with a ragged last one
torch.cuda.synchronize()
print("sanitize smoke: done")
