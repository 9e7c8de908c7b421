"""One planned call at a shape, for ncu: python3 tools/ncu_chunk.py B T H D [dtype]
(ncu -k regex:chunk_v1 -c 1 --section SpeedOfLight --section WarpStateStats python3 tools/ncu_chunk.py 8 2048 16 128)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import reference  # noqa: E402
import solution  # noqa: E402

B, T, H, D = (int(x) for x in sys.argv[1:5])
dtype = getattr(torch, sys.argv[5]) if len(sys.argv) > 5 else torch.float32
xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
print(solution.plan(B, T, H, D, D, dtype))
solution.gated_recurrence(*xs)
torch.cuda.synchronize()
