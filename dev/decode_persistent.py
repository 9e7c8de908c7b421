"""A persistent decode step (issue 16): does keeping the next row's state in flight close the gap?

solution.py's decode kernel (DECODE_SRC) runs one block per (row, head, tile): each block loads its slot's
index, then its state into registers, computes, stores, and exits, so an SM has state bytes in flight only
for part of a block's life, and only as many as registers hold (perf-notes, twelfth session: 2.6-2.7 TB/s,
1.54-1.63x the memory floor from B = 64, DRAM 48% under ncu). Here one block an SM walks its (row, head)
items; while it computes item n, item n + 1's state (64 KB, T = 1, D_k = D_v = 128, a contiguous fp32 pool)
and its q, k, v rows are already on their way into shared memory by cp.async, and item n + 2's index is
loaded. The arithmetic and every sum's order are the production kernel's 128-column tile's, so y and the
state must be bitwise equal to `solution._decode_with(..., nv=128)`; the script checks that, then times
both.

    python3 dev/decode_persistent.py [--trials 50]     (writes $OUT/decode_persistent.json with OUT set)

v1 (SRC) scope: T = 1, D_k = D_v = 128, bfloat16 q/k/v/gate/beta, contiguous pool, valid distinct indices
(no -1, no duplicates): what the timing needs. Device run 1 of the thirteenth session: bitwise, and 24.1 /
77.9 / 288 / 569 us at B = 16 / 64 / 256 / 512 against the tile kernel's 31.2 / 104.6 / 399 / 789.

Its generalisation for production is solution.py's decode_persistent (every input dtype and stride, D_k <= 128,
D_v to 256, T >= 1, -1 / out-of-range / duplicate rows). A first version converted the next item's step inputs
right after loading them (119 us at B = 64, slower than the tile kernel; commit 3df38d0); keeping them raw until
after the compute (commit 5a8583a) gave 83.6 us (fourteenth session, run 1; the three variants' timings are in
perf-notes and docs/ab-decode-2026-12-02-s14.json; the variants' code is in git history at commit f32eb4e).
The script checks v1 and the production kernel bitwise against the tile kernel and times the three.
"""
import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import solution  # noqa: E402
from timing import kernelbench_time  # noqa: E402
from tools.common import save  # noqa: E402

SRC = r"""
#include <cuda_bf16.h>
#include <cstdint>
#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>

namespace {
constexpr int D = 128, kThreads = 256, kWarps = kThreads / 32;
// shared memory a buffer: the state (D x D fp32), then q, k, v rows (bf16)
constexpr int kState = D * D * 4, kRows = 3 * D * 2, kBuf = kState + kRows;

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

struct Args {
  const __nv_bfloat16 *q, *k, *v, *gate, *beta;  // (B, 1, H, D) and (B, 1, H), contiguous
  __nv_bfloat16* y;
  float* pool;                                    // (P, H, D, D) contiguous
  const int64_t* idx;
  int B, H;
};

// item = b * H + h. Issues item's state and rows into buffer `buf` (one commit group).
__device__ __forceinline__ void issue(const Args& a, int64_t item, int64_t slot, unsigned char* buf) {
  const int b = (int)(item / a.H), h = (int)(item % a.H);
  const float* src = a.pool + (slot * a.H + h) * (int64_t)(D * D);
  for (int e = threadIdx.x; e < kState / 16; e += kThreads) cp16(buf + 16 * e, src + 4 * e);
  const int64_t row = ((int64_t)b * a.H + h) * D;
  if (threadIdx.x < 3 * D * 2 / 16) {  // 48 pieces of 16 bytes: q, k, v rows
    const int t = threadIdx.x, which = t / 16, part = t % 16;
    const __nv_bfloat16* base = which == 0 ? a.q : which == 1 ? a.k : a.v;
    cp16(buf + kState + 16 * t, base + row + 8 * part);
  }
  commit();
}

__global__ void __launch_bounds__(kThreads, 1) decode_persistent_kernel(const Args a) {
  extern __shared__ __align__(16) unsigned char sm[];
  __shared__ __align__(16) float red[kWarps][D];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r0 = tid >> 3, jc = 4 * (tid & 7);
  const int64_t items = (int64_t)a.B * a.H;
  int64_t item = blockIdx.x;
  if (item >= items) return;
  // slot, gate and beta of the current item (cs, cg, cb) and of the next (ns, ng, nb); the next item's
  // state and rows are in flight while the current one is computed.
  auto gb = [&](int64_t it, float& g, float& bt) {
    g = __bfloat162float(a.gate[it]);  // (B, 1, H) contiguous: item = b * H + h
    bt = __bfloat162float(a.beta[it]);
  };
  int64_t cs = a.idx[item / a.H], ns = 0;
  float cg, cb, ng = 1.f, nb = 0.f;
  gb(item, cg, cb);
  issue(a, item, cs, sm);
  if (item + gridDim.x < items) {
    ns = a.idx[(item + gridDim.x) / a.H];
    gb(item + gridDim.x, ng, nb);
  }
  for (int n = 0; item < items; ++n, item += gridDim.x) {
    unsigned char* cur = sm + (n & 1) * kBuf;
    const int64_t next = item + gridDim.x;
    const int h = (int)(item % a.H);
    const int64_t my = cs;
    const float g = cg, bt = cb;
    if (next < items) {
      // buffer (n + 1) & 1 was read by item n - 1, whose readers all passed the last barrier
      issue(a, next, ns, sm + ((n + 1) & 1) * kBuf);
      cs = ns; cg = ng; cb = nb;
      if (next + gridDim.x < items) {
        ns = a.idx[(next + gridDim.x) / a.H];
        gb(next + gridDim.x, ng, nb);
      }
      wait_group<1>();
    } else {
      wait_group<0>();
    }
    __syncthreads();  // item n's state and rows have landed (every thread's copies)
    const float* S_s = reinterpret_cast<const float*>(cur);
    const __nv_bfloat16* rows = reinterpret_cast<const __nv_bfloat16*>(cur + kState);
    float bv[4][4], acc[4][4] = {};
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) bv[m][e] = bt * __bfloat162float(rows[2 * D + jc + 32 * m + e]);
    float* dst = a.pool + (my * a.H + h) * (int64_t)(D * D);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = r0 + 32 * r;
      const float kk = __bfloat162float(rows[D + i]), qq = __bfloat162float(rows[i]);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float4 x = *reinterpret_cast<const float4*>(S_s + i * D + jc + 32 * m);
        float s4[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s4[e] = fmaf(g, s4[e], kk * bv[m][e]);
          acc[m][e] = fmaf(qq, s4[e], acc[m][e]);
        }
        *reinterpret_cast<float4*>(dst + i * D + jc + 32 * m) = make_float4(s4[0], s4[1], s4[2], s4[3]);
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[m][e] += __shfl_xor_sync(0xffffffffu, acc[m][e], 8);
        acc[m][e] += __shfl_xor_sync(0xffffffffu, acc[m][e], 16);
      }
    if (lane < 8)
#pragma unroll
      for (int m = 0; m < 4; ++m)
        *reinterpret_cast<float4*>(&red[warp][32 * m + 4 * lane]) = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
    __syncthreads();
    if (tid < D) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][tid];
      a.y[item * D + tid] = __float2bfloat16_rn(sum);
    }
    __syncthreads();  // red and buffer n & 1 free for the next items
  }
}
}  // namespace

torch::Tensor decode_persistent(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor gate,
                                torch::Tensor beta, torch::Tensor pool, torch::Tensor idx, int64_t blocks) {
  auto y = torch::empty_like(v);
  Args a{reinterpret_cast<const __nv_bfloat16*>(q.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(k.data_ptr()),
         reinterpret_cast<const __nv_bfloat16*>(v.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(gate.data_ptr()),
         reinterpret_cast<const __nv_bfloat16*>(beta.data_ptr()), reinterpret_cast<__nv_bfloat16*>(y.data_ptr()),
         pool.data_ptr<float>(), idx.data_ptr<int64_t>(), (int)q.size(0), (int)q.size(2)};
  static bool opted = false;
  if (!opted) {
    cudaFuncSetAttribute(decode_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kBuf);
    opted = true;
  }
  decode_persistent_kernel<<<(unsigned)blocks, kThreads, 2 * kBuf, c10::cuda::getCurrentCUDAStream()>>>(a);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "decode_persistent launch");
  return y;
}
"""


