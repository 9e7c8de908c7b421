"""B6: go / no-go timing of a Hopper chunked backward's tensor work (docs/training-design.md section 7), bf16
inputs, chunk C = 64, D_k = D_v = 128. sm_90a only; one standalone script, run from the repository root.

One CTA of 384 threads (3 warpgroups; setmaxnreg 40 for WG0, 232 for the consumers) an SM on every SM, a
loop over --chunks "chunks" of dummy data in shared memory (nothing from global memory except S, below).
Per chunk, consumer warpgroup c (c = 0, 1; state rows i = 64 c ..) holds G (its 64 x 128 rows of the state
gradient, a wgmma accumulator kept across chunks) and issues, in m64n64k16 units (an m64n128k16 is two):

    X = QK (c = 0) or Dd (c = 1), SS, 8 k-steps, 1 term; the masked weights' hi / lo bf16 written from it
    R^T = S dY^T, RS, A = S rows (fp32 from global, L2-resident, split hi / lo a k-step), 8 x 2 terms;
        c0's part (S against G's registers) and f's part (R^T columns against q) on the way
    dq^T = R^T diag(A) + K^T MQ^T, SS (A MN-major), 4 x 2
    Rk^T = G V^T, RS, A = G's accumulator recast to bf16 hi / lo fragments a k-step, 8 x 2; e's part
    dkt^T = Rk^T diag(w) + Q^T MD, SS (A and B MN-major), 4 x 2; dbeta's part
    KG (the consumer's 64 columns j) = K G, SS, B = G hi / lo from shared memory (MN-major), 8 x 2
    dv = diag(beta w) KG + MP^T dY, SS, 4 x 2
    G <- A_63 G + (diag(A) Q)^T dY, RS m64n128, A = Q^T fragments scaled and split, 4 x 2 (x 2 units)
    G's hi / lo to shared memory (the next chunk's KG reads both consumers' rows)

96 units a consumer, 192 a CTA: 25.2 MFLOP a chunk. dq^T, dk^T and dv go to a staging buffer (as before a TMA
store). Two named barriers a chunk between the consumers (weights ready; both done reading G's hi / lo).
WG0 does the dgate-like C^3 / 6 loop over shared memory (AUX 1) or nothing (AUX 0).

Variants (us a chunk, TFLOPS at 2 M N K a wgmma): [0] full; [1] consumers only; [2] 1 term (no lo products:
the split's cost); [3] full with a block barrier a chunk (lockstep) (run 6 measured these four). Added after it:
[4] WG0's scalar dgate loop alone; [5] the consumers pipelined (ORDER 1: the next product issued before the
previous one's epilogue; Rk^T then reads G's hi / lo from shared memory, because R^T's 64 A-fragment registers
stay tied up until its wait and RS for both needs more than 232 registers); [6] WG0's dgate term as a product
(E split into shared memory, M^T = L' E^T, 3 terms) alone; [7] unpipelined consumers beside it; [8] pipelined
consumers beside it. ptxas (local): [5] clean at 232; WG0's product needs about 80 registers, which leaves the
consumers 216, and there ptxas serializes their wgmma (C7512) in [7] and [8]: those two measure that cost. This
build spills 20 B in [0] and [3] (run 6's build of them did not: the products now commit once each).
Plus the ceiling of 3 warpgroups a CTA (SS m64n64k16 back to back).
Decision rule: the S4 bar leaves about 14.9 us a chunk for everything (perf-notes, twenty-second session), and
the loads (64 KB of inputs and 64 KB of S a chunk at an SM's share of HBM) about 4 us of it: GO at <= 8 us a
chunk for [0], RE-PLAN above 10 us. The tensor floor at 790 TFLOP/s is 4.2 us.

B6 checks no layout (dummy data; descriptors stay inside their regions). B1 (after B6) checks each operand form
the design uses against float64 on one warpgroup: SS with A MN-major (new here: chunk_sm90 uses MN-major B only),
A and B MN-major, B MN-major at K = 128, the accumulator recast to RS A fragments in two bf16 terms, and RS
m64n128 with B MN-major; the MN-major ones also with LBO and SBO exchanged, which must come out wrong.

    python3 dev/bwd_sm90_probe.py [--trials N] [--chunks 1000]   (writes $OUT/bwd_sm90_probe.json)
    python3 dev/bwd_sm90_probe.py --build-only   (compiles only, no GPU; CUDA_HOME=/usr/local/cuda)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from timing import kernelbench_time  # noqa: E402
from tools.common import save  # noqa: E402
from tools.sm90_build import (BF16_TILE_SRC, FUNC_ATTRS_SRC, PROBE_HELPERS_SRC, build, print_build,  # noqa: E402
                               solution_constant, solution_function)


def wgmma_bf16(n, rs, ta, tb, zero):
    """solution's bf16 wgmma form (n, RS or SS, B MN-major tb, zero), renamed wg_{rs,ss}{n}_{ta}{tb}[_z]; ta: A
    MN-major as well (SS only: solution's forms fix it at 0)."""
    src = solution_function("_wgmma")(n, rs, tb, zero)
    name = f"wgmma_{'rs' if rs else 'ss'}{n}{'_t' if tb else ''}{'_z' if zero else ''}("
    src = src.replace(name, f"wg_{'rs' if rs else 'ss'}{n}_{ta}{tb}{'_z' if zero else ''}(")
    if ta:
        assert not rs
        src = src.replace(f"p, 1, 1, 0, {tb};", f"p, 1, 1, 1, {tb};")
    return src.replace(", int scale_d) {", ") {").replace('"r"(scale_d)', '"r"(1)')


# (n, RS, A MN-major, B MN-major, zero): the forms the consumers use.
FORMS = [(64, False, 0, 0, True), (64, False, 0, 0, False), (64, False, 1, 0, False), (64, False, 1, 1, False),
         (64, False, 0, 1, True), (64, False, 0, 1, False), (64, True, 0, 0, True), (64, True, 0, 0, False),
         (128, True, 0, 1, False)]
WGMMA_SRC = "".join(wgmma_bf16(*f) for f in FORMS)

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GR_WGMMA 1
#endif

namespace bp {
namespace {

WGMMA_SYNC

WGMMA_FORMS

PROBE_HELPERS  // (tools/sm90_build.py: sm_desc, desc_at, dummy; BF16_TILE_SRC: split2, kdesc, mdesc)
__device__ __forceinline__ float ldb(const unsigned char* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
// Dummy shared memory (scale x a hash), then the async-proxy fence and a block barrier.
__device__ __forceinline__ void fill_dummy(unsigned char* sm, int bytes, uint32_t salt, float scale) {
  float* f = reinterpret_cast<float*>(sm);
  for (int e = threadIdx.x; e < bytes / 4; e += blockDim.x) f[e] = scale * dummy(e + salt);
  fence_async_smem();
  __syncthreads();
}
// base + the sum of d into this thread's slot of out (keeps the compiler from dropping the work).
template <int N>
__device__ __forceinline__ void sink_out(float* out, const float (&d)[N], float base) {
#pragma unroll
  for (int i = 0; i < N; ++i) base += d[i];
  out[blockIdx.x * 384 + threadIdx.x] = base;
}
__device__ __forceinline__ void consumers_sync() {  // the two consumer warpgroups (named barrier 1)
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

// Shared memory (bytes). bf16 tiles [k / 8][row][8] (K-major: LBO = rows x 16, SBO 128): q, k, v, dy (64 x 128
// each); G hi / lo (128 x 128 each); the masked weights' hi / lo (64 x 64 each); QK in fp32 (E's input); the
// consumers' output staging (64 x 64 bf16 each); tables; f, e, dbeta, c0 parts; slack past the end for the
// descriptors' reach (dummy layouts). S comes from global memory: its 64 KB do not fit beside the rest.
constexpr int kQ = 0, kK = 16384, kV = 32768, kY = 49152, kGH = 65536, kGL = 98304, kMQH = 131072, kMQL = 139264;
constexpr int kMDH = 147456, kMDL = 155648, kMPH = 163840, kMPL = 172032, kQKF = 180224, kOut = 196608;
constexpr int kTab = 212992, kPart = 214016, kEnd = 217088;
constexpr int kSmem = kEnd + 8192;
static_assert(kSmem <= 232448, "fits the opt-in shared memory of an H200");

// The weights of a chunk from the consumer's 64 x 64 accumulator X (rows 16 wl + g (+8), columns 8 n + 2 q):
// masked (s <= t), scaled by two table entries, split, stored hi / lo at off_h / off_l (K-major [s/8][t][8]).
template <int TERMS>
__device__ __forceinline__ void put_weights(unsigned char* sm, const float (&X)[32], int off_h, int off_l, int wl, int g,
                                            int q) {
  const float* tab = reinterpret_cast<const float*>(sm + kTab);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 16 * wl + g + 8 * h, s = 8 * n + 2 * q;
      const float x0 = s <= t ? X[4 * n + 2 * h] * tab[t] * tab[64 + s] : 0.f;
      const float x1 = s + 1 <= t ? X[4 * n + 2 * h + 1] * tab[t] * tab[65 + s] : 0.f;
      uint32_t hi, lo;
      split2<TERMS>(x0, x1, hi, lo);
      const int off = (s >> 3) * 1024 + t * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + off_h + off) = hi;
      if constexpr (TERMS == 2) *reinterpret_cast<uint32_t*>(sm + off_l + off) = lo;
    }
}

// A 64 x 64 accumulator (rows 16 wl + g (+8), columns 8 n + 2 q) to the staging buffer as bf16.
__device__ __forceinline__ void put_out(unsigned char* sm, const float (&X)[32], int c, int wl, int g, int q) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wl + g + 8 * h, col = 8 * n + 2 * q;
      const __nv_bfloat162 v = __floats2bfloat162_rn(X[4 * n + 2 * h], X[4 * n + 2 * h + 1]);
      *reinterpret_cast<__nv_bfloat162*>(sm + kOut + 8192 * c + (col >> 3) * 1024 + r * 16 + (col & 7) * 2) = v;
    }
}

// A 64 x 64 accumulator's row dots with a bf16 tile's rows (column u of X against tile row u, over this warp's
// 16 rows i): the f / e / dbeta parts, summed over g by shuffles, one store a column and warp.
__device__ __forceinline__ void col_dots(unsigned char* sm, const float (&X)[32], int tile, int i0, int slot, int wl,
                                         int g, int q) {
  float* part = reinterpret_cast<float*>(sm + kPart);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int u = 8 * n + 2 * q + e, i = i0 + 16 * wl + g;
      float x = X[4 * n + e] * ldb(sm + tile + (i >> 3) * 1024 + u * 16 + (i & 7) * 2) +
                X[4 * n + 2 + e] * ldb(sm + tile + ((i + 8) >> 3) * 1024 + u * 16 + ((i + 8) & 7) * 2);
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (g == 0) part[(slot * 4 + wl) * 64 % 768 + u] = x;
    }
}

