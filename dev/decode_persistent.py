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

v2 (GENERAL_SRC) is that kernel generalised for production (every input dtype and stride, a pool with 16-byte
rows and unit column stride as solution.py's pool_aligned, D_k <= 128, D_v to 256,
T >= 1, -1 / out-of-range / duplicate rows), built on solution.py's DECODE_SRC. Integrated into solution.py
(commit 3df38d0, variant 0 here) it was slower than the tile kernel it was to replace (119 against 104 us at
B = 64, device runs 3 and 4) and was taken back out. Suspected cause: the next item's step inputs converted
to float right after their loads, so every item waits a DRAM round trip before its compute; variant 1 keeps
them raw until after the compute (commit 5a8583a; not yet run), variant 2 also drops the duplicate check.
The script checks every variant bitwise against the tile kernel (odd shapes and special rows too), then
times them beside it.
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


GENERAL_SRC = r"""
// ---- v2: the general kernel (every input dtype and stride, a 16-byte pool as pool_aligned, D_k <= 128, D_v up
// to 256, T >= 1, -1 / out-of-range / duplicate rows), appended to solution.py's DECODE_SRC: it shares
// decode_load_step, decode_write_y,
// slot_of and the Problem record with the production decode_kernel.
#include <algorithm>
#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>
namespace gr {
namespace {
constexpr int kRingD = 128;
constexpr size_t kDecodeRingSmem = 2 * kRingD * kRingD * sizeof(float);

// The same inputs as loaded, not yet converted: nothing consumes a load, so decode_persistent keeps the next
// item's in flight while it computes (a conversion right after the load would wait for it). Gate and beta
// as bits (float32, or a 16-bit pattern).
template <typename scalar_t, int NP, int MC>
struct DecodeRaw {
  scalar_t k[NP], q[NP], v[MC][4];
  uint32_t g, b;
};

template <typename scalar_t>
__device__ __forceinline__ uint32_t gate_bits(const void* base, int64_t off, bool wide) {
  if (sizeof(scalar_t) == 4 || wide) return __float_as_uint(static_cast<const float*>(base)[off]);
  return static_cast<const uint16_t*>(base)[off];
}
template <typename scalar_t>
__device__ __forceinline__ float gate_value(uint32_t bits, bool wide) {
  if (sizeof(scalar_t) == 4 || wide) return __uint_as_float(bits);
  if constexpr (std::is_same<scalar_t, __half>::value) return __half2float(__ushort_as_half((unsigned short)bits));
  else return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
}

// Step t's inputs for the thread's rows r0 + 32 r and columns jc + 32 m + e of row b, head h. Rows and
// columns past D_k and D_v load element 0 (in bounds) and become zeros in decode_convert.
template <typename scalar_t, int NP, int MC>
__device__ __forceinline__ void decode_load_raw(const Problem& p, int64_t b, int h, int r0, int jc, int64_t t,
                                                DecodeRaw<scalar_t, NP, MC>& x) {
  const scalar_t* q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + h * p.sq.h + t * p.sq.t;
  const scalar_t* k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + h * p.sk.h + t * p.sk.t;
  const scalar_t* v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + h * p.sv.h + t * p.sv.t;
  x.g = gate_bits<scalar_t>(p.gate, b * p.sg.b + h * p.sg.h + t * p.sg.t, p.g32);
  x.b = gate_bits<scalar_t>(p.beta, b * p.sb.b + h * p.sb.h + t * p.sb.t, p.b32);
#pragma unroll
  for (int m = 0; m < MC; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = jc + 32 * m + e;
      x.v[m][e] = v[(j < p.Dv ? j : 0) * p.sv.d];
    }
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const int i = r0 + 32 * r < p.Dk ? r0 + 32 * r : 0;
    x.k[r] = k[i * p.sk.d];
    x.q[r] = q[i * p.sq.d];
  }
}
template <typename scalar_t, int NP, int MC>
__device__ __forceinline__ void decode_convert(const Problem& p, int r0, int jc, const DecodeRaw<scalar_t, NP, MC>& x,
                                               DecodeStep<NP, MC>& s) {
  s.g = gate_value<scalar_t>(x.g, p.g32);
  const float bt = gate_value<scalar_t>(x.b, p.b32);
#pragma unroll
  for (int m = 0; m < MC; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.bv[m][e] = jc + 32 * m + e < p.Dv ? bt * to_float(x.v[m][e]) : 0.f;
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const bool in = r0 + 32 * r < p.Dk;
    s.k[r] = in ? to_float(x.k[r]) : 0.f;
    s.q[r] = in ? to_float(x.q[r]) : 0.f;
  }
}

// decode_persistent: the same step for many rows, with a 16-byte pool and D_k <= 128. A block an SM walks
// the items (row, head, 128-column tile) strided by the grid; while it computes one, the next item's state
// (64 KB) is already in flight by cp.async into the other half of a shared-memory ring and its step-0 inputs
// into registers, so an SM always has a whole state on its way (decode_kernel has state bytes in flight
// only for part of each block's life, as many as its registers hold). Each state element is read from
// shared memory, updated and stored from registers (the last step) or back to shared memory (T > 1). The
// arithmetic and every sum's order are decode_kernel's with NV = 128: y and the state are bitwise its.
// RAW: the next item's inputs kept as loaded and converted after the current item's compute (false: converted
// at once, which waits for the loads before the compute). DUP: the duplicate-row check (false: none).
template <typename scalar_t, bool RAW, bool DUP>
__global__ void __launch_bounds__(kMaxThreads, 1) decode_persistent_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) float ring[];
  __shared__ __align__(16) float red[2][kMaxThreads / 32][kRingD];
  griddep_wait<>();
  griddep_launch<>();
  constexpr int NP = 4, MC = 4;
  const int tid = threadIdx.x, r0 = tid >> 3, jc = 4 * (tid & 7);  // as decode_kernel's, within the tile
  const int64_t items = p.BH * p.vtiles;
  struct Item {
    int64_t b, slot;
    int h, jt;
    bool valid;
  };
  auto row_of = [&](int64_t it) { return it / p.vtiles / p.H; };
  auto item_at = [&](int64_t it, int64_t slot) {
    Item d;
    d.jt = kRingD * (int)(it % p.vtiles);
    d.h = (int)(it / p.vtiles % p.H);
    d.b = row_of(it);
    d.slot = slot;
    d.valid = slot >= 0 && slot < p.P;
    return d;
  };
  auto state_of = [&](const Item& d) { return p.s_out + (d.valid ? d.slot : 0) * p.ssi.b + d.h * p.ssi.h + d.jt; };
  // the item's tile into buf: 128 rows of 32 pieces of 16 bytes, zeros outside D_k x D_v and for unusable slots
  auto issue = [&](const Item& d, float* buf) {
    const float* src = state_of(d);
    for (int e = tid; e < kRingD * kRingD / 4; e += kMaxThreads) {
      const int i = e >> 5, j = 4 * (e & 31);
      const bool in = d.valid && i < p.Dk && d.jt + j < p.Dv;
      cp_async<16>(buf + i * kRingD + j, in ? src + i * p.ssi.i + j : src, in);
    }
    cp_async_commit<>();
  };
  // The index of the item after next is loaded an item ahead of its use: the state's address never waits
  // on a load.
  const int64_t grid = gridDim.x;
  int64_t it = blockIdx.x;  // the plan's grid is at most the items
  Item cur = item_at(it, slot_of(p, row_of(it))), nxt = cur;
  int64_t slot_next = it + grid < items ? slot_of(p, row_of(it + grid)) : 0;
  DecodeStep<NP, MC> x, xc;        // xc: the next item's, converted at load (RAW false)
  DecodeRaw<scalar_t, NP, MC> xn;  // the next item's as loaded (RAW true)
  issue(cur, ring);
  decode_load_step<scalar_t>(p, cur.b, cur.h, r0, cur.jt + jc, 0, x);
  for (int n = 0; it < items; ++n, it += grid) {
    float* S = ring + (n & 1) * kRingD * kRingD;
    if (it + grid < items) {
      // the other buffer's last reads (the item before) came before the last step's barrier
      nxt = item_at(it + grid, slot_next);
      issue(nxt, ring + ((n + 1) & 1) * kRingD * kRingD);
      if constexpr (RAW) decode_load_raw<scalar_t>(p, nxt.b, nxt.h, r0, nxt.jt + jc, 0, xn);
      else decode_load_step<scalar_t>(p, nxt.b, nxt.h, r0, nxt.jt + jc, 0, xc);
      if (it + 2 * grid < items) slot_next = slot_of(p, row_of(it + 2 * grid));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // duplicates as decode_kernel: the lowest row keeps the slot
    bool dup = false;
    if (DUP && p.idx != nullptr && cur.valid)
      for (int64_t e = tid; e < cur.b; e += blockDim.x) dup |= slot_of(p, e) == cur.slot;
    const bool own = __syncthreads_or(dup) == 0 && cur.valid;  // also: every thread's copies have landed
    const float fill = cur.slot == -1 ? 0.f : __int_as_float(0x7fffffff);
    float* pool = state_of(cur);
    scalar_t* y = static_cast<scalar_t*>(p.y) + cur.b * p.sy.b + cur.h * p.sy.h;
    for (int t = 0; t < p.T; ++t) {
      if (t > 0) decode_load_step<scalar_t>(p, cur.b, cur.h, r0, cur.jt + jc, t, x);
      const bool last = t == p.T - 1;
      float acc[MC][4] = {};
      if (own) {
#pragma unroll
        for (int r = 0; r < NP; ++r) {
          const int i = r0 + 32 * r;
          if (i >= p.Dk) continue;  // padded rows stay out: 0 * inf would be NaN
#pragma unroll
          for (int m = 0; m < MC; ++m) {
            const int j = jc + 32 * m;
            const float4 s = *reinterpret_cast<const float4*>(S + i * kRingD + j);
            float s4[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s4[e] = fmaf(x.g, s4[e], x.k[r] * x.bv[m][e]);
              acc[m][e] = fmaf(x.q[r], s4[e], acc[m][e]);
            }
            const float4 o = make_float4(s4[0], s4[1], s4[2], s4[3]);
            if (!last)
              *reinterpret_cast<float4*>(S + i * kRingD + j) = o;  // only this thread reads it back
            else if (cur.jt + j < p.Dv)
              *reinterpret_cast<float4*>(pool + i * p.ssi.i + j) = o;
          }
        }
      }
      decode_write_y<MC>(acc, red[t & 1], y + t * p.sy.t, cur.jt, p.Dv, p.sy.d, own, fill);
    }
    if constexpr (RAW) decode_convert<scalar_t>(p, r0, nxt.jt + jc, xn, x);  // (stale on the last item: unused)
    else x = xc;
    cur = nxt;
  }
}

}  // namespace
}  // namespace gr

// The launch for contiguous-or-strided CUDA tensors (no argument checks: a dev harness). variant: 0 = convert
// at load with the duplicate check (device run 4's production candidate), 1 = raw loads with the check,
// 2 = raw loads without it.
torch::Tensor decode_general(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor gate, torch::Tensor beta,
                             torch::Tensor pool, torch::Tensor idx, int64_t variant, int64_t blocks) {
  using namespace gr;
  // the ring's conditions (solution.py: pool_aligned, D_k <= 128); no other argument checks
  TORCH_CHECK(q.size(3) <= kRingD && pool.stride(3) == 1 && pool.size(3) % 4 == 0 && pool.stride(0) % 4 == 0 &&
              pool.stride(1) % 4 == 0 && pool.stride(2) % 4 == 0 && (uintptr_t)pool.data_ptr() % 16 == 0 &&
              q.size(1) > 0 && q.size(0) * q.size(2) > 0, "decode_general: a 16-byte pool, D_k <= 128, T, B, H > 0");
  auto y = torch::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  DecodeParams p;
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.gate = gate.data_ptr(); p.beta = beta.data_ptr();
  p.y = y.data_ptr();
  p.sq = {q.stride(0), q.stride(1), q.stride(2), q.stride(3)};
  p.sk = {k.stride(0), k.stride(1), k.stride(2), k.stride(3)};
  p.sv = {v.stride(0), v.stride(1), v.stride(2), v.stride(3)};
  p.sy = {y.stride(0), y.stride(1), y.stride(2), y.stride(3)};
  p.sg = {gate.stride(0), gate.stride(1), gate.stride(2)};
  p.sb = {beta.stride(0), beta.stride(1), beta.stride(2)};
  p.T = (int)q.size(1); p.H = (int)q.size(2); p.Dk = (int)q.size(3); p.Dv = (int)v.size(3);
  p.BH = q.size(0) * q.size(2);
  p.s_in = pool.data_ptr<float>(); p.s_out = pool.data_ptr<float>();
  p.ssi = {pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3)}; p.sso = p.ssi;
  p.g32 = gate.scalar_type() == torch::kFloat; p.b32 = beta.scalar_type() == torch::kFloat;
  p.idx = idx.data_ptr(); p.idx_stride = idx.stride(0); p.P = pool.size(0); p.idx64 = idx.scalar_type() == torch::kLong;
  p.vtiles = (int)((p.Dv + kRingD - 1) / kRingD);
  const int64_t items = p.BH * p.vtiles;
  const dim3 grid((unsigned)std::min<int64_t>(items, blocks));
  auto s = c10::cuda::getCurrentCUDAStream();
  cudaError_t err = cudaErrorInvalidValue;
#define GR_DEV_CASE(T_, R_, D_)                                                                     \
  {                                                                                                 \
    static bool done[64] = {};                                                                      \
    err = allow_smem(decode_persistent_kernel<T_, R_, D_>, done);                                   \
    if (err == cudaSuccess) err = launch_ex(decode_persistent_kernel<T_, R_, D_>, grid, kDecodeRingSmem, s, true, p); \
  }
#define GR_DEV_VARIANTS(T_)                                                                         \
  if (variant == 0) GR_DEV_CASE(T_, false, true) else if (variant == 1) GR_DEV_CASE(T_, true, true) \
  else GR_DEV_CASE(T_, true, false)
  if (q.scalar_type() == torch::kFloat) GR_DEV_VARIANTS(float)
  else if (q.scalar_type() == torch::kHalf) GR_DEV_VARIANTS(__half)
  else GR_DEV_VARIANTS(__nv_bfloat16)
#undef GR_DEV_VARIANTS
#undef GR_DEV_CASE
  TORCH_CHECK(err == cudaSuccess, "decode_general launch: ", cudaGetErrorString(err));
  return y;
}
"""


