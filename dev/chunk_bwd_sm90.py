"""chunk_bwd_sm90: the Hopper chunked backward of docs/training-design.md section 7 as a dev kernel (v1), bf16 inputs,
D_k = D_v = 128, any T (rows past T zero-filled, gates 1 and betas 0 there), one CTA a (b, h) (no segments), inputs
with any (b, t, h) strides and 16-byte aligned rows, contiguous outputs, finite inputs (a staged inf meets the
masks' zeros inside a product).
Its own reference check (float64 autograd through the loop,
naive.recurrent_backward_naive; each gradient beside the float64 gradient rounded to bf16) and benchmark (beside
solution.py's mma.sync backward in the same process). Not in solution.py: the checkpoints here come from a float64
torch pass, or (compared in the check, timed in the bench) from `ckpt_kernel`, a dev stand-in for the checkpoint
pass that the shipped form would take from chunk_sm90's state mode, a launch before this one.

One CTA of 384 threads, chunks of C = 64 backwards, in lockstep (a block barrier at each chunk's start and end):
- all threads: the chunk's q, k, v, dy tiles by cp.async into bf16 tiles [d / 8][t][8] (K-major for the sums over
  d, MN-major for the sums over t);
- WG0 (setmaxnreg --regs[0]): the gate tables (L[t][s] = prod_{r=s+1..t} g_r, double products rounded once; A, Ah,
  w, beta w; Lx = L shifted down a row, bf16 hi / lo), then dgate's terms (a)-(c) from the consumers' row-dot
  partials plus term (d)'s partials, and dbeta (fixed-order sums);
- WG1, WG2 (setmaxnreg --regs[1]), consumer c holding rows i = 64 c .. of G (the state gradient after the chunk)
  in a wgmma accumulator across chunks: X = QK (c = 0) or Dd (c = 1) and the masked weights MP, MQ, MD (bf16
  hi / lo); consumer 0 then dgate's C^3 term as a product, M = E Lx^T (E = beta QK Dd below the diagonal, its
  accumulator recast to A fragments, 3 terms) and the column sums of L o M; R^T = S dY^T (S rows from the
  checkpoint in global memory, split hi / lo), f's part; dq^T = R^T diag(A) + K^T MQ^T; Rk^T = G V^T (G's
  accumulator recast), e's part; dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part; KG = K G (G hi / lo from shared
  memory, the consumer's 64 columns j); dv = diag(beta w) KG + MP^T dY; G <- A_63 G + (diag(A) Q)^T dY. dq, dk, dv
  stored from the accumulators (bf16).
Variants (template bits, --variants; docs/perf-notes.md, twenty-third and twenty-fourth sessions): kGateAhead,
kEarly, kLdsm and kExact.

    python3 dev/chunk_bwd_sm90.py [--shapes S2-bf16,S4-bf16] [--variants 0,16] [--trials 10]
        (writes $OUT/chunk_bwd_sm90.json)
    python3 dev/chunk_bwd_sm90.py --build-only   (compiles only; CUDA_HOME=/usr/local/cuda)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from dev.bwd_sm90_probe import FORMS, wgmma_bf16  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from tools.common import save  # noqa: E402
from tools.sm90_build import (BF16_TILE_SRC, FUNC_ATTRS_SRC, PROBE_HELPERS_SRC, build, print_build,  # noqa: E402
                              solution_constant)

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GR_WGMMA 1
#endif

namespace cbs {
typedef __nv_bfloat16 bf16;
struct Params {
  const bf16 *q, *k, *v, *dy, *gate, *beta;  // (B, T, H, 128) and (B, T, H)
  int64_t st[4][3];                           // (b, t, h) element strides of q, k, v, dy (d: 1; rows 16-byte aligned)
  int64_t sg[3], sb[3];                       // (b, t, h) strides of gate and beta
  const float* ckpt;                          // (B H, ceil(T / 64), 128, 128): S at each chunk start
  const float* dfinal;                        // (B, H, 128, 128) or null
  bf16 *dq, *dk, *dv, *dgate, *dbeta;         // contiguous (B, T, H, 128) and (B, T, H)
  float* ds0;                                 // (B, H, 128, 128)
  int T, H;
};
namespace {

WGMMA_SYNC

WGMMA_FORMS

PROBE_HELPERS


// Shared memory (bytes): bf16 tiles q, k, v, dy [d / 8][t][8]; G hi / lo [j / 8][i][8]; the masked weights hi / lo
// [s / 8][row][8]; Lx hi / lo (Lx[t][s] = L[t-1][s] for s < t, [s / 8][t][8]); L (fp32, pitch 65); the tables;
// the consumers' row-dot partials.
constexpr int kQ = 0, kK = 16384, kV = 32768, kY = 49152, kGH = 65536, kGL = 98304;
constexpr int kMQH = 131072, kMQL = 139264, kMDH = 147456, kMDL = 155648, kMPH = 163840, kMPL = 172032;
constexpr int kLxH = 180224, kLxL = 188416, kL = 196608, kTab = kL + 64 * 65 * 4, kPart = kTab + 6 * 256;
constexpr int kSmem = kPart + (3 * 8 * 64 + 8 + 2 * 64 + 4 * 64 + 4) * 4;  // (+ kExact's flag)
static_assert(kSmem <= 232448, "fits the opt-in shared memory of an H200");
// tables (floats at kTab): A 0, Ah 64, w 128, beta 192, beta w 256, gate 320
// partials (floats at kPart): f [8][64] at 0, e at 512, dbeta at 1024 (slot c * 4 + warp), c0 [8] at 1536,
// then the sums f at 1544, e at 1608, then dgate's term (d) [4][64] at 1672 (c = 0's warps)
constexpr int PC = 65;
// Variants (bits of V; measured and dropped, their code at commit e8a6c02: an L2 prefetch of the next chunk's tiles
// and S (bit 2, 1%), dq and dk stored as pairs after a movmatrix transpose (4, slower: spills), no stores (8, timing
// only); at commit 1561c6b (twenty-fourth session, run 1: 3% slower): dq, dk, dv staged in the weights' space and
// copied out by WG0 (32)): kGateAhead (WG0 loads the next chunk's gates and betas during the chunk), kEarly (the next chunk's
// k and v tiles loaded by the consumers once both are past KG, their last reader), kLdsm (the q and k tiles' values
// for the row dots and G's update fragments by ldmatrix.trans instead of 2-byte loads), kExact (chunks with a
// non-finite tile value form their masked sums by FMAs: NaN exactly where the float64 loop has it).
constexpr int kAuxRegs = AUX_REGS, kConsRegs = CONS_REGS;  // setmaxnreg split
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");
constexpr int kGateAhead = 16, kEarly = 64, kLdsm = 128, kExact = 256;

// 16 bytes by cp.async; valid false: zeros (no global read: the source size is 0).
__device__ __forceinline__ void cp16(unsigned char* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ float ldb(const unsigned char* p) {
  return __bfloat162float(*reinterpret_cast<const bf16*>(p));
}
// Named barriers, non-aligned (barrier.sync, not bar.sync = barrier.sync.aligned): the roles reach the chunk's
// barriers from different code, which .aligned does not allow (synccheck reported "divergent threads in block" at
// WG0's barrier (1) with the aligned form, __syncwarp or not: twenty-fourth session, run 3).
__device__ __forceinline__ void consumers_sync() { asm volatile("barrier.sync 1, 256;\n" ::: "memory"); }
// (2) with the OR of every consumer thread's x (one barrier).
__device__ __forceinline__ bool consumers_sync_or(bool x) {
  uint32_t r;
  asm volatile("{\n .reg .pred p, o;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred o, 1, 256, p;\n"
               " selp.u32 %0, 1, 0, o;\n}\n" : "=r"(r) : "r"((uint32_t)x) : "memory");
  return r != 0;
}
__device__ __forceinline__ void wg0_sync() { asm volatile("barrier.sync 5, 128;\n" ::: "memory"); }
// Whole-CTA barriers by id and count (arrive: consumers; sync: WG0, or everyone for the chunk's barriers).
template <int ID>
__device__ __forceinline__ void arrive_all() { asm volatile("barrier.arrive %0, 384;\n" ::"n"(ID) : "memory"); }
template <int ID>
__device__ __forceinline__ void sync_all() { asm volatile("barrier.sync %0, 384;\n" ::"n"(ID) : "memory"); }

// The chunk's weights from the consumer's 64 x 64 accumulator X (rows r = 16 wl + g (+8), columns s = 8 n + 2 q
// (+1)): L[r][s] (beta_s) X[r][s] for s <= r, else 0; split, stored hi / lo at [s / 8][r][8].
template <bool BETA>
__device__ __forceinline__ void put_weights(unsigned char* sm, const float (&X)[32], int off_h, int off_l, int wl,
                                            int g, int q) {
  const float* L = reinterpret_cast<const float*>(sm + kL);
  const float* bt = reinterpret_cast<const float*>(sm + kTab) + 192;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wl + g + 8 * h, s = 8 * n + 2 * q;
      const float b0 = BETA ? bt[s] : 1.f, b1 = BETA ? bt[s + 1] : 1.f;  // (inside the selects: a NaN beta stays
      const float x0 = s <= r ? X[4 * n + 2 * h] * L[r * PC + s] * b0 : 0.f;  // out of the masked slots)
      const float x1 = s + 1 <= r ? X[4 * n + 2 * h + 1] * L[r * PC + s + 1] * b1 : 0.f;
      uint32_t hi, lo;
      split2<2>(x0, x1, hi, lo);
      const int off = (s >> 3) * 1024 + r * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + off_h + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + off_l + off) = lo;
    }
}

// Column u of a 64 x 64 accumulator (rows i = i0 + 16 wl + g (+8)) against row u of a bf16 tile, over this warp's
// 16 rows i: one partial a warp and column, at part[slot][u].
// Four 8 x 8 bf16 blocks of a tile stored [x / 8][t][8], transposed: block j's lane (g, q) gets the pair
// (t = 2 q, 2 q + 1; x = g) of it: the A-fragment (and accumulator-column) order. p: this lane's row address
// (lanes 8 j .. 8 j + 7 give block j's 8 rows t).
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const unsigned char* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((uint32_t)__cvta_generic_to_shared(p))
               : "memory");
}
__device__ __forceinline__ float2 unpack(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
// LDSM: the tile's values by ldmatrix (4 a call), else by 2-byte loads (32 a call).
template <bool LDSM>
__device__ __forceinline__ void col_dots(unsigned char* sm, const float (&X)[32], int tile, int i0, float* part,
                                         int wl, int g, int q) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < 4; ++m) {  // columns u of blocks n = 2 m, 2 m + 1
    uint32_t r[4];  // block j: rows i of half j & 1, columns of block n = 2 m + (j >> 1)
    if constexpr (LDSM) {
      const int j = lane >> 3;
      ldsm4_t(r, sm + tile + ((i0 + 16 * wl + 8 * (j & 1)) >> 3) * 1024 + (16 * m + 8 * (j >> 1) + (lane & 7)) * 16);
    }
#pragma unroll
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 2 * m + nn, u = 8 * n + 2 * q + e, i = i0 + 16 * wl + g;
        float a0, a1;
        if constexpr (LDSM) {
          const float2 v0 = unpack(r[2 * nn]), v1 = unpack(r[2 * nn + 1]);
          a0 = e ? v0.y : v0.x, a1 = e ? v1.y : v1.x;
        } else {
          a0 = ldb(sm + tile + (i >> 3) * 1024 + u * 16 + (i & 7) * 2);
          a1 = ldb(sm + tile + ((i + 8) >> 3) * 1024 + u * 16 + ((i + 8) & 7) * 2);
        }
        float x = X[4 * n + e] * a0 + X[4 * n + 2 + e] * a1;
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        x += __shfl_xor_sync(0xffffffffu, x, 16);
        if (g == 0) part[u] = x;
      }
  }
}

// acc += A W over the chunk's 64 steps: A MN-major from a staged tile, W the weights hi / lo (K-major B, or
// MN-major with BMN).
template <bool BMN>
__device__ __forceinline__ void weights_product(float (&acc)[32], const unsigned char* sm, int a_off, int wh, int wl_) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    wg_fence();
    const uint64_t da = mdesc(sm, a_off, 64, kb);
    if constexpr (BMN) {
      wg_ss64_11(acc, da, mdesc(sm, wh, 64, kb));
      wg_ss64_11(acc, da, mdesc(sm, wl_, 64, kb));
    } else {
      wg_ss64_10(acc, da, kdesc(sm, wh, 64, kb));
      wg_ss64_10(acc, da, kdesc(sm, wl_, 64, kb));
    }
  }
  wg_commit();
  wg_wait<0>();
  acc_fence(acc);
}

// A transposed 64 x 64 accumulator X[i][t] (rows i = i0 + 16 wl + g (+8), columns t) to out[t][i] (bf16, row
// stride ld elements), each element times scale[t] (or 1); GUARD: rows t < tc only (the last chunk).
template <bool GUARD>
__device__ __forceinline__ void store_t(bf16* out, int64_t ld, const float (&X)[32], const float* scale, int i0,
                                        int wl, int g, int q, int tc) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 8 * n + 2 * q, i = i0 + 16 * wl + g + 8 * h;
      float x0 = X[4 * n + 2 * h], x1 = X[4 * n + 2 * h + 1];
      if (scale) x0 *= scale[t], x1 *= scale[t + 1];
      if (!GUARD || t < tc) out[t * ld + i] = __float2bfloat16_rn(x0);
      if (!GUARD || t + 1 < tc) out[(t + 1) * ld + i] = __float2bfloat16_rn(x1);
    }
}

// Every thread: its share of chunk ch's 4 tiles (64 rows x 16 pieces of 16 bytes each) by cp.async, then (after
// its role's own work) the wait and the async-proxy fence before the chunk's barrier (1).
// kExact: a chunk whose q, k, v or dy tile, gates or betas hold a non-finite value forms its masked sums by FMAs,
// so that a masked zero never meets the inf or NaN inside a product (the float64 loop never forms those terms).
// The weights are the same bf16 hi / lo pairs the products read; the tiles are exact.
__device__ __forceinline__ float wsum(const unsigned char* sm, int hi, int lo, int off) {
  return ldb(sm + hi + off) + ldb(sm + lo + off);
}
// The transposed accumulators' masked sums, over steps r, for this thread's elements (i = ir (+8), x = 8 n + 2 q + e):
// DK false: dq^T[i][x = t] += sum_{r <= t} K[r][i] MQ[t][r]; DK true: dkt^T[i][x = s] += sum_{r >= s} Q[r][i] MD[r][s]
// (both weights stored [column / 8][row][8]).
template <bool DK>
__device__ __noinline__ void fma_t(float (&R)[32], const unsigned char* sm, int ir, int q) {
  constexpr int tile = DK ? kQ : kK, wh = DK ? kMDH : kMQH, wlo = DK ? kMDL : kMQL;
  for (int r = 0; r < 64; ++r) {
    const float a0 = ldb(sm + tile + (ir >> 3) * 1024 + r * 16 + (ir & 7) * 2);
    const float a1 = ldb(sm + tile + ((ir + 8) >> 3) * 1024 + r * 16 + ((ir + 8) & 7) * 2);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = 8 * n + 2 * q + e;
        if (DK ? r < x : r > x) continue;
        const int off = DK ? (x >> 3) * 1024 + r * 16 + (x & 7) * 2 : (r >> 3) * 1024 + x * 16 + (r & 7) * 2;
        const float w = wsum(sm, wh, wlo, off);
        R[4 * n + e] = fmaf(a0, w, R[4 * n + e]);
        R[4 * n + 2 + e] = fmaf(a1, w, R[4 * n + 2 + e]);
      }
  }
}
// dv[s][j] += sum_{u >= s} MP[u][s] dY[u][j] (s = sr (+8), j = j0 + 8 n + 2 q + e).
__device__ __noinline__ void fma_dv(float (&R)[32], const unsigned char* sm, int sr, int j0, int q) {
  for (int u = 0; u < 64; ++u) {
    const float w0 = u >= sr ? wsum(sm, kMPH, kMPL, (sr >> 3) * 1024 + u * 16 + (sr & 7) * 2) : 0.f;
    const float w1 = u >= sr + 8 ? wsum(sm, kMPH, kMPL, ((sr + 8) >> 3) * 1024 + u * 16 + ((sr + 8) & 7) * 2) : 0.f;
    if (u < sr) continue;  // (both weights zero: the term is not formed)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = j0 + 8 * n + 2 * q + e;
        const float y = ldb(sm + kY + (j >> 3) * 1024 + u * 16 + (j & 7) * 2);
        R[4 * n + e] = fmaf(w0, y, R[4 * n + e]);
        if (u >= sr + 8) R[4 * n + 2 + e] = fmaf(w1, y, R[4 * n + 2 + e]);
      }
  }
}
// M[u][t] = sum_{s < t} E[u][s] L[t-1][s] (u = 16 wl + g (+8), t = 8 n + 2 q + e), E in the quad's registers
// (E[u][s] is lane (g, (s % 8) / 2)'s X[4 (s / 8) + 2 h + s % 2]).
__device__ __forceinline__ void fma_m(float (&M)[32], const float (&E)[32], const float* L, int q, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) M[i] = 0.f;
#pragma unroll
  for (int s = 0; s < 63; ++s) {
    const int src = (lane & ~3) | ((s & 7) >> 1), r = 4 * (s >> 3) + (s & 1);
    const float e0 = __shfl_sync(0xffffffffu, E[r], src), e1 = __shfl_sync(0xffffffffu, E[r + 2], src);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * n + 2 * q + e;
        if (s >= t) continue;
        const float lx = L[(t - 1) * PC + s];
        M[4 * n + e] = fmaf(e0, lx, M[4 * n + e]);
        M[4 * n + 2 + e] = fmaf(e1, lx, M[4 * n + 2 + e]);
      }
  }
}
// An accumulator through a called FMA fallback by way of a copy: passed itself, its address would escape and keep it
// in local memory on the fast path too (a review found 256 B of stack there).
template <typename F>
__device__ __forceinline__ void exact(float (&acc)[32], F&& f) {
  float t[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) t[i] = acc[i];
  f(t);
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = t[i];
}
// MASK: bit x loads tile x (q, k, v, dy), by NT threads from thread index `first`.
template <int MASK, int NT>
__device__ __forceinline__ void load_tiles(const Params& p, unsigned char* sm, int64_t bh, int ch, int first = 0) {
  const int64_t b = bh / p.H, h = bh - b * p.H;
  const int t0 = ch * 64;
  for (int e = (int)threadIdx.x - first; e < 4096; e += NT) {
    const int tile = e >> 10, r = (e >> 4) & 63, c8 = e & 15;
    if (!((MASK >> tile) & 1)) continue;
    const bf16* src = tile == 0 ? p.q : tile == 1 ? p.k : tile == 2 ? p.v : p.dy;
    // (selected, not indexed: a run-time index into the parameter array would copy it to local memory)
    const int64_t sb = tile == 0 ? p.st[0][0] : tile == 1 ? p.st[1][0] : tile == 2 ? p.st[2][0] : p.st[3][0];
    const int64_t stt = tile == 0 ? p.st[0][1] : tile == 1 ? p.st[1][1] : tile == 2 ? p.st[2][1] : p.st[3][1];
    const int64_t sh = tile == 0 ? p.st[0][2] : tile == 1 ? p.st[1][2] : tile == 2 ? p.st[2][2] : p.st[3][2];
    const bool valid = t0 + r < p.T;  // rows past T: zeros
    cp16(sm + tile * 16384 + c8 * 1024 + r * 16, valid ? src + b * sb + (int64_t)(t0 + r) * stt + h * sh + 8 * c8 : src,
         valid);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void tiles_landed() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  fence_async_smem();
}

template <int V>
__device__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh, int nck) {
  const int lt = threadIdx.x & 127, wl = lt >> 5, lane = lt & 31, g = lane >> 2, q = lane & 3;
  const float* tab = reinterpret_cast<const float*>(sm + kTab);
  float* part = reinterpret_cast<float*>(sm + kPart);
  const float* L = reinterpret_cast<const float*>(sm + kL);
  const int i0 = 64 * c, ir = i0 + 16 * wl + g;  // this thread's state rows ir, ir + 8
  const int64_t b = bh / p.H, h = bh - b * p.H, rs = (int64_t)p.H * 128;  // rs: a step's row stride
  float G[64];
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        G[4 * n + 2 * hh + e] = p.dfinal ? p.dfinal[bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q + e] : 0.f;
  auto put_g = [&]() {  // G's hi / lo ([j / 8][i][8], MN-major for KG's B)
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = ir + 8 * hh, j = 8 * n + 2 * q;
        uint32_t hi, lo;
        split2<2>(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1], hi, lo);
        const int off = (j >> 3) * 2048 + i * 16 + (j & 7) * 2;
        *reinterpret_cast<uint32_t*>(sm + kGH + off) = hi;
        *reinterpret_cast<uint32_t*>(sm + kGL + off) = lo;
      }
    fence_async_smem();
  };
  put_g();
  for (int ch = nck - 1; ch >= 0; --ch) {
    const int64_t t0 = (int64_t)ch * 64, row0 = (b * p.T + t0) * rs + h * 128;  // element (t0, h, 0) of an output
    const int tc = min(64, p.T - (int)t0);  // the chunk's steps (rows past T are not stored)
    float X[32], R[32], Rk[32];
    if (!(V & kEarly) || ch == nck - 1) load_tiles<15, 384>(p, sm, bh, ch);
    else load_tiles<9, 384>(p, sm, bh, ch);  // q and dy (k and v came during the chunk before)
    tiles_landed();
    sync_all<6>();  // (1) the chunk's tiles and tables
    const float* S = p.ckpt + (bh * nck + ch) * 16384;
    // X = QK (c = 0) or Dd (c = 1)
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, c ? kY : kQ, 64, kb), db = kdesc(sm, c ? kV : kK, 64, kb);
      if (kb == 0) wg_ss64_00_z(X, da, db);
      else wg_ss64_00(X, da, db);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(X);
    if (c == 0) {
      put_weights<true>(sm, X, kMPH, kMPL, wl, g, q);  // MP[u][s] = L[u][s] beta_s QK[u][s]
    } else {
      put_weights<true>(sm, X, kMQH, kMQL, wl, g, q);   // MQ[t][s] = L[t][s] beta_s Dd[t][s]
      put_weights<false>(sm, X, kMDH, kMDL, wl, g, q);  // MD[u][s] = L[u][s] Dd[u][s]
    }
    fence_async_smem();
    bool bad = false;  // kExact: a non-finite value in the chunk's tiles, gates or betas
    if (V & kExact) {  // QK (Dd) has a non-finite element iff the q or k (dy or v) tile has one (inf 0 is NaN), or
      bool nf = false;  // a product overflows (harmless: the exact path)
#pragma unroll
      for (int i = 0; i < 32; ++i) nf |= !(fabsf(X[i]) <= 3.402823466e38f);
      const int* wg0_flag = reinterpret_cast<const int*>(part) + 1928;  // the gates' and betas' (WG0, before (1))
      bad = consumers_sync_or(nf) || wg0_flag[0] || wg0_flag[1];  // (2) the weights, and the flag
    } else {
      consumers_sync();  // (2) the weights
    }
    if (c == 0) {  // dgate's term (d): sum_{u >= t} L[u][t] M[u][t], M = E Lx^T, E[u][s] = beta_s QK Dd (s < u)
      float Dd[32];  // Dd = dY V^T again (consumer 1 has its own), then M
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        wg_fence();
        if (kb == 0) wg_ss64_00_z(Dd, kdesc(sm, kY, 64, kb), kdesc(sm, kV, 64, kb));
        else wg_ss64_00(Dd, kdesc(sm, kY, 64, kb), kdesc(sm, kV, 64, kb));
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(Dd);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int u = 16 * wl + g + 8 * hh, s = 8 * n + 2 * q + e, x = 4 * n + 2 * hh + e;
            X[x] = s < u ? tab[192 + s] * X[x] * Dd[x] : 0.f;
          }
      if ((V & kExact) && bad) {
        fma_m(Dd, X, L, q, lane);
      } else {
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {  // E's accumulator as A fragments, hi / lo; 3 terms
          uint32_t ah[4], al[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) split2<2>(X[8 * kb + 2 * r], X[8 * kb + 2 * r + 1], ah[r], al[r]);
          wg_fence();
          if (kb == 0) wg_rs64_00_z(Dd, ah, kdesc(sm, kLxH, 64, kb));
          else wg_rs64_00(Dd, ah, kdesc(sm, kLxH, 64, kb));
          wg_rs64_00(Dd, ah, kdesc(sm, kLxL, 64, kb));
          wg_rs64_00(Dd, al, kdesc(sm, kLxH, 64, kb));
        }
        wg_commit();
        wg_wait<0>();
        acc_fence(Dd);
      }
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // column t's sum over this warp's rows u >= t
          const int t = 8 * n + 2 * q + e, u = 16 * wl + g;
          float x = (u >= t ? L[u * PC + t] * Dd[4 * n + e] : 0.f) +
                    (u + 8 >= t ? L[(u + 8) * PC + t] * Dd[4 * n + 2 + e] : 0.f);
          x += __shfl_xor_sync(0xffffffffu, x, 4);
          x += __shfl_xor_sync(0xffffffffu, x, 8);
          x += __shfl_xor_sync(0xffffffffu, x, 16);
          if (g == 0) part[1672 + wl * 64 + t] = x;
        }
    }
    // R^T = S dY^T: S rows ir, ir + 8 from the checkpoint, a k-step at a time, split; c0's part
    float c0 = 0.f;
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      float sv[8];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float2 v = __ldg(reinterpret_cast<const float2*>(S + (ir + 8 * hh) * 128 + 16 * kb + 2 * q + 8 * e));
          sv[4 * e + 2 * hh] = v.x;
          sv[4 * e + 2 * hh + 1] = v.y;
        }
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) split2<2>(sv[2 * r], sv[2 * r + 1], ah[r], al[r]);
#pragma unroll
      for (int r = 0; r < 8; ++r) c0 = fmaf(sv[r], G[8 * kb + r], c0);
      wg_fence();
      const uint64_t db = kdesc(sm, kY, 64, kb);
      if (kb == 0) wg_rs64_00_z(R, ah, db);
      else wg_rs64_00(R, ah, db);
      wg_rs64_00(R, al, db);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(R);
    col_dots<(V & kLdsm) != 0>(sm, R, kQ, i0, part + (c * 4 + wl) * 64, wl, g, q);  // f_u's part
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[8 * ((i >> 2) & 7) + 2 * q + (i & 1)];  // diag(A) on columns t
    if ((V & kExact) && bad) exact(R, [&](float (&t)[32]) { fma_t<false>(t, sm, ir, q); });
    else weights_product<false>(R, sm, kK + 8192 * c, kMQH, kMQL);  // dq^T += K^T MQ^T
    if (tc == 64) store_t<false>(p.dq + row0, rs, R, nullptr, i0, wl, g, q, tc);
    else store_t<true>(p.dq + row0, rs, R, nullptr, i0, wl, g, q, tc);  // the last chunk
    // Rk^T = G V^T, G's accumulator as A fragments (hi / lo a k-step); e's part
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) split2<2>(G[8 * kb + 2 * r], G[8 * kb + 2 * r + 1], ah[r], al[r]);
      wg_fence();
      const uint64_t db = kdesc(sm, kV, 64, kb);
      if (kb == 0) wg_rs64_00_z(Rk, ah, db);
      else wg_rs64_00(Rk, ah, db);
      wg_rs64_00(Rk, al, db);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(Rk);
    col_dots<(V & kLdsm) != 0>(sm, Rk, kK, i0, part + 512 + (c * 4 + wl) * 64, wl, g, q);  // e_s's part
#pragma unroll
    for (int i = 0; i < 32; ++i) Rk[i] *= tab[128 + 8 * ((i >> 2) & 7) + 2 * q + (i & 1)];  // diag(w) on columns s
    if ((V & kExact) && bad) exact(Rk, [&](float (&t)[32]) { fma_t<true>(t, sm, ir, q); });
    else weights_product<true>(Rk, sm, kQ + 8192 * c, kMDH, kMDL);  // dkt^T += Q^T MD
    col_dots<(V & kLdsm) != 0>(sm, Rk, kK, i0, part + 1024 + (c * 4 + wl) * 64, wl, g, q);  // dbeta_s's part
    if (tc == 64) store_t<false>(p.dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);  // dk = beta dkt
    else store_t<true>(p.dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);
    // KG (columns j = 64 c ..) = K G, B = G hi / lo (MN-major); then dv = diag(beta w) KG + MP^T dY
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, kK, 64, kb);
      if (kb == 0) wg_ss64_01_z(R, da, mdesc(sm, kGH + 16384 * c, 128, kb));
      else wg_ss64_01(R, da, mdesc(sm, kGH + 16384 * c, 128, kb));
      wg_ss64_01(R, da, mdesc(sm, kGL + 16384 * c, 128, kb));
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(R);
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[256 + 16 * wl + g + 8 * ((i >> 1) & 1)];  // diag(beta w) on rows s
    if ((V & kExact) && bad) {
      exact(R, [&](float (&t)[32]) { fma_dv(t, sm, 16 * wl + g, i0, q); });
    } else {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        wg_fence();
        const uint64_t bd = mdesc(sm, kY + 8192 * c, 64, kb);
        wg_ss64_11(R, mdesc(sm, kMPH, 64, kb), bd);
        wg_ss64_11(R, mdesc(sm, kMPL, 64, kb), bd);
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(R);
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int s = 16 * wl + g + 8 * hh, j = i0 + 8 * n + 2 * q;
        if (s < tc) *reinterpret_cast<__nv_bfloat162*>(p.dv + row0 + s * rs + j) =
            __floats2bfloat162_rn(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);
      }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) c0 += __shfl_xor_sync(0xffffffffu, c0, o);
    if (lane == 0) part[1536 + c * 4 + wl] = c0;
    arrive_all<3>();   // (3) the partials for WG0
    consumers_sync();  // (5) both consumers' KG have read G's hi / lo
    if ((V & kEarly) && ch > 0) load_tiles<6, 256>(p, sm, bh, ch - 1, 128);  // k and v: KG was their last reader
    // G <- A_63 G + (diag(A) Q)^T dY: A = Q^T fragments scaled and split
    const float a63 = tab[63];
#pragma unroll
    for (int i = 0; i < 64; ++i) G[i] *= a63;
    acc_fence(G);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t ah[4], al[4], qf[4];
      if (V & kLdsm) {  // block j: rows i of half j & 1, steps of half j >> 1
        const int j = lane >> 3;
        ldsm4_t(qf, sm + kQ + ((i0 + 16 * wl + 8 * (j & 1)) >> 3) * 1024 + (16 * kb + 8 * (j >> 1) + (lane & 7)) * 16);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // a_r: row ir + 8 (r & 1), steps t = 16 kb + 2 q + 8 (r >> 1) (+1)
        const int i = ir + 8 * (r & 1), t = 16 * kb + 2 * q + 8 * (r >> 1);
        const float2 v = (V & kLdsm) ? unpack(qf[r])
                                     : make_float2(ldb(sm + kQ + (i >> 3) * 1024 + t * 16 + (i & 7) * 2),
                                                   ldb(sm + kQ + (i >> 3) * 1024 + (t + 1) * 16 + (i & 7) * 2));
        split2<2>(v.x * tab[t], v.y * tab[t + 1], ah[r], al[r]);
      }
      wg_fence();
      const uint64_t db = mdesc(sm, kY, 64, kb);
      wg_rs128_01(G, ah, db);
      wg_rs128_01(G, al, db);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(G);
    put_g();
    sync_all<6>();  // (6) the chunk is done
  }
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(p.ds0 + bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q) =
          make_float2(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1]);
}

// WG0: the tables before each chunk, dgate and dbeta during and after it.
template <int V>
__device__ void aux(const Params& p, unsigned char* sm, int64_t bh, int nck) {
  const int tid = threadIdx.x;
  float* tab = reinterpret_cast<float*>(sm + kTab);
  float* L = reinterpret_cast<float*>(sm + kL);
  float* part = reinterpret_cast<float*>(sm + kPart);
  const int64_t b = bh / p.H, h = bh - b * p.H;
  // step t's gate and beta (past T: 1 and 0, identities in every table)
  auto gate_at = [&](int t) {
    return t < p.T ? __bfloat162float(p.gate[b * p.sg[0] + t * p.sg[1] + h * p.sg[2]]) : 1.f;
  };
  auto beta_at = [&](int t) {
    return t < p.T ? __bfloat162float(p.beta[b * p.sb[0] + t * p.sb[1] + h * p.sb[2]]) : 0.f;
  };
  float g_next = 0.f, b_next = 0.f;  // kGateAhead: step tid's gate and beta of the chunk after this one
  if ((V & kGateAhead) && tid < 64) g_next = gate_at((nck - 1) * 64 + tid), b_next = beta_at((nck - 1) * 64 + tid);
  for (int ch = nck - 1; ch >= 0; --ch) {
    const int t0 = ch * 64, tc = min(64, p.T - t0);
    const int64_t go = (b * p.T + t0) * p.H + h;  // (b, t0, h) in dgate / dbeta (contiguous)
    if (!(V & kEarly) || ch == nck - 1) load_tiles<15, 384>(p, sm, bh, ch);
    else load_tiles<9, 384>(p, sm, bh, ch);
    if (tid < 64) {
      tab[320 + tid] = (V & kGateAhead) ? g_next : gate_at(t0 + tid);
      tab[192 + tid] = (V & kGateAhead) ? b_next : beta_at(t0 + tid);
      if (V & kExact) {  // a non-finite gate or beta meets the masks' zeros in M: the exact path (warps 0, 1)
        const unsigned m = __ballot_sync(0xffffffffu, !(isfinite(tab[320 + tid]) && isfinite(tab[192 + tid])));
        if ((tid & 31) == 0) reinterpret_cast<int*>(part)[1928 + (tid >> 5)] = m != 0u;
      }
    }
    wg0_sync();
    if (tid < 64) {  // row t of L: L[t][s] = prod_{r=s+1..t} g_r (s <= t), 0 above; A[t] = prod_{r<=t} g_r
      const int t = tid;
      for (int s = t + 1; s < 64; ++s) L[t * PC + s] = 0.f;
      double run = 1.0;
      L[t * PC + t] = 1.f;
      for (int s = t; s >= 1; --s) {
        run *= (double)tab[320 + s];
        L[t * PC + s - 1] = (float)run;
      }
      tab[t] = (float)(run * (double)tab[320]);
    }
    wg0_sync();
    if (tid < 64) {
      const int t = tid;
      tab[64 + t] = t ? tab[t - 1] : 1.f;  // Ah
      tab[128 + t] = L[63 * PC + t];       // w
      tab[256 + t] = tab[192 + t] * L[63 * PC + t];
      for (int s = 0; s < 64; s += 2) {  // Lx row t: L[t-1][s] (s < t), hi / lo at [s / 8][t][8]
        uint32_t hi, lo;
        split2<2>(s < t ? L[(t - 1) * PC + s] : 0.f, s + 1 < t ? L[(t - 1) * PC + s + 1] : 0.f, hi, lo);
        const int off = (s >> 3) * 1024 + t * 16 + (s & 7) * 2;
        *reinterpret_cast<uint32_t*>(sm + kLxH + off) = hi;
        *reinterpret_cast<uint32_t*>(sm + kLxL + off) = lo;
      }
    }
    tiles_landed();
    sync_all<6>();  // (1)
    if ((V & kGateAhead) && tid < 64 && ch > 0) {
      g_next = gate_at(t0 - 64 + tid), b_next = beta_at(t0 - 64 + tid);
    }
    sync_all<3>();    // (3) the partials
    const int t = tid >> 1, x = tid & 1;  // two threads a step
    float td = 0.f;
    {  // fixed-order sums of the 8 parts: f (threads 0..63) and e (64..127)
      const int u = tid & 63, base = tid < 64 ? 0 : 512;
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) acc += part[base + w * 64 + u];
      part[1544 + (tid >> 6) * 64 + u] = acc;
    }
    wg0_sync();
    if (x == 0) {  // (a) + (b) + (d)
#pragma unroll
      for (int w = 0; w < 4; ++w) td += part[1672 + w * 64 + t];
      float c0 = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) c0 += part[1536 + w];
      float sb = 0.f;
      for (int s = 0; s < t; ++s) sb = fmaf(L[(t - 1) * PC + s] * tab[192 + s], part[1608 + s], sb);
      td += tab[128 + t] * (tab[64 + t] * c0 + sb);
      float db = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) db += part[1024 + w * 64 + t];
      if (t < tc) p.dbeta[go + t * p.H] = __float2bfloat16_rn(db);
    } else {  // (c)
      float sc = 0.f;
      for (int u = t; u < 64; ++u) sc = fmaf(L[u * PC + t], part[1544 + u], sc);
      td = tab[64 + t] * sc;
    }
    td += __shfl_xor_sync(0xffffffffu, td, 1);  // x = 0's (a) + (b) + (d), x = 1's (c)
    if (x == 0 && t < tc) p.dgate[go + t * p.H] = __float2bfloat16_rn(td);
    sync_all<6>();  // (6)
  }
}

template <int V>
__global__ void __launch_bounds__(384, 1) bwd_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  const int64_t bh = blockIdx.x;
  const int nck = (p.T + 63) / 64;
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
  if (wg == 0) maxnreg_dec<kAuxRegs>();
  else maxnreg_inc<kConsRegs>();
  if (wg == 0) aux<V>(p, sm, bh, nck);
  else consumer<V>(p, sm, wg - 1, bh, nck);
}

// ===================== the checkpoint pass (dev stand-in for chunk_sm90's state mode) =====================
// S at every chunk start into ckpt ((B H, chunks, 128, 128) fp32, [dk][dv]), from S_0 (or zero). One CTA of 384
// threads a (b, h), one barrier a chunk: the k and v tiles double-buffered (cp.async, zeros past T; chunk ch + 1's
// issued after chunk ch's barrier, landing during its product); WG0 (threads < 64) the gates and betas a chunk
// ahead in registers, then beta_s w_s (w_s = prod_{r>s} g_r, double) and A_63 into a double-buffered table;
// consumer c holds S^T rows dv = 64 c .. as one m64n128 accumulator, stores it, then S^T <- A_63 S^T +
// (V^T diag(beta w)) K: A from the v tile by ldmatrix.trans, scaled and split hi / lo in registers (2 terms), B the
// k tile as loaded (MN-major, exact). (Twenty-third session's form, three barriers and WG0 scaling k into shared
// memory between them: 0.209 ms at S2, 1.62 at S4, bounds 0.12 and 0.76.)
constexpr int cBuf = 32768, cTab = 2 * cBuf, cSmem = cTab + 2 * 256 * 4;  // tiles k 0, v 16384 a buffer
__global__ void __launch_bounds__(384, 1) ckpt_kernel(const Params p, const float* s0, float* ckpt) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  const int tid = threadIdx.x, lane = tid & 31, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh - b * p.H;
  const int nck = (p.T + 63) / 64;
  if (nck == 0) return;
  const int lt = tid & 127, wl = lt >> 5, g = lane >> 2, q = lane & 3, c = wg - 1;
  auto load = [&](int ch) {  // chunk ch's k and v tiles into buffer ch & 1
    const int t0 = ch * 64;
    for (int e = tid; e < 2048; e += 384) {
      const int tile = e >> 10, r = (e >> 4) & 63, c8 = e & 15;
      const bf16* src = tile ? p.v : p.k;
      const int64_t sb = tile ? p.st[2][0] : p.st[1][0], stt = tile ? p.st[2][1] : p.st[1][1];  // (selected: an
      const int64_t sh = tile ? p.st[2][2] : p.st[1][2];  // index into the parameter array would go to local memory)
      const bool valid = t0 + r < p.T;
      const bf16* row = src + b * sb + (int64_t)(t0 + r) * stt + h * sh + 8 * c8;
      cp16(sm + (ch & 1) * cBuf + tile * 16384 + c8 * 1024 + r * 16, valid ? row : src, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  float gn = 1.f, bn = 0.f;  // WG0 threads < 64: step tid's gate and beta of the next chunk (past T: 1 and 0)
  auto gates = [&](int ch) {
    const int t = ch * 64 + tid;
    if (wg == 0 && tid < 64 && t < p.T)
      gn = __bfloat162float(p.gate[b * p.sg[0] + t * p.sg[1] + h * p.sg[2]]),
      bn = __bfloat162float(p.beta[b * p.sb[0] + t * p.sb[1] + h * p.sb[2]]);
    else
      gn = 1.f, bn = 0.f;
  };
  // consumers: S^T[64 c + 16 wl + g (+8)][8 n + 2 q (+1)] = S[4 n + 2 hh + e] (n = 0..15)
  float S[64];
  if (wg > 0)
#pragma unroll
    for (int x = 0; x < 64; ++x) {
      const int dv = 64 * c + 16 * wl + g + 8 * ((x >> 1) & 1), dk = 8 * (x >> 2) + 2 * q + (x & 1);
      S[x] = s0 ? s0[bh * 16384 + dk * 128 + dv] : 0.f;
    }
  load(0);
  gates(0);
  for (int ch = 0; ch < nck; ++ch) {
    float* tab = reinterpret_cast<float*>(sm + cTab) + (ch & 1) * 256;  // gate 0, beta 64, beta w 128, A_63 192
    if (wg == 0) {
      if (tid < 64) tab[tid] = gn, tab[64 + tid] = bn;
      gates(ch + 1);  // (in flight during this chunk)
      wg0_sync();
      if (tid < 64) {  // beta_s w_s and A_63 (double products, rounded once)
        double w = 1.0;
        for (int r = 63; r > tid; --r) w *= (double)tab[r];
        tab[128 + tid] = (float)(w * (double)tab[64 + tid]);
        if (tid == 0) tab[192] = (float)(w * (double)tab[0]);
      }
    } else {  // the checkpoint: S at the chunk's start
      float* d = ckpt + (bh * nck + ch) * 16384;
#pragma unroll
      for (int x = 0; x < 64; ++x) {
        const int dv = 64 * c + 16 * wl + g + 8 * ((x >> 1) & 1), dk = 8 * (x >> 2) + 2 * q + (x & 1);
        d[dk * 128 + dv] = S[x];
      }
    }
    tiles_landed();
    sync_all<6>();  // chunk ch's tiles and table; every reader of buffer (ch + 1) & 1 (chunk ch - 1's) is done
    if (ch == nck - 1) break;  // (the last chunk's end state is not a checkpoint)
    load(ch + 1);  // (ch + 1 < nck here)
    if (wg > 0) {
      const float a63 = tab[192];
      const unsigned char* buf = sm + (ch & 1) * cBuf;
#pragma unroll
      for (int x = 0; x < 64; ++x) S[x] *= a63;
      acc_fence(S);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t vf[4], ah[4], al[4];  // block j: rows dv of half j & 1, steps of half j >> 1
        const int j = lane >> 3;
        ldsm4_t(vf, buf + 16384 + ((64 * c + 16 * wl + 8 * (j & 1)) >> 3) * 1024 +
                        (16 * kb + 8 * (j >> 1) + (lane & 7)) * 16);
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // a_r: row 64 c + 16 wl + g + 8 (r & 1), steps t = 16 kb + 2 q + 8 (r >> 1) (+1)
          const int t = 16 * kb + 2 * q + 8 * (r >> 1);
          const float2 v = unpack(vf[r]);
          split2<2>(v.x * tab[128 + t], v.y * tab[128 + t + 1], ah[r], al[r]);
        }
        wg_fence();
        const uint64_t db = mdesc(sm, (ch & 1) * cBuf, 64, kb);  // B[t][dk]: the k tile
        wg_rs128_01(S, ah, db);
        wg_rs128_01(S, al, db);
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(S);
    }
  }
}

FUNC_ATTRS

}  // namespace

template <int V>
int launch_v(const Params& p, int blocks, cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(bwd_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return (int)e;
  bwd_kernel<V><<<blocks, 384, kSmem, s>>>(p);
  return (int)cudaGetLastError();
}
#define VARIANTS(X) X(16) X(144) X(208) X(400) X(464)
int launch(const Params& p, int v, int blocks, cudaStream_t s) {
#define CASE(n) if (v == n) return launch_v<n>(p, blocks, s);
  VARIANTS(CASE)
#undef CASE
  return (int)cudaErrorInvalidValue;
}
int launch_ckpt(const Params& p, const float* s0, float* ckpt, int blocks, cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(ckpt_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cSmem);
  if (e != cudaSuccess) return (int)e;
  ckpt_kernel<<<blocks, 384, cSmem, s>>>(p, s0, ckpt);
  return (int)cudaGetLastError();
}
int attrs(int v, int* res) {
#define CASE(n) if (v == n) return func_attrs((const void*)bwd_kernel<n>, res);
  VARIANTS(CASE)
#undef CASE
  return (int)cudaErrorInvalidValue;
}
}  // namespace cbs
"""

HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <vector>
namespace cbs {
struct Params {
  const __nv_bfloat16 *q, *k, *v, *dy, *gate, *beta;
  int64_t st[4][3];
  int64_t sg[3], sb[3];
  const float* ckpt;
  const float* dfinal;
  __nv_bfloat16 *dq, *dk, *dv, *dgate, *dbeta;
  float* ds0;
  int T, H;
};
int launch(const Params& p, int v, int blocks, cudaStream_t s);
int launch_ckpt(const Params& p, const float* s0, float* ckpt, int blocks, cudaStream_t s);
int attrs(int v, int* res);
}
static const __nv_bfloat16* cb(const at::Tensor& t) {
  return reinterpret_cast<const __nv_bfloat16*>(t.data_ptr<at::BFloat16>());
}
static __nv_bfloat16* mb(const at::Tensor& t) { return reinterpret_cast<__nv_bfloat16*>(t.data_ptr<at::BFloat16>()); }
// The inputs' pointers and strides, T and H.
static cbs::Params inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dy,
                          const at::Tensor& gate, const at::Tensor& beta) {
  cbs::Params p{};
  p.q = cb(q), p.k = cb(k), p.v = cb(v), p.dy = cb(dy), p.gate = cb(gate), p.beta = cb(beta);
  const at::Tensor* rows[4] = {&q, &k, &v, &dy};
  for (int x = 0; x < 4; ++x)
    for (int d = 0; d < 3; ++d) p.st[x][d] = rows[x]->stride(d);
  for (int d = 0; d < 3; ++d) p.sg[d] = gate.stride(d), p.sb[d] = beta.stride(d);
  p.T = (int)k.size(1), p.H = (int)k.size(2);
  return p;
}
// (k, v, gate, beta, S_0 (B, H, 128, 128) or empty) -> fills ckpt (B H, ceil(T / 64), 128, 128)
void ckpt(const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate, const at::Tensor& beta,
          const at::Tensor& s0, const at::Tensor& out) {
  const cbs::Params p = inputs(k, k, v, v, gate, beta);
  const int e = cbs::launch_ckpt(p, s0.numel() ? s0.data_ptr<float>() : nullptr, out.data_ptr<float>(),
                                 (int)(k.size(0) * k.size(2)), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == 0, "ckpt launch: ", cudaGetErrorString((cudaError_t)e));
}
// (q, k, v, dy, gate, beta, ckpt, dfinal or empty) -> fills (dq, dk, dv, dgate, dbeta, ds0)
void bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dy, const at::Tensor& gate,
         const at::Tensor& beta, const at::Tensor& ckpt, const at::Tensor& dfinal, const at::Tensor& dq,
         const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& dgate, const at::Tensor& dbeta,
         const at::Tensor& ds0, int64_t variant) {
  cbs::Params p = inputs(q, k, v, dy, gate, beta);
  p.ckpt = ckpt.data_ptr<float>();
  p.dfinal = dfinal.numel() ? dfinal.data_ptr<float>() : nullptr;
  p.dq = mb(dq), p.dk = mb(dk), p.dv = mb(dv), p.dgate = mb(dgate), p.dbeta = mb(dbeta);
  p.ds0 = ds0.data_ptr<float>();
  const int e = cbs::launch(p, (int)variant, (int)(q.size(0) * q.size(2)), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == 0, "bwd launch: ", cudaGetErrorString((cudaError_t)e));
}
std::vector<int64_t> attrs(int64_t v) {
  int r[4] = {0, 0, 0, 0};
  TORCH_CHECK(cbs::attrs((int)v, r) == 0, "attributes");
  return {r[0], r[1], r[2], r[3]};
}
"""

FORMS_USED = [(64, False, 0, 0, True), (64, False, 0, 0, False), (64, False, 1, 0, False), (64, False, 1, 1, False),
              (64, False, 0, 1, True), (64, False, 0, 1, False), (64, True, 0, 0, True), (64, True, 0, 0, False),
              (128, True, 0, 1, False)]
assert FORMS_USED == FORMS  # the probe's forms: this kernel issues the same instructions


def checkpoints(k, v, gate, beta, s0, chunk=64):
    """S at every chunk start, (B H, ceil(T / chunk), D_k, D_v) fp32, by a float64 pass over chunks (dev only: the
    shipped form is chunk_sm90's state mode)."""
    B, T, H, Dk = k.shape
    kd, vd, gd, bd = (x.double().transpose(1, 2) for x in (k, v, gate, beta))  # (B, H, T, ...)
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64, device=k.device) if s0 is None else s0.double().clone()
    n = -(-T // chunk)
    out = torch.empty(B, H, n, Dk, v.shape[-1], dtype=torch.float32, device=k.device)
    for c in range(n):
        sl = slice(c * chunk, min(T, (c + 1) * chunk))
        out[:, :, c] = S.float()
        g = gd[:, :, sl]
        rev = torch.flip(torch.cumprod(torch.flip(g, [-1]), -1), [-1])  # prod_{r >= s} g_r (to the chunk's end)
        w = torch.cat([rev[..., 1:], torch.ones_like(rev[..., :1])], -1)  # prod_{r > s} g_r
        S = rev[..., :1, None] * S + (kd[:, :, sl] * (w * bd[:, :, sl])[..., None]).transpose(-1, -2) @ vd[:, :, sl]
    return out.reshape(B * H, n, Dk, v.shape[-1])


_EMPTY = {}


def empty(device):
    """A 0-element float32 tensor (an absent state for the extension), made once: none is allocated in a timed call."""
    if device not in _EMPTY:
        _EMPTY[device] = torch.empty(0, device=device)
    return _EMPTY[device]


def dev_checkpoints(mod, k, v, gate, beta, s0, out=None):
    """checkpoints() by the dev checkpoint kernel (fp32 accumulators, 2-term bf16 products), into out (or a new
    NaN-poisoned tensor)."""
    B, T, H, _ = k.shape
    if out is None:
        out = torch.full((B * H, -(-T // 64), 128, 128), float("nan"), device=k.device)
    mod.ckpt(k, v, gate, beta, s0.contiguous() if s0 is not None else empty(k.device), out)
    return out


def run(mod, q, k, v, gate, beta, dy, ckpt, dfinal, variant=16, outs=None):
    """Ours into outs (or new NaN-poisoned contiguous outputs): (dq, dk, dv, dgate, dbeta, dS_0). (Timings before
    the twenty-third session's last runs included these allocations and fills: about 1%.)"""
    if outs is None:
        outs = [torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device) for x in (q, k, v, gate, beta)]
        outs.append(torch.full((q.shape[0], q.shape[2], 128, 128), float("nan"), device=q.device))
    mod.bwd(q, k, v, dy, gate, beta, ckpt, dfinal if dfinal is not None else empty(q.device), *outs, variant)
    return outs


NAMES = ["dq", "dk", "dv", "dgate", "dbeta", "dS0"]
VARIANT_NAMES = {16: "gates a chunk ahead", 144: "gates ahead + ldmatrix", 208: "gates ahead + ldmatrix + early k, v",
                 400: "gates ahead + ldmatrix, exact", 464: "gates ahead + ldmatrix + early k, v, exact"}


# One non-finite input value (index into (q, k, v, gate, beta, dy), position, value), as tests/test_backward.py.
NONFINITE = {"v-nan": (2, (0, 41, 1, 3), float("nan")), "q-inf": (0, (1, 20, 0, 5), float("inf")),
             "q-nan": (0, (0, 33, 1, 2), float("nan")), "k-inf": (1, (1, 40, 0, 3), float("inf")),
             "gate-nan": (3, (0, 50, 1), float("nan")), "beta-nan": (4, (1, 70, 0), float("nan")),
             "dy-nan": (5, (0, 90, 1, 7), float("nan"))}


def check_nonfinite(mod, gen, variant):
    """Each NONFINITE case at (2, 100, 2) with both states: per gradient, the elements whose NaN (NaN inputs) or
    non-finite (inf inputs) status differs from float64 autograd's. kExact variants must show none."""
    import naive
    import reference
    rows = []
    for name, (which, pos, val) in NONFINITE.items():
        ins = list(reference.make_inputs(2, 100, 2, 128, 128, dtype=torch.bfloat16, generator=gen))
        ins.append(torch.randn(2, 100, 2, 128, generator=gen).bfloat16())
        ins[which][pos] = val
        q, k, v, g, b, dy = ins
        s0, dfinal = torch.randn(2, 2, 128, 128, generator=gen), torch.randn(2, 2, 128, 128, generator=gen)
        want = naive.recurrent_backward_naive(q, k, v, g, b, dy, initial_state=s0, d_final_state=dfinal)
        cu = [x.cuda() for x in ins]
        ck = checkpoints(cu[1], cu[2], cu[3], cu[4], s0.cuda())
        got = run(mod, *cu, ck, dfinal.cuda(), variant)
        torch.cuda.synchronize()
        status = torch.isnan if name.endswith("nan") else (lambda x: ~torch.isfinite(x))
        diff = {n: int((status(x.cpu().double()) != status(w)).sum()) for n, x, w in zip(NAMES, got, want)}
        print(f"nonfinite v{variant} {name:9s} elements off: " + " ".join(f"{n} {d}" for n, d in diff.items()),
              flush=True)
        rows.append({"variant": variant, "case": name, "mismatched": diff})
    return rows


def check(mod, gen, variant):
    """Against float64 autograd through the loop (naive.recurrent_backward_naive): per gradient, ours and the
    float64 gradient rounded to bf16 (the floor), over gate classes, with and without states."""
    import naive
    import reference
    rows = []
    for B, T, H, gates, states, bhtd in [(1, 64, 1, "sigmoid", False, False), (1, 256, 2, "sigmoid", True, False),
                                         (2, 192, 1, "zeros", True, False), (1, 128, 2, "negative", False, False),
                                         (1, 128, 1, "above-one", True, False), (1, 100, 3, "sigmoid", True, False),
                                         (2, 63, 1, "zeros", False, False), (1, 130, 2, "sigmoid", True, True)]:
        q, k, v, g, b = reference.make_inputs(B, T, H, 128, 128, dtype=torch.bfloat16, generator=gen)
        g = {"sigmoid": g, "negative": torch.empty_like(g).uniform_(-1, 1, generator=gen),
             "zeros": g.masked_fill(torch.rand(g.shape, generator=gen) < 0.1, 0.0),
             "above-one": torch.empty_like(g).uniform_(0.9, 1.1, generator=gen)}[gates]
        dy = torch.randn(B, T, H, 128, generator=gen).bfloat16()
        s0 = torch.randn(B, H, 128, 128, generator=gen) if states else None
        dfinal = torch.randn(B, H, 128, 128, generator=gen) if states else None
        want = naive.recurrent_backward_naive(q, k, v, g, b, dy, initial_state=s0, d_final_state=dfinal)
        cu = [x.cuda() for x in (q, k, v, g, b, dy)]
        if bhtd:  # inputs as (B, H, T, ...) tensors seen through a transpose: (b, t, h) strides not contiguous
            cu = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in cu]
        ck = checkpoints(cu[1], cu[2], cu[3], cu[4], None if s0 is None else s0.cuda())
        ck_dev = dev_checkpoints(mod, cu[1], cu[2], cu[3], cu[4], None if s0 is None else s0.cuda())
        got = run(mod, *cu, ck, None if dfinal is None else dfinal.cuda(), variant)
        got_dev = run(mod, *cu, ck_dev, None if dfinal is None else dfinal.cuda(), variant)
        torch.cuda.synchronize()
        errs = {n: rel_l2(x.cpu(), w) for n, x, w in zip(NAMES, got, want)}
        errs_dev = {n: rel_l2(x.cpu(), w) for n, x, w in zip(NAMES, got_dev, want)}
        ck_err = rel_l2(ck_dev.cpu(), ck.cpu())
        floor = {n: rel_l2(w.to(x.dtype), w) for n, x, w in zip(NAMES, got, want)}
        case = f"v{variant} {(B, T, H)} {gates}{' states' if states else ''}{' bhtd' if bhtd else ''}"
        print(f"check {case:34s} " + " ".join(f"{n} {errs[n]:.1e} ({floor[n]:.1e})" for n in NAMES), flush=True)
        print(f"  with the dev checkpoint kernel (its checkpoints' rel-L2 {ck_err:.1e}): "
              + " ".join(f"{n} {errs_dev[n]:.1e}" for n in NAMES), flush=True)
        rows.append({"case": case, "rel_l2": errs, "bf16_floor": floor, "rel_l2_dev_ckpt": errs_dev,
                     "ckpt_rel_l2": ck_err})
    return rows


SHAPES = {"S2-bf16": (8, 2048, 16), "S4-bf16": (16, 4096, 32), "S0-bf16": (2, 128, 4)}


def bench(mod, names, trials, gen, variants):
    """Ours (the checkpoints precomputed) and solution.py's backward, KernelBench medians, and the gradients' rel-L2
    between the two (solution's backward is fp32-level: the difference is ours)."""
    import solution
    rows = []
    for name in names:
        B, T, H = SHAPES[name]
        q, k, v, g, b = (x.cuda() for x in __import__("reference").make_inputs(B, T, H, 128, 128,
                                                                            dtype=torch.bfloat16, generator=gen))
        dy = torch.randn(B, T, H, 128, generator=gen).bfloat16().cuda()
        ck = checkpoints(k, v, g, b, None)
        run(mod, q, k, v, g, b, dy, ck, None, variants[0])  # first: the launch an ncu run with -c 1 profiles
        theirs = solution._backward_with(dy, None, q, k, v, g, b, None)
        t_sol = kernelbench_time(solution._backward_with, (dy, None, q, k, v, g, b, None), trials=trials)["median"]
        chunks = B * H * T // 64
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ck_dev = dev_checkpoints(mod, k, v, g, b, None)
        t_ck = kernelbench_time(dev_checkpoints, (mod, k, v, g, b, None, ck_dev), trials=trials)["median"]
        ck_err = rel_l2(ck_dev, ck)
        row = {"shape": name, "solution_ms": t_sol, "ckpt_ms": t_ck, "ckpt_rel_l2": ck_err, "variants": {}}
        print(f"bench {name}: solution's backward {t_sol:.3f} ms; the dev checkpoint pass {t_ck:.3f} ms (rel-L2 "
              f"{ck_err:.1e} against float64's)", flush=True)
        for var in variants:
            ours = run(mod, q, k, v, g, b, dy, ck, None, var)
            diff = {n: rel_l2(x.float(), y.float()) for n, x, y in zip(NAMES, ours, theirs) if y is not None}
            t = kernelbench_time(run, (mod, q, k, v, g, b, dy, ck, None, var, ours), trials=trials)["median"]
            per = t * 1e3 / -(-chunks // sms)
            print(f"  v{var:<2d} {VARIANT_NAMES[var]:34s} {t:.3f} ms ({per:.2f} us a chunk an SM); rel-L2 vs solution "
                  + " ".join(f"{n} {e:.1e}" for n, e in diff.items()), flush=True)
            row["variants"][var] = {"ms": t, "us_per_chunk": per, "diff": diff}
        rows.append(row)
        del ck, ck_dev
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--shapes", default="S0-bf16,S2-bf16,S4-bf16")
    ap.add_argument("--variants", default="16,144,208,400,464")
    ap.add_argument("--check-variants", default="16,144,208,400,464")
    ap.add_argument("--regs", type=lambda x: [int(r) for r in x.split(",")], default=[56, 224],
                    help="setmaxnreg split: WG0, consumers")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    cuda = CUDA_SRC.replace("WGMMA_FORMS", "".join(wgmma_bf16(*f) for f in FORMS_USED))
    cuda = cuda.replace("WGMMA_SYNC", solution_constant("WGMMA_SYNC_SRC")).replace("FUNC_ATTRS", FUNC_ATTRS_SRC)
    cuda = cuda.replace("PROBE_HELPERS", PROBE_HELPERS_SRC + BF16_TILE_SRC)
    cuda = cuda.replace("AUX_REGS", str(args.regs[0])).replace("CONS_REGS", str(args.regs[1]))
    mod, summary = build(f"chunk_bwd_sm90_dev_{args.regs[0]}_{args.regs[1]}", HOST_SRC, cuda, ["bwd", "ckpt", "attrs"],
                         "cbs")
    print_build(summary, launch_regs=168, split_kernels="bwd_kernel")  # (ckpt_kernel has no setmaxnreg split)
    res = {"build": summary}
    if args.build_only:
        return
    gen = torch.Generator().manual_seed(11)
    variants = [int(v) for v in args.variants.split(",")]
    res["attrs"] = {v: mod.attrs(v) for v in variants}
    res["check"] = [r for v in args.check_variants.split(",") if v for r in check(mod, gen, int(v))]
    res["nonfinite"] = [r for v in args.check_variants.split(",") if v for r in check_nonfinite(mod, gen, int(v))]
    save("chunk_bwd_sm90.json", res)
    shapes = [s for s in args.shapes.split(",") if s]
    if shapes:  # (--shapes "": the check alone, e.g. under compute-sanitizer)
        res["bench"] = bench(mod, shapes, args.trials, gen, variants)
    save("chunk_bwd_sm90.json", res)


if __name__ == "__main__":
    main()