// acc += A W over the chunk's 64 steps, A MN-major from a staged tile (a_off), W the masked weights hi / lo
// (K-major, or MN-major with BMN): dq^T's K^T MQ^T and dkt^T's Q^T MD.
template <int TERMS, bool BMN>
__device__ __forceinline__ void weights_product(float (&acc)[32], const unsigned char* sm, int a_off, int wh, int wl_) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    wg_fence();
    const uint64_t da = mdesc(sm, a_off, 64, kb);
    if constexpr (BMN) {
      wg_ss64_11(acc, da, mdesc(sm, wh, 64, kb));
      if constexpr (TERMS == 2) wg_ss64_11(acc, da, mdesc(sm, wl_, 64, kb));
    } else {
      wg_ss64_10(acc, da, kdesc(sm, wh, 64, kb));
      if constexpr (TERMS == 2) wg_ss64_10(acc, da, kdesc(sm, wl_, 64, kb));
    }
  }
  wg_commit();
}

// Waits for the product issued before the newest one (ORDER 1: one product in flight behind the epilogue) or, with
// ORDER 0, for every product right after its issue (drain), so that no epilogue overlaps a product.
template <int ORDER>
__device__ __forceinline__ void drain() {
  if constexpr (ORDER == 0) wg_wait<0>();
}
template <int ORDER>
__device__ __forceinline__ void behind() {
  if constexpr (ORDER == 0) wg_wait<0>();
  else wg_wait<1>();
}