def build():
    return load_inline("dev_decode_persistent", cpp_sources="torch::Tensor decode_persistent(torch::Tensor q, "
                       "torch::Tensor k, torch::Tensor v, torch::Tensor gate, torch::Tensor beta, torch::Tensor pool, "
                       "torch::Tensor idx, int64_t blocks);", cuda_sources=SRC, functions=["decode_persistent"],
                       extra_cuda_cflags=["-O3"], verbose=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    args = ap.parse_args()
    mod = build()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    H, D = 32, 128
    rows = []
    for B in (16, 64, 256, 512):
        rng = torch.Generator(device="cuda").manual_seed(B)
        xs = [torch.randn(B, 1, H, D, device="cuda", generator=rng).bfloat16() for _ in range(3)] + \
             [torch.rand(B, 1, H, device="cuda", generator=rng).bfloat16() for _ in range(2)]
        pool = torch.randn(B, H, D, D, device="cuda", generator=rng)
        idx = torch.randperm(B, device="cuda", generator=rng)
        p1, p2 = pool.clone(), pool.clone()
        y1 = solution._decode_with(*xs, p1, idx, nv=128)
        y2 = mod.decode_persistent(*xs, p2, idx, sms)
        torch.cuda.synchronize()
        row = {"B": B, "bitwise_y": bool(torch.equal(y1, y2)), "bitwise_state": bool(torch.equal(p1, p2))}
        p3 = pool.clone()
        y3 = solution._decode_with(*xs, p3, idx, persistent=True)
        row["production_persistent_bitwise"] = bool(torch.equal(y1, y3) and torch.equal(p1, p3))
        timed = [("production_nv128", lambda: solution._decode_with(*xs, pool, idx, nv=128)),
                 ("persistent_1x", lambda: mod.decode_persistent(*xs, pool, idx, sms)),
                 ("production_persistent", lambda: solution._decode_with(*xs, pool, idx, persistent=True))]
        for rep in range(2):  # interleaved repeats
            for name, fn in timed:
                row.setdefault(name + "_us", []).append(kernelbench_time(fn, [], trials=args.trials)["median"] * 1e3)
        row["floor_us"] = (2 * B * H * D * D * 4 + B * H * 4 * D * 2) / 4.17e12 * 1e6
        rows.append(row)
        print(row, flush=True)
    if os.environ.get("OUT"):
        save("decode_persistent.json", {"device": torch.cuda.get_device_name(0), "rows": rows})


if __name__ == "__main__":
    main()
