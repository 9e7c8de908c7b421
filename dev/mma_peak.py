"""Ceiling of mma.sync on this card: TF32 m16n8k8 and BF16 m16n8k16 throughput with operands already
in registers (8 independent accumulator chains per warp, every SM full), in TFLOPS. chunk_v2 issues
its tensor-core work as mma.sync, so this bounds it from below: time >= its mma FLOPs / this rate.

    python3 dev/mma_peak.py        (writes $OUT/mma_peak.json)
"""
import json
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from timing import kernelbench_time  # noqa: E402


def save(name, obj):
    """obj as indented JSON in $OUT/name (the current folder without OUT), as tools/common.py does."""
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(obj, f, indent=1, default=str)


SRC = r"""
#include <torch/extension.h>
#include <cstdint>

template <bool BF16>
__global__ void mma_loop(float* out, int iters) {
  float d[8][4] = {};
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f800000u ^ (threadIdx.x * 7 + i);  // distinct, finite operands
  for (int i = 0; i < 2; ++i) b[i] = 0x3f000000u ^ (threadIdx.x * 3 + i);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  float s = 0.f;
  for (int c = 0; c < 8; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

void run(torch::Tensor out, int64_t blocks, int64_t threads, int64_t iters, bool bf16) {
  if (bf16) mma_loop<true><<<blocks, threads>>>(out.data_ptr<float>(), (int)iters);
  else mma_loop<false><<<blocks, threads>>>(out.data_ptr<float>(), (int)iters);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "launch failed");
}
"""


def main():
    mod = load_inline("mma_peak", cpp_sources="void run(torch::Tensor, int64_t, int64_t, int64_t, bool);",
                      cuda_sources=SRC, functions=["run"], extra_cuda_cflags=["-O3"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for bf16 in (False, True):
        for warps_per_sm in (8, 16, 32):
            threads, iters = 256, 4096
            blocks = sms * warps_per_sm * 32 // threads
            out = torch.empty(blocks * threads, device="cuda")
            t = kernelbench_time(mod.run, (out, blocks, threads, iters, bf16), trials=10, flush=False)["median"] * 1e-3
            k = 16 if bf16 else 8
            flops = blocks * threads // 32 * iters * 8 * 2 * 16 * 8 * k
            row = {"op": "bf16 m16n8k16" if bf16 else "tf32 m16n8k8", "warps_per_sm": warps_per_sm,
                   "tflops": flops / t / 1e12}
            rows.append(row)
            print(f"{row['op']:14s} {warps_per_sm:2d} warps/SM: {row['tflops']:7.1f} TFLOPS", flush=True)
    save("mma_peak.json", rows)


if __name__ == "__main__":
    main()