// Consumer warpgroup c; src_s: this CTA's S (64 KB, L2-resident). ORDER 0: each product waited for at once;
// ORDER 1: the next product issued before the previous one's epilogue (R^T's dots with Rk^T in flight, ...).
template <int TERMS, int ORDER, bool SYNC>
__device__ __forceinline__ void consumer_loop(unsigned char* sm, int c, int nchunks, const float* src_s, float* out) {
  const int tid = threadIdx.x & 127, wl = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const float* tab = reinterpret_cast<const float*>(sm + kTab);
  const int i0 = 64 * c, ir = i0 + 16 * wl + g;  // this thread's state rows ir, ir + 8
  float G[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) G[i] = dummy(threadIdx.x * 64 + i + 12345u);
  float c0 = 0.f;
  for (int ch = 0; ch < nchunks; ++ch) {
    float X[32], R[32], Rk[32];
    // X = QK (c = 0) or Dd (c = 1)
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, c ? kY : kQ, 64, kb), db = kdesc(sm, c ? kV : kK, 64, kb);
      if (kb == 0) wg_ss64_00_z(X, da, db);
      else wg_ss64_00(X, da, db);
    }
    wg_commit();
    wg_wait<0>();  // (X, R^T and Rk^T in flight together would need more than ptxas's 168 registers)
    acc_fence(X);
    if (c == 0) {
      put_weights<TERMS>(sm, X, kMPH, kMPL, wl, g, q);
#pragma unroll
      for (int n = 0; n < 8; ++n)  // QK in fp32 for WG0's E
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(sm + kQKF + ((16 * wl + g + 8 * h) * 64 + 8 * n + 2 * q) * 4) =
              make_float2(X[4 * n + 2 * h], X[4 * n + 2 * h + 1]);
    } else {
      put_weights<TERMS>(sm, X, kMQH, kMQL, wl, g, q);
      put_weights<TERMS>(sm, X, kMDH, kMDL, wl, g, q);
    }
    fence_async_smem();
    // R^T = S dY^T (this consumer's rows of S, read a k-step at a time), c0's part
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      float sv[8];  // S[ir (+8)][16 kb + 2 q (+1, +8, +9)]: the A fragment's elements, as G's at the same place
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float2 v = __ldg(reinterpret_cast<const float2*>(src_s + (ir + 8 * h) * 128 + 16 * kb + 2 * q + 8 * e));
          sv[4 * e + 2 * h] = v.x;
          sv[4 * e + 2 * h + 1] = v.y;
        }
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) split2<TERMS>(sv[2 * r], sv[2 * r + 1], ah[r], al[r]);
#pragma unroll
      for (int r = 0; r < 8; ++r) c0 = fmaf(sv[r], G[8 * kb + r], c0);
      wg_fence();
      const uint64_t db = kdesc(sm, kY, 64, kb);
      if (kb == 0) wg_rs64_00_z(R, ah, db);
      else wg_rs64_00(R, ah, db);
      if constexpr (TERMS == 2) wg_rs64_00(R, al, db);
    }
    wg_commit();
    drain<ORDER>();
    // Rk^T = G V^T. ORDER 0: G's accumulator as A fragments (hi / lo a k-step). ORDER 1: A = G's hi / lo in shared
    // memory (this consumer's rows, K-major: [j / 8][i][8]), so that no A registers stay tied up beside R^T's.
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      const uint64_t db = kdesc(sm, kV, 64, kb);
      wg_fence();
      if constexpr (ORDER == 0) {
        uint32_t ah[4], al[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) split2<TERMS>(G[8 * kb + 2 * r], G[8 * kb + 2 * r + 1], ah[r], al[r]);
        if (kb == 0) wg_rs64_00_z(Rk, ah, db);
        else wg_rs64_00(Rk, ah, db);
        if constexpr (TERMS == 2) wg_rs64_00(Rk, al, db);
      } else {
        const uint64_t ah = sm_desc(sm + kGH + 128 * 8 * c + 2 * kb * 2048, 2048, 128);
        if (kb == 0) wg_ss64_00_z(Rk, ah, db);
        else wg_ss64_00(Rk, ah, db);
        if constexpr (TERMS == 2) wg_ss64_00(Rk, sm_desc(sm + kGL + 128 * 8 * c + 2 * kb * 2048, 2048, 128), db);
      }
    }
    wg_commit();
    behind<ORDER>();  // R^T is done
    acc_fence(R);
    col_dots(sm, R, kQ, i0, c, wl, g, q);  // f
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[8 * ((i >> 2) & 7) + 2 * q + (i & 1)];
    consumers_sync();  // the other consumer's weights are written
    weights_product<TERMS, false>(R, sm, kK + 8192 * c, kMQH, kMQL);  // dq^T = R^T diag(A) + K^T MQ^T
    behind<ORDER>();  // Rk^T is done
    acc_fence(Rk);
    col_dots(sm, Rk, kK, i0, 2 + c, wl, g, q);  // e