def build_general():
    cuda = solution.PRELUDE_SRC + solution.DEVICE_SRC + solution.DECODE_SRC + GENERAL_SRC
    return load_inline("dev_decode_general", cpp_sources="torch::Tensor decode_general(torch::Tensor q, torch::Tensor k, "
                       "torch::Tensor v, torch::Tensor gate, torch::Tensor beta, torch::Tensor pool, torch::Tensor idx, "
                       "int64_t variant, int64_t blocks);", cuda_sources=cuda, functions=["decode_general"],
                       extra_cuda_cflags=["-O3"], verbose=False)


def check_general(gen, sms):
    """Every variant bitwise the tile kernel (nv = 128) on odd shapes with -1, out-of-range and duplicate
    rows, int32 indices, several steps and every dtype (variant 2 has no duplicate check: no duplicates)."""
    bad = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for B, T, H, Dk, Dv in [(70, 1, 4, 128, 128), (37, 3, 4, 100, 200), (300, 2, 1, 7, 36)]:
            P = B + 3
            xs = [x.to(dtype) for x in (torch.randn(B, T, H, Dk, device="cuda"), torch.randn(B, T, H, Dk, device="cuda"),
                                         torch.randn(B, T, H, Dv, device="cuda"), torch.rand(B, T, H, device="cuda"),
                                         torch.rand(B, T, H, device="cuda"))]
            for variant in (0, 1, 2):
                rows = torch.randperm(P)[:B]
                rows[1], rows[2] = -1, P + 7
                if variant < 2:
                    rows[3] = rows[0]
                idx = rows.to(device="cuda", dtype=torch.int32)
                pool = torch.randn(P, H, Dk, Dv, device="cuda")
                tile, ring = pool.clone(), pool.clone()
                want = solution._decode_with(*xs, tile, idx, nv=128)
                got = gen.decode_general(*xs, ring, idx, variant, sms)
                same = torch.equal(got.view(torch.int16 if dtype != torch.float32 else torch.int32),
                                   want.view(torch.int16 if dtype != torch.float32 else torch.int32))
                if not (same and torch.equal(ring.view(torch.int32), tile.view(torch.int32))):
                    bad.append((str(dtype), B, T, H, Dk, Dv, variant))
    return bad