#pragma unroll
    for (int i = 0; i < 32; ++i) Rk[i] *= tab[128 + 8 * ((i >> 2) & 7) + 2 * q + (i & 1)];
    weights_product<TERMS, true>(Rk, sm, kQ + 8192 * c, kMDH, kMDL);  // dkt^T = Rk^T diag(w) + Q^T MD
    behind<ORDER>();  // dq^T is done
    acc_fence(R);
    put_out(sm, R, c, wl, g, q);
    // KG (columns j = 64 c ..) = K G (B = G hi / lo, MN-major)
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, kK, 64, kb);
      const uint64_t bh = mdesc(sm, kGH + 16384 * c, 128, kb), bl = mdesc(sm, kGL + 16384 * c, 128, kb);
      if (kb == 0) wg_ss64_01_z(R, da, bh);
      else wg_ss64_01(R, da, bh);
      if constexpr (TERMS == 2) wg_ss64_01(R, da, bl);
    }
    wg_commit();
    behind<ORDER>();  // dkt^T is done
    acc_fence(Rk);
    col_dots(sm, Rk, kK, i0, 4 + c, wl, g, q);  // dbeta
    put_out(sm, Rk, c, wl, g, q);
    wg_wait<0>();  // KG
    acc_fence(R);
    // dv = diag(beta w) KG + MP^T dY
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[192 + 16 * wl + g + 8 * ((i >> 1) & 1)];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      wg_fence();
      const uint64_t bd = mdesc(sm, kY + 8192 * c, 64, kb);
      wg_ss64_11(R, mdesc(sm, kMPH, 64, kb), bd);
      if constexpr (TERMS == 2) wg_ss64_11(R, mdesc(sm, kMPL, 64, kb), bd);
    }
    wg_commit();
    consumers_sync();  // both consumers' KG have read G's hi / lo (dv's product reads no G)
    // G <- A_63 G + (diag(A) Q)^T dY: A = Q^T fragments (scalar loads of the q tile), scaled and split
    const float a63 = tab[63];
#pragma unroll
    for (int i = 0; i < 64; ++i) G[i] *= a63;
    acc_fence(G);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // a_r: row ir + 8 (r & 1), steps t = 16 kb + 2 q + 8 (r >> 1) (+1)
        const int i = ir + 8 * (r & 1), t = 16 * kb + 2 * q + 8 * (r >> 1);
        const float x0 = ldb(sm + kQ + (i >> 3) * 1024 + t * 16 + (i & 7) * 2) * tab[t];
        const float x1 = ldb(sm + kQ + (i >> 3) * 1024 + (t + 1) * 16 + (i & 7) * 2) * tab[t + 1];
        split2<TERMS>(x0, x1, ah[r], al[r]);
      }
      wg_fence();
      const uint64_t db = mdesc(sm, kY, 64, kb);
      wg_rs128_01(G, ah, db);
      if constexpr (TERMS == 2) wg_rs128_01(G, al, db);
    }
    wg_commit();
    behind<ORDER>();  // dv is done
    acc_fence(R);
    put_out(sm, R, c, wl, g, q);
    wg_wait<0>();  // G's update
    acc_fence(G);
#pragma unroll
    for (int n = 0; n < 16; ++n)  // G's hi / lo for the next chunk's KG ([j / 8][i][8], MN-major for KG's B)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = ir + 8 * h, j = 8 * n + 2 * q;
        uint32_t hi, lo;
        split2<TERMS>(G[4 * n + 2 * h], G[4 * n + 2 * h + 1], hi, lo);
        const int off = (j >> 3) * 2048 + i * 16 + (j & 7) * 2;
        *reinterpret_cast<uint32_t*>(sm + kGH + off) = hi;
        if constexpr (TERMS == 2) *reinterpret_cast<uint32_t*>(sm + kGL + off) = lo;
      }
    fence_async_smem();
    if constexpr (SYNC) __syncthreads();
  }
  sink_out(out, G, c0);
}

// WG0, AUX 1: the dgate-like work of a chunk, C^3 / 6 scalar FMAs over shared memory (E from QK in fp32, the
// tables), and the parts' sums.
template <bool SYNC>
__device__ __forceinline__ void aux_loop(unsigned char* sm, int nchunks, float* out) {
  const int tid = threadIdx.x & 127;
  const float* qk = reinterpret_cast<const float*>(sm + kQKF);
  const float* tab = reinterpret_cast<const float*>(sm + kTab);
  const float* part = reinterpret_cast<const float*>(sm + kPart);
  float sink = 0.f;
  for (int ch = 0; ch < nchunks; ++ch) {
    const int t = tid >> 1, x = tid & 1;  // two threads a step
    float td = 0.f;
    for (int u = t + x; u < 64; u += 2) {
      float e = 0.f;
      for (int s = 0; s < t; ++s) e = fmaf(qk[u * 64 + s], tab[s], e);
      td = fmaf(tab[64 + u], e, td);
    }
    td += __shfl_xor_sync(0xffffffffu, td, 1);
#pragma unroll 4
    for (int w = 0; w < 12; ++w) td += part[w * 64 + t];
    sink += td;
    if constexpr (SYNC) __syncthreads();
  }
  out[blockIdx.x * 384 + threadIdx.x] = sink;
}

// WG0, AUX 2: the same term as a product (training-design.md 7): E = beta QK Dd below the diagonal, split hi / lo
// into the staging buffer ([s / 8][u][8], E^T as a K-major B); M^T = L' E^T (t 64 x u 64 x s 64) with A = L'
// fragments made from the tables (L'[t][s] = L[t-1][s]), 3 terms; td_t = sum_u L[u][t] M^T[t][u] by row sums.
template <bool SYNC>
__device__ __forceinline__ void aux_loop_mma(unsigned char* sm, int nchunks, float* out) {
  const int tid = threadIdx.x & 127, wl = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const float* qk = reinterpret_cast<const float*>(sm + kQKF);
  const float* tab = reinterpret_cast<const float*>(sm + kTab);
  const float* part = reinterpret_cast<const float*>(sm + kPart);
  constexpr int kEH = kOut, kEL = kOut + 8192;  // (the consumers' staging: dummy data, the timing is what counts)
  float sink = 0.f;
  for (int ch = 0; ch < nchunks; ++ch) {
#pragma unroll 1
    for (int e = tid; e < 64 * 32; e += 128) {  // pairs (u, s, s + 1)
      const int u = e >> 5, s = 2 * (e & 31);
      const float x0 = s < u ? tab[s] * qk[u * 64 + s] * qk[s * 64 + u] : 0.f;
      const float x1 = s + 1 < u ? tab[s + 1] * qk[u * 64 + s + 1] * qk[(s + 1) * 64 + u] : 0.f;
      uint32_t hi, lo;
      split2<2>(x0, x1, hi, lo);
      const int off = (s >> 3) * 1024 + u * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + kEH + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kEL + off) = lo;
    }
    fence_async_smem();
    asm volatile("bar.sync 5, 128;\n" ::: "memory");  // WG0's own threads
    float M[32];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // L'[t][s], t = 16 wl + g + 8 (r & 1), s = 16 kb + 2 q + 8 (r >> 1) (+1)
        const int t = 16 * wl + g + 8 * (r & 1), s = 16 * kb + 2 * q + 8 * (r >> 1);
        split2<2>(s < t ? tab[t] * tab[64 + s] : 0.f, s + 1 < t ? tab[t] * tab[65 + s] : 0.f, ah[r], al[r]);
      }
      wg_fence();
      const uint64_t bh = kdesc(sm, kEH, 64, kb), bl = kdesc(sm, kEL, 64, kb);
      if (kb == 0) wg_rs64_00_z(M, ah, bh);
      else wg_rs64_00(M, ah, bh);
      wg_rs64_00(M, ah, bl);
      wg_rs64_00(M, al, bh);
      wg_commit();
      wg_wait<0>();  // a k-step at a time: WG0's registers are few
    }
    acc_fence(M);
    float td[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 32; ++i) {  // M^T[t][u]: t = 16 wl + g + 8 ((i >> 1) & 1), u = 8 (i >> 2) + 2 q + (i & 1)
      const int h = (i >> 1) & 1, t = 16 * wl + g + 8 * h, u = 8 * (i >> 2) + 2 * q + (i & 1);
      td[h] = fmaf(t <= u ? tab[u] * tab[64 + t] : 0.f, M[i], td[h]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      td[h] += __shfl_xor_sync(0xffffffffu, td[h], 1);
      td[h] += __shfl_xor_sync(0xffffffffu, td[h], 2);
#pragma unroll 4
      for (int w = 0; w < 12; ++w) td[h] += part[w * 64 + 16 * wl + g + 8 * h];
      sink += td[h];
    }
    asm volatile("bar.sync 5, 128;\n" ::: "memory");  // E's buffer is free
    if constexpr (SYNC) __syncthreads();
  }
  out[blockIdx.x * 384 + threadIdx.x] = sink;
}

// AUX: 0 idle, 1 the scalar dgate loop, 2 the dgate term as a product; CONS: the consumers run; ORDER as
// consumer_loop. Registers (setmaxnreg): WG0 40 and the consumers 232, or 80 and 216 where WG0 issues wgmma (the pipelined
// consumers need more than 224 beside it: ptxas serializes their wgmma, C7512, in variant 8).
template <int AUX, bool CONS, int TERMS, int ORDER, bool SYNC>
__global__ void __launch_bounds__(384, 1) b6_kernel(const float* src_s, float* out, int nchunks) {
  static_assert(!SYNC || (AUX > 0 && CONS), "lockstep needs every warpgroup in the loop");
  constexpr int kAux = AUX == 2 ? 80 : 40, kCons = AUX == 2 ? 216 : 232;
  static_assert(kAux * 128 + kCons * 256 <= 65536, "the split fits the register file");
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  fill_dummy(sm, kSmem, 7919u * blockIdx.x, 0.25f);
  float* tab = reinterpret_cast<float*>(sm + kTab);
  if (threadIdx.x < 256) tab[threadIdx.x] = 0.95f + 0.1f * dummy(threadIdx.x + 99u);
  if (threadIdx.x == 0) tab[63] = 0.5f;  // G stays bounded over the chunks
  fence_async_smem();
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
  if (wg == 0) {
    maxnreg_dec<kAux>();
    if constexpr (AUX == 1) aux_loop<SYNC>(sm, nchunks, out);
    if constexpr (AUX == 2) aux_loop_mma<SYNC>(sm, nchunks, out);
    return;
  }
  maxnreg_inc<kCons>();
  if constexpr (CONS) consumer_loop<TERMS, ORDER, SYNC>(sm, wg - 1, nchunks, src_s + (size_t)blockIdx.x * 16384, out);
}