def build():
    return load_inline("dev_decode_persistent", cpp_sources="torch::Tensor decode_persistent(torch::Tensor q, "
                       "torch::Tensor k, torch::Tensor v, torch::Tensor gate, torch::Tensor beta, torch::Tensor pool, "
                       "torch::Tensor idx, int64_t blocks);", cuda_sources=SRC, functions=["decode_persistent"],
                       extra_cuda_cflags=["-O3"], verbose=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    args = ap.parse_args()
    mod, gen = build(), build_general()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bad = check_general(gen, sms)
    print({"general_bitwise_failures": bad}, flush=True)
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
        for variant in (0, 1, 2):
            p3 = pool.clone()
            y3 = gen.decode_general(*xs, p3, idx, variant, sms)
            row[f"v2_{variant}_bitwise"] = bool(torch.equal(y1, y3) and torch.equal(p1, p3))
        timed = [("production_nv128", lambda: solution._decode_with(*xs, pool, idx, nv=128)),
                 ("persistent_1x", lambda: mod.decode_persistent(*xs, pool, idx, sms))] + \
                [(f"v2_{variant}", lambda variant=variant: gen.decode_general(*xs, pool, idx, variant, sms))
                 for variant in (0, 1, 2)]
        for rep in range(2):  # interleaved repeats
            for name, fn in timed:
                row.setdefault(name + "_us", []).append(kernelbench_time(fn, [], trials=args.trials)["median"] * 1e3)
        row["floor_us"] = (2 * B * H * D * D * 4 + B * H * 4 * D * 2) / 4.17e12 * 1e6
        rows.append(row)
        print(row, flush=True)
    if os.environ.get("OUT"):
        save("decode_persistent.json", {"device": torch.cuda.get_device_name(0), "general_bitwise_failures": bad,
                                        "rows": rows})


if __name__ == "__main__":
    main()