// The issue ceiling of three warpgroups a CTA: SS m64n64k16 back to back, 8 a commit group, one group in flight.
__global__ void __launch_bounds__(384, 1) peak_kernel(float* out, int iters) {
  extern __shared__ __align__(1024) unsigned char sm[];
  fill_dummy(sm, 65536, 0u, 1.f);
  float d[32] = {};
  for (int it = 0; it < iters; ++it) {
    wg_fence();
#pragma unroll
    for (int u = 0; u < 8; ++u) wg_ss64_00(d, kdesc(sm, kQ, 64, u), kdesc(sm, kK, 64, u));
    wg_commit();
    wg_wait<1>();
  }
  wg_wait<0>();
  acc_fence(d);
  sink_out(out, d, 0.f);
}

// =============================== B1: the design's operand forms against float64 ===============
// One warpgroup. A (64 x K), B (K x N), B2 (64 x 64) in math form, fp32 holding bf16 values. Modes:
// 0 SS K-major A and B (control); 1 SS A MN-major; 2 SS A and B MN-major; 3 SS B MN-major, K = 128 (KG's form);
// 4 D1 = A B (SS), then D = D1 B2 with D1's accumulator as RS A fragments (hi, lo); 5 RS m64n128, A fragments from
// global, B MN-major (G's update form). swap: MN-major descriptors with LBO and SBO exchanged (must be wrong).
__device__ __forceinline__ void put_k(unsigned char* t, const float* X, int R, int Kd, bool xt, int ld) {
  // K-major tile of rows r < R, k < Kd: element (r, k) = X[k][r] (xt: X is K x R) or X[r][k]
  for (int e = threadIdx.x; e < R * Kd; e += 128) {
    const int r = e / Kd, k = e % Kd;
    *reinterpret_cast<__nv_bfloat16*>(t + (k >> 3) * (R * 16) + r * 16 + (k & 7) * 2) =
        __float2bfloat16_rn(xt ? X[k * ld + r] : X[r * ld + k]);
  }
}
__device__ __forceinline__ void put_mn(unsigned char* t, const float* X, int R, int Kd, bool xt, int ld) {
  // MN-major tile: element (x, k) at [x / 8][k][x % 8], x < R
  for (int e = threadIdx.x; e < R * Kd; e += 128) {
    const int x = e / Kd, k = e % Kd;
    *reinterpret_cast<__nv_bfloat16*>(t + (x >> 3) * (Kd * 16) + k * 16 + (x & 7) * 2) =
        __float2bfloat16_rn(xt ? X[k * ld + x] : X[x * ld + k]);
  }
}
__device__ __forceinline__ uint64_t mn_d(const unsigned char* t, int Kd, int kb, int swap) {
  return swap ? sm_desc(t + 256 * kb, Kd * 16, 128) : sm_desc(t + 256 * kb, 128, Kd * 16);
}
__global__ void __launch_bounds__(128, 1) b1_kernel(const float* A, const float* B, const float* B2, float* D, int mode,
                                                     int swap) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  __shared__ __align__(1024) unsigned char ta[16384], tb[32768], tb2[8192];
  const int K = mode == 3 ? 128 : 64, N = mode == 5 ? 128 : 64;
  const int wl = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  if (mode == 0 || mode == 3 || mode == 4) put_k(ta, A, 64, K, false, K);
  else put_mn(ta, A, 64, K, false, K);
  if (mode == 0 || mode == 1 || mode == 4) put_k(tb, B, N, K, true, N);
  else put_mn(tb, B, N, K, true, N);
  if (mode == 4) put_k(tb2, B2, 64, 64, true, 64);
  fence_async_smem();
  __syncthreads();
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  float (&d32)[32] = *reinterpret_cast<float (*)[32]>(d);
  if (mode == 5) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int m = 16 * wl + g + 8 * (r & 1), k = 16 * kb + 2 * q + 8 * (r >> 1);
        const __nv_bfloat162 v = __floats2bfloat162_rn(A[m * K + k], A[m * K + k + 1]);
        a[r] = *reinterpret_cast<const uint32_t*>(&v);
      }
      wg_fence();
      wg_rs128_01(d, a, mn_d(tb, K, kb, swap));
      wg_commit();
    }
  } else {
    for (int kb = 0; kb < K / 16; ++kb) {
      const uint64_t da = (mode == 1 || mode == 2) ? mn_d(ta, K, kb, swap) : kdesc(ta, 0, 64, kb);
      const uint64_t db = (mode == 2 || mode == 3) ? mn_d(tb, K, kb, swap) : kdesc(tb, 0, N, kb);
      wg_fence();
      if (mode == 0 || mode == 4) wg_ss64_00(d32, da, db);
      else if (mode == 1) wg_ss64_10(d32, da, db);
      else if (mode == 2) wg_ss64_11(d32, da, db);
      else wg_ss64_01(d32, da, db);
      wg_commit();
    }
  }
  wg_wait<0>();
  acc_fence(d);
  if (mode == 4) {  // D = D1 B2, D1's accumulator columns 16 kb .. as the k-step's A fragments, hi and lo
    float e[32];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) split2<2>(d[8 * kb + 2 * r], d[8 * kb + 2 * r + 1], ah[r], al[r]);
      wg_fence();
      if (kb == 0) wg_rs64_00_z(e, ah, kdesc(tb2, 0, 64, kb));
      else wg_rs64_00(e, ah, kdesc(tb2, 0, 64, kb));
      wg_rs64_00(e, al, kdesc(tb2, 0, 64, kb));
      wg_commit();
    }
    wg_wait<0>();
    acc_fence(e);
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = e[i];
  }
  for (int i = 0; i < N / 2; ++i) {
    const int n = i >> 2, row = 16 * wl + g + 8 * ((i >> 1) & 1), col = 8 * n + 2 * q + (i & 1);
    D[row * N + col] = d[i];
  }
}

FUNC_ATTRS

// (AUX, CONS, TERMS, ORDER, SYNC) of each variant, in the order of VARIANTS (Python).
template <int V>
struct Variant;
template <> struct Variant<0> { static constexpr auto k = b6_kernel<1, true, 2, 0, false>; };
template <> struct Variant<1> { static constexpr auto k = b6_kernel<0, true, 2, 0, false>; };
template <> struct Variant<2> { static constexpr auto k = b6_kernel<1, true, 1, 0, false>; };
template <> struct Variant<3> { static constexpr auto k = b6_kernel<1, true, 2, 0, true>; };
template <> struct Variant<4> { static constexpr auto k = b6_kernel<1, false, 2, 0, false>; };
template <> struct Variant<5> { static constexpr auto k = b6_kernel<0, true, 2, 1, false>; };
template <> struct Variant<6> { static constexpr auto k = b6_kernel<2, false, 2, 1, false>; };
template <> struct Variant<7> { static constexpr auto k = b6_kernel<2, true, 2, 0, false>; };
template <> struct Variant<8> { static constexpr auto k = b6_kernel<2, true, 2, 1, false>; };

template <int V>
cudaError_t launch_v(const float* src_s, float* out, int sms, int n, cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(Variant<V>::k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  Variant<V>::k<<<sms, 384, kSmem, s>>>(src_s, out, n);
  return cudaGetLastError();
}

}  // namespace

int bp_b6(int v, const float* src_s, float* out, int sms, int n, cudaStream_t s) {
  switch (v) {
    case 0: return (int)launch_v<0>(src_s, out, sms, n, s);
    case 1: return (int)launch_v<1>(src_s, out, sms, n, s);
    case 2: return (int)launch_v<2>(src_s, out, sms, n, s);
    case 3: return (int)launch_v<3>(src_s, out, sms, n, s);
    case 4: return (int)launch_v<4>(src_s, out, sms, n, s);
    case 5: return (int)launch_v<5>(src_s, out, sms, n, s);
    case 6: return (int)launch_v<6>(src_s, out, sms, n, s);
    case 7: return (int)launch_v<7>(src_s, out, sms, n, s);
    case 8: return (int)launch_v<8>(src_s, out, sms, n, s);
  }
  return (int)cudaErrorInvalidValue;
}
int bp_b6_attrs(int v, int* res) {
  switch (v) {
    case 0: return func_attrs((const void*)Variant<0>::k, res);
    case 1: return func_attrs((const void*)Variant<1>::k, res);
    case 2: return func_attrs((const void*)Variant<2>::k, res);
    case 3: return func_attrs((const void*)Variant<3>::k, res);
    case 4: return func_attrs((const void*)Variant<4>::k, res);
    case 5: return func_attrs((const void*)Variant<5>::k, res);
    case 6: return func_attrs((const void*)Variant<6>::k, res);
    case 7: return func_attrs((const void*)Variant<7>::k, res);
    case 8: return func_attrs((const void*)Variant<8>::k, res);
  }
  return (int)cudaErrorInvalidValue;
}
int bp_b1(const float* A, const float* B, const float* B2, float* D, int mode, int swap, cudaStream_t s) {
  b1_kernel<<<1, 128, 0, s>>>(A, B, B2, D, mode, swap);
  return (int)cudaGetLastError();
}
int bp_peak(float* out, int sms, int iters, cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(peak_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  if (e != cudaSuccess) return (int)e;
  peak_kernel<<<sms, 384, 65536, s>>>(out, iters);
  return (int)cudaGetLastError();
}
}  // namespace bp
"""

HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <vector>
namespace bp {
int bp_b6(int v, const float* src_s, float* out, int sms, int n, cudaStream_t s);
int bp_b6_attrs(int v, int* res);
int bp_peak(float* out, int sms, int iters, cudaStream_t s);
int bp_b1(const float* A, const float* B, const float* B2, float* D, int mode, int swap, cudaStream_t s);
}
static void check(int e, const char* what) {
  TORCH_CHECK(e == 0, what, ": ", cudaGetErrorString((cudaError_t)e));
}
void b6(const at::Tensor& src_s, const at::Tensor& out, int64_t v, int64_t sms, int64_t n) {
  check(bp::bp_b6((int)v, src_s.data_ptr<float>(), out.data_ptr<float>(), (int)sms, (int)n,
                  c10::cuda::getCurrentCUDAStream()), "b6 launch");
}
std::vector<int64_t> b6_attrs(int64_t v) {
  int r[4] = {0, 0, 0, 0};
  check(bp::bp_b6_attrs((int)v, r), "b6 attributes");
  return {r[0], r[1], r[2], r[3]};
}
void b1(const at::Tensor& A, const at::Tensor& B, const at::Tensor& B2, const at::Tensor& D, int64_t mode,
        int64_t swap) {
  check(bp::bp_b1(A.data_ptr<float>(), B.data_ptr<float>(), B2.data_ptr<float>(), D.data_ptr<float>(), (int)mode,
                  (int)swap, c10::cuda::getCurrentCUDAStream()), "b1 launch");
}
void peak(const at::Tensor& out, int64_t sms, int64_t iters) {
  check(bp::bp_peak(out.data_ptr<float>(), (int)sms, (int)iters, c10::cuda::getCurrentCUDAStream()), "peak launch");
}
"""

# (name, consumer units a chunk (m64n64k16)): the order of Variant<V>.
VARIANTS = [("full: WG0 dgate loop + 2 consumers, 2 terms, S from global", 192),
            ("consumers only (WG0 idle)", 192),
            ("1 term (no lo products)", 96),
            ("full, block barrier a chunk (lockstep)", 192),
            ("WG0's scalar dgate loop alone", 0),
            ("consumers only, pipelined (next product before the epilogue)", 192),
            ("WG0's dgate as a product alone (E split, 4 x 3 RS)", 12),
            ("consumers (not pipelined) + WG0's dgate product", 204),
            ("pipelined consumers + WG0's dgate product (ptxas serializes: C7512)", 204)]
UNIT_FLOP = 2 * 64 * 64 * 16


B1_MODES = ["SS, A and B K-major (control)", "SS, A MN-major", "SS, A and B MN-major", "SS, B MN-major, K = 128",
            "accumulator recast to RS A (hi, lo), then x B2", "RS m64n128, B MN-major"]


def probe_b1(mod):
    """Each operand form of the design against float64 (bf16 inputs, fp32 accumulation: about 1e-7 when right; the
    recast's 2-term split about 1e-5); the MN-major forms also with LBO and SBO exchanged (expected wrong)."""
    gen = torch.Generator().manual_seed(3)
    rows = []
    for mode, name in enumerate(B1_MODES):
        K, N = (128 if mode == 3 else 64), (128 if mode == 5 else 64)
        A = torch.randn(64, K, generator=gen).bfloat16().float()
        B = torch.randn(K, N, generator=gen).bfloat16().float()
        B2 = torch.randn(64, 64, generator=gen).bfloat16().float()
        want = A.double() @ B.double()
        if mode == 4:
            want = want @ B2.double()
        for swap in ((0, 1) if mode in (1, 2, 3, 5) else (0,)):
            D = torch.full((64, N), float("nan"), device="cuda")
            mod.b1(A.cuda(), B.cuda(), B2.cuda(), D, mode, swap)
            torch.cuda.synchronize()
            err = ((D.cpu().double() - want).norm() / want.norm()).item()
            ok = err < (1e-4 if mode == 4 else 1e-5)
            rows.append({"mode": mode, "name": name, "swapped_lbo_sbo": bool(swap), "rel_l2": err, "right": ok})
            print(f"B1 [{mode}] {name:48s} {'swapped ' if swap else ''}rel-L2 {err:.2e} {'RIGHT' if ok else 'wrong'}",
                  flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--chunks", type=int, default=500)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    cuda = CUDA_SRC.replace("WGMMA_FORMS", WGMMA_SRC).replace("WGMMA_SYNC", solution_constant("WGMMA_SYNC_SRC"))
    cuda = cuda.replace("FUNC_ATTRS", FUNC_ATTRS_SRC).replace("PROBE_HELPERS", PROBE_HELPERS_SRC + BF16_TILE_SRC)
    mod, summary = build("bwd_sm90_probe", HOST_SRC, cuda, ["b6", "b6_attrs", "peak", "b1"], "bp")
    print_build(summary)
    res = {"build": summary}
    if args.build_only:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 384, device="cuda")
    src_s = torch.randn(sms * 16384, device="cuda") * 0.1
    res.update(device=torch.cuda.get_device_name(0), sms=sms, chunks=args.chunks, variants=[])
    for v, (name, units) in enumerate(VARIANTS):
        attrs = mod.b6_attrs(v)
        ms = kernelbench_time(mod.b6, (src_s, out, v, sms, args.chunks), trials=args.trials, warmup=2,
                              flush=False)["median"]
        us = ms * 1e3 / args.chunks
        tflops = sms * args.chunks * units * UNIT_FLOP / (ms * 1e-3) / 1e12
        res["variants"].append({"variant": v, "name": name, "us_per_chunk": us, "tflops": tflops,
                                "registers": attrs[0], "local_bytes": attrs[1], "finite": bool(out.isfinite().all())})
        print(f"B6 [{v}] {name:55s} {us:7.3f} us/chunk {tflops:6.1f} TFLOPS ({attrs[0]} regs, {attrs[1]} B local)",
              flush=True)
    iters = 2000
    ms = kernelbench_time(mod.peak, (out, sms, iters), trials=args.trials, warmup=2, flush=False)["median"]
    tflops = sms * 3 * iters * 8 * UNIT_FLOP / (ms * 1e-3) / 1e12
    res["peak_tflops"] = tflops
    print(f"B6 ceiling: 3 warpgroups a CTA, SS m64n64k16 back to back: {tflops:6.1f} TFLOPS "
          f"(= {sms * 192 * UNIT_FLOP / (tflops * 1e12) * 1e6:.2f} us for a 192-unit chunk)", flush=True)
    us = res["variants"][0]["us_per_chunk"]
    res["verdict"] = "GO (<= 8 us)" if us <= 8.0 else ("RE-PLAN (> 10 us)" if us > 10.0 else "marginal (8-10 us)")
    print(f"B6 verdict [0]: {us:.3f} us a chunk: {res['verdict']}", flush=True)
    save("bwd_sm90_probe.json", res)
    res["B1"] = probe_b1(mod)  # after B6: a wrong descriptor here could poison the context
    save("bwd_sm90_probe.json", res)


if __name__ == "__main__":
    main()
