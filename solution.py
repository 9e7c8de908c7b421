"""Gated outer-product linear recurrence as one CUDA kernel (KernelBench drop-in: ModelNew).

Math, per batch b and head h, S_0 = 0 (a D_k x D_v state kept in fp32):

    S_t = gate_t * S_{t-1} + beta_t * k_t v_t^T
    y_t = S_t^T q_t            (y_t[j] = sum_i q_t[i] S_t[i, j])

q, k: (B, T, H, D_k); v, y: (B, T, H, D_v); gate, beta: (B, T, H); any strides; float32,
float16 or bfloat16 (all the same dtype); 1 <= D_k, D_v <= 256. Arithmetic is fp32, y has the
input dtype.

Algorithms (the dispatch in the host section "dispatch" picks one per call; `plan()` names it):

    kernel          serves        how
    recurrent_v1    T < 256       column j of S evolves on its own, so each column is owned by a
                                  group of G lanes of one warp (G * R >= D_k rows, R rows per lane,
                                  S in registers); a block of 256 threads stages C time steps of
                                  q, k, v, gate, beta in shared memory with 16-byte loads where the
                                  layout allows (one barrier per C steps, none per step), then the
                                  lanes run the C steps and the G lanes of a column reduce q . S
                                  with warp shuffles (G is a template parameter).
    chunk_v2        T >= 256, or  chunkwise-parallel form (section "chunk_v1 kernel" has the math): per
                    D_k >= 96 and chunk of 32 steps, masked (q k^T) v plus (decayed q) S and one state
                    B*H*T >= 8192 update, on TF32 mma.sync with fragments in registers; fp32 inputs use
                                  3xTF32 (hi/lo split, fp32-level error), fp16 inputs one TF32
                                  product. Decays are direct products of gates (exact for gates 0,
                                  < 0 and > 1), applied to the fragments in registers; row-major
                                  A fragments load with ldmatrix. D_k padded to 64 or 128 with
                                  D_v > 32 and 16-byte aligned rows of q, k, v and y runs an
                                  instantiation with every loop unrolled and all of a chunk's loads
                                  in flight at once.
    chunk_v3        as chunk_v2,  chunk_v2's schedule on bf16 mma.sync m16n8k16: q, k, v staged as raw
                    bf16 inputs   bf16 and loaded with ldmatrix; the fp32 operands (masked product,
                                  state, scaled keys) split into two bf16 terms (hi + lo, 16
                                  significant bits), each times an exact bf16 input. fp16 inputs
                                  stay on chunk_v2 (TF32 holds fp16 exactly, with fp32's range).
    chunk_v1        (comparison)  the same form on wmma 16x16x8 tiles with decay, mask and scale
                                  passes over shared memory; selectable in gated_recurrence_with.
    state_scan_v1   with chunk_v* sequence parallelism when B * H blocks cannot fill the GPU: the
                    when segments  sequence is cut into segments, chunk_v* first computes each
                    > 1            segment's own state, this kernel chains them, and chunk_v* then
                                  runs all segments at once from their start states (the scan and
                                  that phase are programmatic dependent launches on sm_90).

Measured on one H200, KernelBench timing (median per call, L2 flushed); BENCHMARKS.md has the
commands, the peers (fla and chunk_v2 from the same run as ours, run 5; chunk_v3's times are the
final code's, from the A/B of run 8, 2-3% under its run-5 times; chunk_v1 from an earlier session)
and the T sweep:

    recurrent_v1    (2, 128, 4, 24) fp32   0.0225 ms   (eager 9.51 ms, torch.compile 1.44 ms,
                                                        fla fused_recurrent 0.182 ms)
    chunk_v2        (4, 1024, 8, 64) fp32  0.0458 ms   (chunk_v1 0.115 ms, fla chunk 0.270 ms)
                    (8, 2048, 16, 128) fp32 0.562 ms   (chunk_v1 1.66 ms, fla chunk 0.737 ms)
                    (1, 8192, 8, 128) fp32 0.219 ms    (chunk_v1 0.580 ms, fla chunk 0.533 ms)
    chunk_v3        (8, 2048, 16, 128) bf16 0.304 ms   (chunk_v2 0.384 ms, fla chunk 0.341 ms)
                    (1, 8192, 8, 128) bf16 0.139 ms    (chunk_v2 0.161 ms, fla chunk 0.428 ms)
    rel-L2 error against float64: fp32 3e-7 to 5e-7 on the chunked path, 1e-7 on the recurrent one
    (fla chunk 1.5e-3); bf16 1.66e-3, which is the exact answer's own bf16 rounding (chunk_v2 1.71e-3,
    fla chunk 2.9e-3).

Functional API: `gated_recurrence(q, k, v, gate, beta, initial_state=None, output_final_state=False)`
-> y, or (y, final_state). `ModelNew` is a shell over it.
Bad arguments raise ValueError / TypeError naming the argument (checked in C++).
"""
import hashlib
import importlib.util
import os
import re
import subprocess
import sys

import torch
from torch.utils.cpp_extension import load_inline

__all__ = ["ModelNew", "gated_recurrence", "gated_recurrence_with", "gated_recurrence_config", "plan", "KERNELS"]

# Every kernel name the dispatch can return; tests check this list against the docstring and plan().
KERNELS = ("recurrent_v1", "chunk_v1", "chunk_v2", "chunk_v3", "state_scan_v1")

# ---------------------------------------------------------------------------------------------
# Source, in named sections. COMMON is seen by both translation units; KERNELS is the .cu file
# (no torch headers: nothing there throws, it returns cudaError_t); HOST is the C++ file with the
# argument checks, the dispatch and the Python bindings.
# ---------------------------------------------------------------------------------------------
COMMON_SRC = r"""
// ===================================== section: common ======================================
#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

namespace gr {
constexpr int kMaxThreads = 256;
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct Strides4 { int64_t b, t, h, d; };
struct Strides3 { int64_t b, t, h; };
struct StateStrides { int64_t b, h, i, j; };  // a (B, H, D_k, D_v) fp32 state

struct RecurrentParams {
  const void* q; const void* k; const void* v; const void* gate; const void* beta; void* y;
  Strides4 sq, sk, sv, sy;
  Strides3 sg, sb;
  int T, H, Dk, Dv;
  int JB;          // state columns per block
  int TC;          // time steps staged in shared memory at once
  int col_blocks;  // ceil(Dv / JB)
  int vec;         // q, k, v rows are 16-byte aligned runs (checked by the caller): 16-byte loads
  const float* s_in; StateStrides ssi;  // initial state, or nullptr for zero
  float* s_out; StateStrides sso;       // final state, or nullptr
};

struct RecurrentConfig { int R, G, JB, TC; };

inline size_t recurrent_smem(const RecurrentConfig& c) {
  return sizeof(float) * (size_t)c.TC * (2 * c.G * c.R + c.JB + 2);
}

// (R, G) pairs compiled: the dispatch's rule (G = 1 with any R, else R in {6, 8}) plus (4, 8).
#define GR_RG_PAIRS(X) X(1, 1) X(2, 1) X(4, 1) X(6, 1) X(8, 1) X(6, 2) X(8, 2) X(6, 4) X(8, 4) X(4, 8) \
  X(6, 8) X(8, 8) X(6, 16) X(8, 16) X(6, 32) X(8, 32)

// Chunked path. A (b, h) sequence is cut into nseg segments of seg_chunks chunks of C steps. With
// nseg > 1 a state phase (mode 1) computes each segment's own state contribution and gate product,
// state_scan_v1 chains them, and the output phase (mode 0) runs every segment from its start state.
struct ChunkParams {
  const void* q; const void* k; const void* v; const void* gate; const void* beta; void* y;
  Strides4 sq, sk, sv, sy;
  Strides3 sg, sb;
  int T, H, Dk, Dv;
  int64_t BH;
  int DKP;          // D_k rounded up to 16
  int vtiles;       // ceil(D_v / NV) column tiles
  int nseg, seg_chunks;
  int seg_launch;   // segments in this launch: nseg (outputs) or nseg - 1 (states)
  int mode;         // 0: outputs, 1: segment states only
  int vec_qk, vec_v, vec_y;  // 16-byte accesses are legal for q and k / v / y
  int pdl;          // launch as a programmatic dependent of the previous kernel (our own, sm_90+)
  const float* s_in; StateStrides ssi;
  float* s_out; StateStrides sso;
  float* seg_states;  // (B, H, nseg - 1, D_k, D_v): contributions, then (after the scan) end states
  float* seg_decays;  // (B, H, nseg - 1)
};

struct ChunkConfig { int version, C, NV, nseg; };  // version 1: chunk_v1, 2: chunk_v2, 3: chunk_v3 (C = 32)

inline size_t chunk_smem(int C, int NV, int DKP) {
  return sizeof(float) * (size_t)(2 * C * (DKP + 4) + 2 * C * (NV + 8) + DKP * (NV + 8) + C * (C + 4) + 6 * C);
}

inline size_t chunk2_smem(int NV, int DKP) {
  return sizeof(float) * (size_t)(2 * 32 * (DKP + 4) + 2 * 32 * (NV + 8) + DKP * (NV + 8) + 32 * 36 + 5 * 32 + 512);
}
// chunk_v3: fp32 staged y and two sets of gate tables; bf16 P twice, S twice, two staging buffers of q and
// k (D_k padded to 32) and v.
inline size_t chunk3_smem(int NV, int DKP) {
  const size_t dkq = (size_t)(DKP + 31) / 32 * 32;
  return sizeof(float) * (size_t)(32 * (NV + 8) + 2 * 21 * 32) +
         2 * (2 * 32 * 40 + 2 * (size_t)DKP * (NV + 8) + 2 * (2 * 32 * (dkq + 8) + 32 * (size_t)(NV + 8)));
}
inline size_t chunk_smem(const ChunkConfig& c, int DKP) {
  return c.version == 3 ? chunk3_smem(c.NV, DKP) : c.version == 2 ? chunk2_smem(c.NV, DKP) : chunk_smem(c.C, c.NV, DKP);
}

// (C, NV) pairs compiled for chunk_v1; chunk_v2 has C = 32 and NV = 32 or 64.
#define GR_CHUNK_PAIRS(X) X(32, 32) X(32, 64) X(64, 32) X(64, 64)

cudaError_t launch_chunk_v1(const ChunkParams& p, int C, int NV, DType dtype, int64_t blocks, cudaStream_t stream);
cudaError_t launch_chunk_v2(const ChunkParams& p, int NV, DType dtype, int64_t blocks, cudaStream_t stream);
cudaError_t launch_chunk_v3(const ChunkParams& p, int NV, DType dtype, int64_t blocks, cudaStream_t stream);
cudaError_t launch_state_scan_v1(const ChunkParams& p, cudaStream_t stream);
cudaError_t launch_recurrent_v1(const RecurrentParams& p, const RecurrentConfig& c, DType dtype, int64_t blocks,
                                cudaStream_t stream);
}  // namespace gr
"""

KERNELS_SRC = r"""
// ===================================== section: device helpers ==============================
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

namespace gr {
namespace {  // internal linkage up to the entry points (see there)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Programmatic dependent launch (sm_90+): a kernel launched with pdl may start while the previous
// kernel in the stream still runs; it waits here before it touches memory, and the previous kernel
// lets it start by calling griddep_launch. Both are no-ops for a kernel launched without pdl.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// One load job: V consecutive elements (16 bytes when vectorised) of a row of q, k or v.
template <typename scalar_t, bool VEC>
struct Chunk {
  static constexpr int V = VEC ? 16 / (int)sizeof(scalar_t) : 1;
  union { uint4 raw; scalar_t x[V]; } u;
};

// Stages time steps [t0, t0 + tc) of q, k (rows of width Dk into pitch kp) and the block's v
// columns (nv of them into pitch JB) into shared memory as float. All jobs of the three tensors
// share one index space and go out U at a time, so a thread has U loads in flight.
template <typename scalar_t, bool VEC, int U = 8>
__device__ __forceinline__ void stage_qkv(float* q_s, float* k_s, float* v_s, int kp, int JB,
                                          const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                                          const scalar_t* __restrict__ v, int64_t sqt, int64_t sqd,
                                          int64_t skt, int64_t skd, int64_t svt, int64_t svd,
                                          int tc, int Dk, int nv) {
  using C = Chunk<scalar_t, VEC>;
  constexpr int V = C::V;
  const int qrow = Dk / V, vrow = nv / V;  // jobs per row (VEC implies divisibility)
  const int nq = tc * qrow, total = 2 * nq + tc * vrow;
  for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
    C buf[U];
    float* dst[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int e = base + u * blockDim.x;
      dst[u] = nullptr;
      if (e < total) {
        const scalar_t* src;
        int64_t st, sd;
        int row, pitch;
        float* d;
        if (e < 2 * nq) {
          const bool isk = e >= nq;
          e -= isk ? nq : 0;
          src = isk ? k : q; st = isk ? skt : sqt; sd = isk ? skd : sqd; row = qrow; pitch = kp; d = isk ? k_s : q_s;
        } else {
          e -= 2 * nq;
          src = v; st = svt; sd = svd; row = vrow; pitch = JB; d = v_s;
        }
        const int tt = e / row, c = (e - tt * row) * V;
        src += tt * st + c * sd;
        if constexpr (VEC) buf[u].u.raw = __ldg(reinterpret_cast<const uint4*>(src));
        else buf[u].u.x[0] = src[0];
        dst[u] = d + tt * pitch + c;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (dst[u] != nullptr) {
#pragma unroll
        for (int i = 0; i < V; ++i) dst[u][i] = to_float(buf[u].u.x[i]);
      }
  }
}

// tc time steps of one column slice. __restrict__ lets loads of later steps go ahead of this step's
// y store (34.6 -> 32.4 us at (2,128,4,24)). G is a template parameter because shuffles under a
// runtime `if (off < G)` compiled into divergence stubs (32.4 -> 22.3 us once G was compile-time).
template <typename scalar_t, int R, int G>
__device__ __forceinline__ void run_steps(float (&S)[R], const float* __restrict__ q_s, const float* __restrict__ k_s,
                                          const float* __restrict__ v_s, const float* __restrict__ g_s,
                                          const float* __restrict__ b_s, scalar_t* __restrict__ y, int64_t syt,
                                          int tc, int kp, int JB, int rows, bool writer) {
#pragma unroll 4
  for (int tt = 0; tt < tc; ++tt) {
    const float* qr = q_s + tt * kp;
    const float* kr = k_s + tt * kp;
    const float g = g_s[tt];
    const float bv = b_s[tt] * v_s[tt * JB];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {  // padded rows stay out: 0 * inf would be NaN
        S[r] = fmaf(g, S[r], kr[r] * bv);
        acc = fmaf(qr[r], S[r], acc);
      }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (writer) y[tt * syt] = from_float<scalar_t>(acc);
  }
}

// ===================================== section: recurrent_v1 kernel =========================
// Grid: one block per (b, h, column block). Lane `lane` of column `col` keeps rows
// [lane * R, lane * R + R) of S[:, j] in registers; threads past G * JB only load.
template <typename scalar_t, int R, int G>
__global__ void __launch_bounds__(kMaxThreads) recurrent_v1_kernel(const RecurrentParams p) {
  extern __shared__ float smem[];
  constexpr int kp = G * R;  // D_k padded to whole lanes
  float* q_s = smem;
  float* k_s = q_s + p.TC * kp;
  float* v_s = k_s + p.TC * kp;
  float* g_s = v_s + p.TC * p.JB;
  float* b_s = g_s + p.TC;

  int blk = blockIdx.x;
  const int cb = blk % p.col_blocks;
  blk /= p.col_blocks;
  const int h = blk % p.H;
  const int b = blk / p.H;

  const int tid = threadIdx.x;
  const int col = tid / G;
  const int lane = tid - col * G;
  const int j0 = cb * p.JB;
  const int nv = min(p.JB, p.Dv - j0);                // valid columns in this block
  const bool warp_active = ((tid & ~31) / G) < nv;  // shuffles need the whole warp
  const int i0 = lane * R;
  const int rows = max(0, min(R, p.Dk - i0));

  const scalar_t* q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + h * p.sq.h;
  const scalar_t* k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + h * p.sk.h;
  const scalar_t* v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + h * p.sv.h + j0 * p.sv.d;
  const scalar_t* gate = static_cast<const scalar_t*>(p.gate) + b * p.sg.b + h * p.sg.h;
  const scalar_t* beta = static_cast<const scalar_t*>(p.beta) + b * p.sb.b + h * p.sb.h;
  scalar_t* y = static_cast<scalar_t*>(p.y) + b * p.sy.b + h * p.sy.h + (j0 + col) * p.sy.d;

  // Padding columns are never staged: zero them (all of shared memory) once.
  const int smem_floats = p.TC * (2 * kp + p.JB + 2);
  for (int e = tid; e < smem_floats; e += blockDim.x) smem[e] = 0.f;
  __syncthreads();

  const bool owner = warp_active && col < nv;  // this lane's rows of column j0 + col are real
  float S[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    S[r] = (p.s_in != nullptr && owner && r < rows)
               ? p.s_in[b * p.ssi.b + h * p.ssi.h + (i0 + r) * p.ssi.i + (j0 + col) * p.ssi.j] : 0.f;

  for (int t0 = 0; t0 < p.T; t0 += p.TC) {
    const int tc = min(p.TC, p.T - t0);
    if (t0 > 0) __syncthreads();  // the previous chunk is fully consumed
    for (int e = tid; e < tc; e += blockDim.x) {  // issued first: in flight with q, k, v
      g_s[e] = to_float(gate[(t0 + e) * p.sg.t]);
      b_s[e] = to_float(beta[(t0 + e) * p.sb.t]);
    }
    if (p.vec)
      stage_qkv<scalar_t, true>(q_s, k_s, v_s, kp, p.JB, q + t0 * p.sq.t, k + t0 * p.sk.t, v + t0 * p.sv.t,
                                p.sq.t, p.sq.d, p.sk.t, p.sk.d, p.sv.t, p.sv.d, tc, p.Dk, nv);
    else
      stage_qkv<scalar_t, false>(q_s, k_s, v_s, kp, p.JB, q + t0 * p.sq.t, k + t0 * p.sk.t, v + t0 * p.sv.t,
                                 p.sq.t, p.sq.d, p.sk.t, p.sk.d, p.sv.t, p.sv.d, tc, p.Dk, nv);
    __syncthreads();
    if (warp_active)
      run_steps<scalar_t, R, G>(S, q_s + i0, k_s + i0, v_s + col, g_s, b_s, y + t0 * p.sy.t, p.sy.t, tc, kp, p.JB,
                                rows, lane == 0 && col < nv);
  }
  if (p.s_out != nullptr && owner)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < rows) p.s_out[b * p.sso.b + h * p.sso.h + (i0 + r) * p.sso.i + (j0 + col) * p.sso.j] = S[r];
}

// ===================================== section: chunk_v1 kernel =============================
// Chunkwise-parallel form. Within a chunk of C steps starting from state S (t, s in 0..C-1):
//   L[t][s] = prod_{r=s+1..t} g_r (s <= t),  A[t] = prod_{r=0..t} g_r,  w[s] = prod_{r=s+1..C-1} g_r
//   y_t   = sum_{s<=t} L[t][s] beta_s (q_t . k_s) v_s  +  (A[t] q_t)^T S
//   S_new = A[C-1] S + sum_s (w[s] beta_s k_s) v_s^T
// Decays are direct products of gates (never logs or quotients), so gates of 0, < 0 or > 1 are exact.
// Matrix products run on TF32 tensor cores (wmma m16n16k8); for fp32 inputs every operand is split
// into hi + lo TF32 parts and three products are summed (3xTF32, ~fp32 accuracy; see Strip::split).
// The diagonal 16x16 blocks of the masked product use fp32 FMAs: a zero mask entry times a NaN or
// inf v_s (s > t) would otherwise reach y_t, which the reference never lets happen.
// Grid: one block per (b, h, segment, column tile of NV state columns); a block walks the chunks of
// its segment in order, with its Dk x NV slice of S in shared memory.
namespace wm = nvcuda::wmma;

// A strip of up to N 16x16 output tiles that share their A operand (one 16-row block): per k-step
// the A fragment is loaded (and split) once and reused for every tile, and the N tiles' products are
// independent, so their tensor-core latencies overlap. With SPLIT (3xTF32), hi*hi goes to `hi` and
// the two cross terms to `lo`, two dependency chains per tile; store() adds them.
template <bool SPLIT, typename LA, typename LB, int N>
struct Strip {
  using Acc = wm::fragment<wm::accumulator, 16, 16, 8, float>;
  Acc hi[N], lo[N];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int n = 0; n < N; ++n) { wm::fill_fragment(hi[n], 0.f); wm::fill_fragment(lo[n], 0.f); }
  }
  // c[n] = scale * (row-major tile at c + n * 16); lo = 0.
  __device__ __forceinline__ void load(const float* c, unsigned ldc, float scale, int cnt) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      wm::fill_fragment(lo[n], 0.f);
      if (n < cnt) {
        wm::load_matrix_sync(hi[n], c + n * 16, ldc, wm::mem_row_major);
#pragma unroll
        for (int i = 0; i < hi[n].num_elements; ++i) hi[n].x[i] *= scale;
      }
    }
  }
  // x = hi + lo with hi = x truncated to TF32's 10 mantissa bits (exact) and lo = x - hi (exact). The
  // tensor cores read the top 19 bits of each operand, so lo is truncated there too: the error of a
  // product is ~2^-20 relative, and no conversion instructions are spent (__float_to_tf32 compiled
  // to five instructions per element). Without SPLIT the operands go in as they are (truncated).
  template <typename F>
  __device__ __forceinline__ static void split(F& hi, F& lo) {
#pragma unroll
    for (int i = 0; i < hi.num_elements; ++i) {
      const float x = hi.x[i], h = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
      hi.x[i] = h;
      lo.x[i] = x - h;
    }
  }
  // One k-step of 8: A (16 x 8) at a; B (8 x 16) of tile n at b + n * bstep.
  __device__ __forceinline__ void step(const float* a, unsigned lda, const float* b, int bstep, unsigned ldb, int cnt) {
    wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, LA> a_hi, a_lo;
    wm::load_matrix_sync(a_hi, a, lda);
    if constexpr (SPLIT) split(a_hi, a_lo);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      if (n >= cnt) continue;
      wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, LB> b_hi, b_lo;
      wm::load_matrix_sync(b_hi, b + n * bstep, ldb);
      if constexpr (SPLIT) split(b_hi, b_lo);
      if constexpr (SPLIT) {
        wm::mma_sync(lo[n], a_lo, b_hi, lo[n]);
        wm::mma_sync(lo[n], a_hi, b_lo, lo[n]);
      }
      wm::mma_sync(hi[n], a_hi, b_hi, hi[n]);
    }
  }
  __device__ __forceinline__ void store(float* c, int cstep, unsigned ldc, int cnt) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      if (n >= cnt) continue;
      if constexpr (SPLIT) {
#pragma unroll
        for (int i = 0; i < hi[n].num_elements; ++i) hi[n].x[i] += lo[n].x[i];
      }
      wm::store_matrix_sync(c + n * cstep, hi[n], ldc, wm::mem_row_major);
    }
  }
};

// rows x cols (cols a multiple of V) of a strided source into dst (pitch ld) as float; zero outside
// rows_valid x cols_valid. V > 1: 16-byte loads (the caller checked alignment and cols_valid % V == 0).
// U jobs per thread are in flight at once.
// Returns whether any staged value is NaN or inf (this thread's share).
template <typename scalar_t, int V, int U = 8>
__device__ __forceinline__ bool load_tile(float* dst, int ld, const scalar_t* __restrict__ src, int64_t st,
                                          int64_t sd, int rows_valid, int cols_valid, int rows, int cols) {
  using Job = Chunk<scalar_t, (V > 1)>;
  bool nonfinite = false;
  const int per_row = cols / V, total = rows * per_row;
  for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
    Job buf[U];
    int off[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * blockDim.x;
      off[u] = -1;
      if (e < total) {
        const int r = e / per_row, c = (e - r * per_row) * V;
        off[u] = r * ld + c;
        if (r < rows_valid && c < cols_valid) {
          const scalar_t* s = src + r * st + c * sd;
          if constexpr (V > 1) buf[u].u.raw = __ldg(reinterpret_cast<const uint4*>(s));
          else buf[u].u.x[0] = s[0];
        } else {
          buf[u].u.raw = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (off[u] >= 0) {
#pragma unroll
        for (int i = 0; i < Job::V; ++i) {
          const float x = to_float(buf[u].u.x[i]);
          nonfinite |= !(fabsf(x) <= 3.4028235e38f);
          dst[off[u] + i] = x;
        }
      }
  }
  return nonfinite;
}

template <typename scalar_t>
__device__ __forceinline__ bool load_tile_any(bool vec, float* dst, int ld, const scalar_t* src, int64_t st,
                                              int64_t sd, int rows_valid, int cols_valid, int rows, int cols) {
  constexpr int V = 16 / (int)sizeof(scalar_t);
  if (vec) return load_tile<scalar_t, V>(dst, ld, src, st, sd, rows_valid, cols_valid, rows, cols);
  return load_tile<scalar_t, 1>(dst, ld, src, st, sd, rows_valid, cols_valid, rows, cols);
}

// L[t][s] for s <= t from the in-block prefix (pin) and suffix (sout) products of 16-step blocks.
__device__ __forceinline__ float pair_decay(const float* g, const float* pin, const float* sout, int t, int s) {
  const int bt = t >> 4, bs = s >> 4;
  float a = 1.f;
  if (bt == bs) {
    const int r0 = t & ~15;
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if (r0 + r > s && r0 + r <= t) a *= g[r0 + r];
    return a;
  }
  a = pin[t] * sout[s];
  for (int m = bs + 1; m < bt; ++m) a *= pin[16 * m + 15];
  return a;
}

// ---- what both chunk kernels share: the block's coordinates and pointers, its starting state, the
// staging of one chunk, and where the state goes at the end.
template <typename scalar_t>
struct ChunkBlock {
  int vt, seg, h, b, j0, nv;
  int64_t bh;
  const scalar_t *q, *k, *v, *gate, *beta;
  scalar_t* y;
  // Grid: one block per (b, h, segment, column tile of NV state columns), the column tile fastest.
  __device__ __forceinline__ ChunkBlock(const ChunkParams& p, int NV) {
    int blk = blockIdx.x;
    vt = blk % p.vtiles;
    blk /= p.vtiles;
    seg = blk % p.seg_launch;
    blk /= p.seg_launch;
    h = blk % p.H;
    b = blk / p.H;
    j0 = vt * NV;
    nv = min(NV, p.Dv - j0);
    bh = (int64_t)b * p.H + h;
    q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + h * p.sq.h;
    k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + h * p.sk.h;
    v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + h * p.sv.h + j0 * p.sv.d;
    gate = static_cast<const scalar_t*>(p.gate) + b * p.sg.b + h * p.sg.h;
    beta = static_cast<const scalar_t*>(p.beta) + b * p.sb.b + h * p.sb.h;
    y = static_cast<scalar_t*>(p.y) + b * p.sy.b + h * p.sy.h + j0 * p.sy.d;
  }
  __device__ __forceinline__ float* segment_state(const ChunkParams& p, int s) const {
    return p.seg_states + (bh * (p.nseg - 1) + s) * ((int64_t)p.Dk * p.Dv);
  }
};

// A block's state slice in shared memory: fp32 at pitch ld (chunk_v1, chunk_v2), or as the bf16 pair hi + lo
// (chunk_v3; set() splits, get() sums).
struct StateF32 {
  float* s; int ld;
  __device__ __forceinline__ void set(int i, int j, float x) const { s[i * ld + j] = x; }
  __device__ __forceinline__ float get(int i, int j) const { return s[i * ld + j]; }
};
struct StateSplit {
  __nv_bfloat16 *hi, *lo; int ld;
  __device__ __forceinline__ void set(int i, int j, float x) const {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    const float d = x - __bfloat162float(h);
    hi[i * ld + j] = h;
    lo[i * ld + j] = __float2bfloat16_rn(d == d ? d : 0.f);  // as split_bf16x2
  }
  __device__ __forceinline__ float get(int i, int j) const {
    return __bfloat162float(hi[i * ld + j]) + __bfloat162float(lo[i * ld + j]);
  }
};

// The state slice (DKP x NV) at the segment's start: the caller's initial state (segment 0 of the output
// phase), the scanned end state of the previous segment, or zero (the state phase computes each
// segment's own contribution).
template <typename scalar_t, typename State>
__device__ __forceinline__ void init_state(const State& st, int DKP, int NV, const ChunkParams& p,
                                           const ChunkBlock<scalar_t>& cb) {
  const float* s0 = nullptr;
  StateStrides s0s{0, 0, 0, 0};
  if (p.mode == 0 && cb.seg == 0) {
    s0 = p.s_in; s0s = p.ssi;
  } else if (p.mode == 0) {
    s0 = cb.segment_state(p, cb.seg - 1);
    s0s = {0, 0, p.Dv, 1};
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int i = warp; i < DKP; i += warps)
    for (int j = lane; j < NV; j += 32) {
      float x = 0.f;
      if (s0 != nullptr && i < p.Dk && j < cb.nv) x = s0[cb.b * s0s.b + cb.h * s0s.h + i * s0s.i + (cb.j0 + j) * s0s.j];
      st.set(i, j, x);
    }
}

// After the last chunk: the final state (last segment of the output phase), or the segment's own
// contribution and gate product (state phase).
template <typename scalar_t, typename State>
__device__ __forceinline__ void leave_state(const State& st, const ChunkParams& p, const ChunkBlock<scalar_t>& cb,
                                            float seg_decay) {
  float* dst = nullptr;
  StateStrides ds{0, 0, 0, 0};
  if (p.mode == 0 && cb.seg == p.nseg - 1 && p.s_out != nullptr) {
    dst = p.s_out; ds = p.sso;
  } else if (p.mode != 0) {
    dst = cb.segment_state(p, cb.seg);
    ds = {0, 0, p.Dv, 1};
    if (cb.vt == 0 && threadIdx.x == 0) p.seg_decays[cb.bh * (p.nseg - 1) + cb.seg] = seg_decay;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (dst != nullptr)
    for (int i = warp; i < p.Dk; i += warps)
      for (int j = lane; j < cb.nv; j += 32) dst[cb.b * ds.b + cb.h * ds.h + i * ds.i + (cb.j0 + j) * ds.j] = st.get(i, j);
}

// A ROWS x COLS tile (compile-time) of a source with unit column stride and 16-byte aligned rows,
// held in registers between load() and store(): a caller issues every tile's loads before the first
// store, so a chunk waits for one memory round trip, not one per tile. Zero outside
// rows_valid x cols_valid (cols_valid a multiple of 16 bytes' worth).
template <typename scalar_t, int ROWS, int COLS>
struct TileRegs {
  static constexpr int V = 16 / (int)sizeof(scalar_t), PER_ROW = COLS / V, TOTAL = ROWS * PER_ROW;
  static constexpr int N = (TOTAL + kMaxThreads - 1) / kMaxThreads;
  uint4 buf[N];
  __device__ __forceinline__ void load(const scalar_t* __restrict__ src, int64_t st, int rows_valid, int cols_valid) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, r = e / PER_ROW, c = (e % PER_ROW) * V;
      buf[u] = make_uint4(0u, 0u, 0u, 0u);
      if (e < TOTAL && r < rows_valid && c < cols_valid) buf[u] = __ldg(reinterpret_cast<const uint4*>(src + r * st + c));
    }
  }
  // As float at pitch ld (a multiple of 4); returns whether a stored value is NaN or inf (CHECK only).
  template <bool CHECK>
  __device__ __forceinline__ bool store(float* dst, int ld) const {
    bool bad = false;
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, r = e / PER_ROW, c = (e % PER_ROW) * V;
      if (TOTAL % kMaxThreads == 0 || e < TOTAL) {
        union { uint4 raw; scalar_t x[V]; } w;
        w.raw = buf[u];
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float4 f = make_float4(to_float(w.x[i]), to_float(w.x[i + 1]), to_float(w.x[i + 2]), to_float(w.x[i + 3]));
          // Each value compared on its own: fmaxf drops a NaN operand (measured: NaN in v went unnoticed).
          constexpr float M = 3.4028235e38f;
          if (CHECK) bad |= !(fabsf(f.x) <= M && fabsf(f.y) <= M && fabsf(f.z) <= M && fabsf(f.w) <= M);
          *reinterpret_cast<float4*>(dst + r * ld + c + i) = f;
        }
      }
    }
    return bad;
  }
};

// Steps [t0, t0 + tc) into shared memory: k (and q with outputs) as C x DKP, v as C x NV; gate and
// beta of step threadIdx.x into registers (1 and 0 past the end). Returns whether this thread saw a
// non-finite v. DK > 0 (D_k padded, compile-time; the launcher sends it only inputs whose rows are
// 16-byte aligned) issues all of a chunk's loads before the first store (TileRegs).
template <typename scalar_t, int DK = 0, int NVT = 0>
__device__ __forceinline__ bool stage_chunk(float* Qs, float* Ks, int ldk, float* Vs, int ldv, int C, int DKP,
                                            int NV, const ChunkParams& p, const ChunkBlock<scalar_t>& cb, int t0,
                                            int tc, float& g_reg, float& b_reg) {
  g_reg = 1.f;
  b_reg = 0.f;
  if ((int)threadIdx.x < tc) {  // issued first: in flight while the tiles load
    g_reg = to_float(cb.gate[(int64_t)(t0 + threadIdx.x) * p.sg.t]);
    b_reg = to_float(cb.beta[(int64_t)(t0 + threadIdx.x) * p.sb.t]);
  }
  if constexpr (DK > 0) {
    TileRegs<scalar_t, 32, DK> kr, qr;
    TileRegs<scalar_t, 32, NVT> vr;
    kr.load(cb.k + (int64_t)t0 * p.sk.t, p.sk.t, tc, p.Dk);
    if (p.mode == 0) qr.load(cb.q + (int64_t)t0 * p.sq.t, p.sq.t, tc, p.Dk);
    vr.load(cb.v + (int64_t)t0 * p.sv.t, p.sv.t, tc, cb.nv);
    kr.template store<false>(Ks, ldk);
    if (p.mode == 0) qr.template store<false>(Qs, ldk);
    return vr.template store<true>(Vs, ldv);
  } else {
    load_tile_any<scalar_t>(p.vec_qk, Ks, ldk, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, p.sk.d, tc, p.Dk, C, DKP);
    if (p.mode == 0)
      load_tile_any<scalar_t>(p.vec_qk, Qs, ldk, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, tc, p.Dk, C, DKP);
    return load_tile_any<scalar_t>(p.vec_v, Vs, ldv, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, p.sv.d, tc, cb.nv, C, NV);
  }
}

// y for steps [t0, t0 + tc) from the staged Ys; with `diagonal`, plus the diagonal 16x16 blocks of
// the masked product in fp32 FMAs (s <= t only: a masked zero never meets a non-finite v). VEC (y's
// rows 16-byte aligned, unit column stride): without the diagonal, 16 bytes a store.
template <typename scalar_t, int C, int NV, bool VEC>
__device__ __forceinline__ void write_y(scalar_t* y, const ChunkParams& p, const float* Ys, int ldv, const float* Ps,
                                        int ldc, const float* Vs, int t0, int tc, int nv, bool diagonal) {
  if (VEC && !diagonal) {
    constexpr int V = 16 / (int)sizeof(scalar_t), PER_ROW = NV / V, N = (C * PER_ROW + kMaxThreads - 1) / kMaxThreads;
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, t = e / PER_ROW, j = (e % PER_ROW) * V;
      if (t < tc && j < nv) {  // t < tc also bounds e
        union { uint4 raw; scalar_t x[V]; } w;
#pragma unroll
        for (int i = 0; i < V; ++i) w.x[i] = from_float<scalar_t>(Ys[t * ldv + j + i]);
        *reinterpret_cast<uint4*>(y + (int64_t)(t0 + t) * p.sy.t + j) = w.raw;
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < C * NV; e += blockDim.x) {
    const int t = e / NV, j = e % NV;
    float acc = Ys[t * ldv + j];
    if (diagonal) {
      const int s0d = t & ~15;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (s0d + r <= t) acc = fmaf(Ps[t * ldc + s0d + r], Vs[(s0d + r) * ldv + j], acc);
    }
    if (t < tc && j < nv) y[(int64_t)(t0 + t) * p.sy.t + j * p.sy.d] = from_float<scalar_t>(acc);
  }
}

template <typename scalar_t, int C, int NV>
__global__ void __launch_bounds__(kMaxThreads, C == 32 ? 2 : 1) chunk_v1_kernel(const ChunkParams p) {
  constexpr bool SPLIT = std::is_same<scalar_t, float>::value;
  // Pitches: 4 mod 32 floats for operands read as row-major A or col-major B (q, k, P), 8 mod 32 for
  // row-major B (v, S): the fragment loads then hit 32 different banks.
  constexpr int NB = C / 16, NT = NV / 16, LDV = NV + 8, LDC = C + 4, WARPS = kMaxThreads / 32;
  using Row = wm::row_major;
  using Col = wm::col_major;
  extern __shared__ __align__(128) float chunk_buf[];
  const int DKP = p.DKP, LDK = DKP + 4;
  float* Qs = chunk_buf;         // C x LDK: q, then A[t] q_t
  float* Ks = Qs + C * LDK;      // C x LDK: k, then w[s] beta_s k_s
  float* Vs = Ks + C * LDK;      // C x LDV
  float* Ys = Vs + C * LDV;      // C x LDV
  float* Ss = Ys + C * LDV;      // DKP x LDV: the state slice
  float* Ps = Ss + DKP * LDV;    // C x LDC: q_t . k_s, then masked and decayed
  float* gs = Ps + C * LDC;      // gates (1 past the end of the sequence)
  float* bs = gs + C;            // betas (0 past the end)
  float* pin = bs + C;           // prod g[16*(t/16) .. t]
  float* sout = pin + C;         // prod g[s+1 .. 16*(s/16)+15]
  float* rowd = sout + C;        // A[t]
  float* kscale = rowd + C;      // w[s] beta_s

  const bool outputs = p.mode == 0;
  const ChunkBlock<scalar_t> cb(p, NV);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nv = cb.nv;
  scalar_t* y = cb.y;
  init_state(StateF32{Ss, LDV}, DKP, NV, p, cb);
  float seg_decay = 1.f;

  // Warp roles in the three matrix phases (strips of tiles that share their A rows):
  //   P = Q K^T:  row block pb, tiles pq0, pq0 + PW, ... <= pb (on or below the diagonal)
  //   Y:          row block yb, column tiles yn0 .. yn0 + YN - 1
  //   S update:   row block of S and column tiles, sn per strip
  constexpr int PW = WARPS / NB;                 // warps per row block of P
  const int pb = warp / PW, pq0 = warp % PW;
  const int p_cnt = (pb < NB && pq0 <= pb) ? (pb - pq0) / PW + 1 : 0;
  constexpr int YN = (NB * NT >= WARPS) ? (NB * NT) / WARPS : 1;
  constexpr int YW = NT / YN;                    // warps per row block of Y
  const int yb = warp / YW, yn0 = (warp % YW) * YN;
  const int s_fill = (DKP / 16) * NT / WARPS;   // tiles per warp if all warps share the S update
  const int sn = min(NT, s_fill >= 4 ? 4 : s_fill >= 2 ? 2 : 1);  // tiles per S strip, divides NT
  const int s_strips = (DKP / 16) * (NT / sn);

  const int c_begin = cb.seg * p.seg_chunks;
  const int c_end = min(c_begin + p.seg_chunks, (p.T + C - 1) / C);
  for (int ch = c_begin; ch < c_end; ++ch) {
    const int t0 = ch * C, tc = min(C, p.T - t0);
    // ---- stage the chunk (barrier B5 of the previous chunk, or the state init, came before)
    float g_reg, b_reg;
    stage_chunk(Qs, Ks, LDK, Vs, LDV, C, DKP, NV, p, cb, t0, tc, g_reg, b_reg);
    if (tid < C) { gs[tid] = g_reg; bs[tid] = b_reg; }
    __syncthreads();  // B1

    // ---- decays: one unrolled pass over the gates per step (threads 0..C-1, warps that get the
    // fewest P tiles), while the other warps start on q . k
    if (tid < C) {
      const int t = tid, b16 = t & ~15;
      float in_blk = 1.f, after_blk = 1.f, upto = 1.f, after = bs[t];
#pragma unroll
      for (int r = 0; r < C; ++r) {
        const float g = gs[r];
        if (r <= t) upto *= g;
        if (r > t) after *= g;
        if (r >= b16 && r <= t) in_blk *= g;
        if (r > t && r < b16 + 16) after_blk *= g;
      }
      pin[t] = in_blk; sout[t] = after_blk; rowd[t] = upto; kscale[t] = after;
    }
    if (outputs && p_cnt > 0) {  // P = Q K^T on the tiles on or below the diagonal
      Strip<SPLIT, Row, Col, (NB + PW - 1) / PW> st;
      st.zero();
      for (int kk = 0; kk < DKP; kk += 8)
        st.step(Qs + pb * 16 * LDK + kk, LDK, Ks + pq0 * 16 * LDK + kk, PW * 16 * LDK, LDK, p_cnt);
      st.store(Ps + pb * 16 * LDC + pq0 * 16, PW * 16, LDC, p_cnt);
    }
    __syncthreads();  // B2

    // ---- mask and decay P, scale q rows by A[t] and k rows by w[s] beta_s
    if (outputs) {
      for (int e = tid; e < C * C; e += blockDim.x) {
        const int t = e / C, s = e % C;  // C is a power of two
        if (s <= t) Ps[t * LDC + s] *= pair_decay(gs, pin, sout, t, s) * bs[s];
      }
      for (int t = warp; t < C; t += WARPS) {
        const float a = rowd[t];
        for (int i = lane; i < DKP; i += 32) Qs[t * LDK + i] *= a;
      }
    }
    for (int s = warp; s < C; s += WARPS) {
      const float w = kscale[s];
      for (int i = lane; i < DKP; i += 32) Ks[s * LDK + i] *= w;
    }
    const float chunk_decay = rowd[C - 1];
    seg_decay *= chunk_decay;
    __syncthreads();  // B3

    // ---- Y = (masked P below the diagonal blocks) V + (A q) S, on tensor cores
    if (outputs) {
      if (yb < NB) {
        Strip<SPLIT, Row, Row, YN> st;
        st.zero();
        for (int s0k = 0; s0k < yb * 16; s0k += 8)
          st.step(Ps + yb * 16 * LDC + s0k, LDC, Vs + s0k * LDV + yn0 * 16, 16, LDV, YN);
        for (int kk = 0; kk < DKP; kk += 8)
          st.step(Qs + yb * 16 * LDK + kk, LDK, Ss + kk * LDV + yn0 * 16, 16, LDV, YN);
        st.store(Ys + yb * 16 * LDV + yn0 * 16, 16, LDV, YN);
      }
      __syncthreads();  // B4: every read of the old S is done
    }

    // ---- S = A[C-1] S + (w beta k)^T V
    for (int strip = warp; strip < s_strips; strip += WARPS) {
      const int mi = strip / (NT / sn), n0 = (strip % (NT / sn)) * sn;
      float* sp = Ss + mi * 16 * LDV + n0 * 16;
      Strip<SPLIT, Col, Row, NT> st;
      st.load(sp, LDV, chunk_decay, sn);
      for (int s0k = 0; s0k < tc; s0k += 8)
        st.step(Ks + s0k * LDK + mi * 16, LDK, Vs + s0k * LDV + n0 * 16, 16, LDV, sn);
      st.store(sp, 16, LDV, sn);
    }

    // ---- diagonal blocks in fp32 (s <= t only), then y
    if (outputs) write_y<scalar_t, C, NV, false>(y, p, Ys, LDV, Ps, LDC, Vs, t0, tc, nv, true);
    __syncthreads();  // B5
  }

  leave_state(StateF32{Ss, LDV}, p, cb, seg_decay);
}

// ===================================== section: chunk_v2 kernel =============================
// The chunkwise form of chunk_v1 with C = 32, on raw mma.sync m16n8k8 TF32 instead of wmma: wmma's
// tf32 fragment loads compile to generic 64-bit loads even from shared memory, and __float_to_tf32
// to five instructions per element. Here fragments are loaded with plain shared loads in the
// documented layouts (g = lane / 4, q = lane % 4):
//   A 16x8: a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4);  B 8x8: b0 (q, g), b1 (q+4, g);
//   C 16x8: c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1).
// Knowing the accumulator layout, the mask, the decays and beta are applied to P in registers, the
// decayed q rows become a scale of the (q S) accumulator rows, and w[s] beta_s scales the k' fragment
// as it is loaded, so no pass over shared memory rescales anything. The gates' products come from
// warp shuffles (prefix, suffix and in-block products). The diagonal 16x16 blocks of the masked
// product go through the tensor cores unless the chunk's v holds a NaN or inf (then fp32 FMAs, as
// in chunk_v1, so that a masked zero never meets it).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// hi = x rounded to TF32 (adding half a TF32 ulp to the bit pattern and clearing the 13 low bits
// rounds the magnitude to nearest: two integer instructions where __float_to_tf32 takes five);
// lo = x - hi (exact) as raw fp32 bits, which the tensor core truncates to TF32. Truncating hi
// instead (chunk_v1's Strip::split) doubled the error: rel-L2 1.02e-5 with gates of 1.02 over 300
// steps, over the 1e-5 bound. NaN survives in lo: CUDA's NaN 0x7fffffff plus half an ulp carries into
// the sign bit (hi = -0), but x - hi is NaN again; rounding lo too would lose it (measured).
__device__ __forceinline__ uint32_t round_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

template <int N>
__device__ __forceinline__ void split_tf32(const float (&x)[N], uint32_t (&hi)[N], uint32_t (&lo)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hi[i] = round_tf32(x[i]);
    lo[i] = __float_as_uint(x[i] - __uint_as_float(hi[i]));
  }
}

// d += a b with fp32-level accuracy (SPLIT: lo*hi + hi*lo + hi*hi) or one TF32 product.
template <bool SPLIT>
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const float (&b)[2]) {
  uint32_t bh[2], bl[2];
  if constexpr (SPLIT) {
    split_tf32<2>(b, bh, bl);
    mma_tf32(d, al, bh);
    mma_tf32(d, ah, bl);
  } else {
    bh[0] = __float_as_uint(b[0]); bh[1] = __float_as_uint(b[1]);
  }
  mma_tf32(d, ah, bh);
}

template <bool SPLIT>
__device__ __forceinline__ void prep_a(const float (&a)[4], uint32_t (&ah)[4], uint32_t (&al)[4]) {
  if constexpr (SPLIT) {
    split_tf32<4>(a, ah, al);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) { ah[i] = __float_as_uint(a[i]); al[i] = 0u; }
  }
}

// Four 8x4 fp32 tiles of shared memory in one instruction: to ldmatrix each is an 8x8 b16 matrix, and
// lane l receives element (l / 4, l % 4) of tile i in r[i], the mma fragment layout. `row` is this
// lane's address: row l % 8 of tile l / 8 (16-byte aligned). A quarter of the shared-load
// instructions of four scalar loads per tile (the bf16 kernel was MIO-throttled on them, ncu).
// TRANS: each 8x8 b16 tile transposed (lane l receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)).
template <bool TRANS = false>
__device__ __forceinline__ void ldm4(uint32_t (&r)[4], const void* row) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldm_x4(float (&r)[4], const float* row) {
  uint32_t x[4];
  ldm4(x, row);
  r[0] = __uint_as_float(x[0]); r[1] = __uint_as_float(x[1]); r[2] = __uint_as_float(x[2]); r[3] = __uint_as_float(x[3]);
}

// 16x8 A fragment at A (row-major, pitch ld a multiple of 4, A 16-byte aligned): tiles rows 0-7 /
// 8-15 by columns 0-3 / 4-7 give a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4).
__device__ __forceinline__ void frag_a(float (&a)[4], const float* A, int ld, int g, int q) {
  const int lane = 4 * g + q;
  ldm_x4(a, A + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 4);
}

// acc[n] += A (16 x kend, row-major at a, pitch lda) times B (kend x 8, row-major at b + n * 8, pitch ldb).
template <bool SPLIT, int N>
__device__ __forceinline__ void row_strip(float (&acc)[N][4], const float* a, int lda, const float* b, int ldb,
                                          int kend, int g, int q4) {
#pragma unroll
  for (int k0 = 0; k0 < kend; k0 += 8) {
    float af[4];
    uint32_t ah[4], al[4];
    frag_a(af, a + k0, lda, g, q4);
    prep_a<SPLIT>(af, ah, al);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float* bp = b + k0 * ldb + n * 8 + g;
      const float bb[2] = {bp[q4 * ldb], bp[(q4 + 4) * ldb]};
      mma3<SPLIT>(acc[n], ah, al, bb);
    }
  }
}

// One warp's strip of S: rows 16 (at sp, pitch ldv) x N tiles of 8 columns.
// S = decay * S + sum_s (kscale[s] k_s)^T v_s over the chunk's 32 steps (staged as zeros, with
// kscale 0, past the end of the sequence); kc: k at this row block.
template <bool SPLIT, int N>
__device__ __forceinline__ void s_update_strip(float* sp, int ldv, const float* kc, int ldk, const float* vc,
                                               const float* kscale, float decay, int g, int q4) {
  float acc[N][4];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const float2 lo2 = *reinterpret_cast<const float2*>(sp + g * ldv + n * 8 + 2 * q4);
    const float2 hi2 = *reinterpret_cast<const float2*>(sp + (g + 8) * ldv + n * 8 + 2 * q4);
    acc[n][0] = lo2.x * decay; acc[n][1] = lo2.y * decay; acc[n][2] = hi2.x * decay; acc[n][3] = hi2.y * decay;
  }
#pragma unroll
  for (int s0k = 0; s0k < 32; s0k += 8) {
    const float w0 = kscale[s0k + q4], w1 = kscale[s0k + q4 + 4];
    const float* k0 = kc + (s0k + q4) * ldk + g;
    const float* k1 = kc + (s0k + q4 + 4) * ldk + g;
    const float a[4] = {k0[0] * w0, k0[8] * w0, k1[0] * w1, k1[8] * w1};
    uint32_t ah[4], al[4];
    prep_a<SPLIT>(a, ah, al);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float* bv = vc + s0k * ldv + n * 8 + g;
      const float bb[2] = {bv[q4 * ldv], bv[(q4 + 4) * ldv]};
      mma3<SPLIT>(acc[n], ah, al, bb);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    *reinterpret_cast<float2*>(sp + g * ldv + n * 8 + 2 * q4) = make_float2(acc[n][0], acc[n][1]);
    *reinterpret_cast<float2*>(sp + (g + 8) * ldv + n * 8 + 2 * q4) = make_float2(acc[n][2], acc[n][3]);
  }
}

// Gate products of one chunk, on warp 0 (lane t holds step t's gate g_reg and beta b_reg; 1 and 0 past
// the end): rowd[t] = prod g[0..t], kscale[s] = beta_s prod g[s+1..31], the in-block prefix (pin) and
// suffix (sout) products of 16-step blocks, beta (bsm), and ltab[t][s % 16] = prod g[s+1..t] within a block.
__device__ __forceinline__ void chunk_gate_products(float g_reg, float b_reg, int lane, float* rowd, float* kscale,
                                                    float* pin, float* sout, float* bsm, float* ltab) {
  const unsigned full = 0xffffffffu;
  float pre = g_reg, suf = g_reg, bpre = g_reg, bsuf = g_reg;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float x = __shfl_up_sync(full, pre, off), z = __shfl_down_sync(full, suf, off);
    if (lane >= off) pre *= x;
    if (lane + off < 32) suf *= z;
    if (off < 16) {
      const float x2 = __shfl_up_sync(full, bpre, off), z2 = __shfl_down_sync(full, bsuf, off);
      if ((lane & 15) >= off) bpre *= x2;
      if ((lane & 15) + off < 16) bsuf *= z2;
    }
  }
  const float suf_ex = __shfl_down_sync(full, suf, 1), bsuf_ex = __shfl_down_sync(full, bsuf, 1);
  rowd[lane] = pre;
  kscale[lane] = b_reg * (lane == 31 ? 1.f : suf_ex);
  pin[lane] = bpre;
  sout[lane] = (lane & 15) == 15 ? 1.f : bsuf_ex;
  bsm[lane] = b_reg;
  const int base = lane & ~15, sl = lane & 15;  // lane = column s of its 16-block
  float run = 1.f;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const float gt = __shfl_sync(full, g_reg, base + r);
    if (r > sl) run *= gt;
    ltab[(base + r) * 16 + sl] = r >= sl ? run : 0.f;
  }
}

// Entry (t, s) of the masked, decayed, beta-weighted product from its q . k accumulator d: zero above
// the diagonal (selected, not multiplied: a NaN in q . k must not leak into a masked entry).
__device__ __forceinline__ float masked_entry(float d, int t, int s, const float* ltab, const float* pin,
                                              const float* sout, const float* bsm) {
  if (s > t) return 0.f;
  return d * (((t >> 4) == (s >> 4) ? ltab[t * 16 + (s & 15)] : pin[t] * sout[s]) * bsm[s]);
}

// Strips per row block of S in the S update: as many as the warps allow (a power of two <= NT8).
__host__ __device__ constexpr int s_splits(int MI, int NT8, int warps) {
  int ssplit = 1;
  while (ssplit * 2 <= NT8 && MI * ssplit * 2 <= warps) ssplit *= 2;
  return ssplit;
}

// DK: D_k padded to 16 as a compile-time constant (every loop unrolls), or 0 for any D_k at run time.
template <typename scalar_t, int NV, int DK>
__global__ void __launch_bounds__(kMaxThreads, 2) chunk_v2_kernel(const ChunkParams p) {
  constexpr int C = 32, WARPS = kMaxThreads / 32, NT8 = NV / 8, YN = NV / 32;
  constexpr bool SPLIT = std::is_same<scalar_t, float>::value;
  constexpr int LDV = NV + 8, LDC = C + 4;
  extern __shared__ __align__(128) float chunk2_buf[];
  const int DKP = DK > 0 ? DK : p.DKP, LDK = DKP + 4;
  float* Qs = chunk2_buf;        // C x LDK
  float* Ks = Qs + C * LDK;      // C x LDK
  float* Vs = Ks + C * LDK;      // C x LDV
  float* Ys = Vs + C * LDV;      // C x LDV
  float* Ss = Ys + C * LDV;      // DKP x LDV
  float* Ps = Ss + DKP * LDV;    // C x LDC: masked, decayed, beta-weighted q . k
  float* rowd = Ps + C * LDC;    // A[t] = prod g[0..t]
  float* kscale = rowd + C;      // w[s] beta_s, w[s] = prod g[s+1..C-1]
  float* pin = kscale + C;       // prod g[16*(t/16) .. t]
  float* sout = pin + C;         // prod g[s+1 .. 16*(s/16)+15]
  float* bsm = sout + C;         // beta
  float* ltab = bsm + C;         // [t][s % 16]: prod g[s+1..t] for s <= t in one 16-block

  // The output phase after state_scan_v1 starts early (pdl): it waits here for the scanned states.
  griddep_wait();
  griddep_launch();
  const bool outputs = p.mode == 0;
  const ChunkBlock<scalar_t> cb(p, NV);
  // The warp index through a shuffle: provably warp-uniform, so the mma.sync under `warp` branches
  // needs no convergence handling (WARPSYNC / ENDCOLLECTIVE stubs in the SASS otherwise).
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int g = lane >> 2, q4 = lane & 3;
  const int nv = cb.nv;
  scalar_t* y = cb.y;
  init_state(StateF32{Ss, LDV}, DKP, NV, p, cb);
  float seg_decay = 1.f;

  // S update: row block mi of S, n-tiles n0 .. n0 + sgn - 1 (of 8 columns), ssplit strips per row block.
  const int MI = DKP / 16, ssplit = s_splits(MI, NT8, WARPS);
  const int sgn = NT8 / ssplit, s_tasks = MI * ssplit;

  const bool keep_state = p.mode != 0 || (cb.seg == p.nseg - 1 && p.s_out != nullptr);
  const int c_begin = cb.seg * p.seg_chunks;
  const int c_end = min(c_begin + p.seg_chunks, (p.T + C - 1) / C);
  for (int ch = c_begin; ch < c_end; ++ch) {
    const int t0 = ch * C, tc = min(C, p.T - t0);
    // ---- stage the chunk
    float g_reg, b_reg;
    const bool v_bad = stage_chunk<scalar_t, DK, NV>(Qs, Ks, LDK, Vs, LDV, C, DKP, NV, p, cb, t0, tc, g_reg, b_reg);

    // ---- gate products by shuffles: lane t of warp 0 holds step t
    if (warp == 0) chunk_gate_products(g_reg, b_reg, lane, rowd, kscale, pin, sout, bsm, ltab);
    const bool vbad = __syncthreads_or(v_bad);  // B1
    const float chunk_decay = rowd[C - 1];
    seg_decay *= chunk_decay;

    if (outputs) {
      // ---- P tiles (16 x 8) on or below the diagonal, masked and decayed in registers
      if (warp < 6) {
        const int pb = warp < 2 ? 0 : 1, pn = warp < 2 ? warp : warp - 2;
        float d[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};  // even / odd k: two chains
        const float* A = Qs + pb * 16 * LDK;
        const float* Bk = Ks + pn * 8 * LDK;
#pragma unroll 4
        for (int kk = 0; kk < DKP; kk += 16) {  // DKP is a multiple of 16
          // B = K^T: rows n of K are its columns, so k's 8 rows x 16 columns are four 8x4 tiles.
          float a[4], a2[4], kb[4];
          ldm_x4(kb, Bk + (lane & 7) * LDK + kk + (lane >> 3) * 4);
          const float bb[2] = {kb[0], kb[1]}, bb2[2] = {kb[2], kb[3]};
          uint32_t ah[4], al[4], ah2[4], al2[4];
          frag_a(a, A + kk, LDK, g, q4);
          frag_a(a2, A + kk + 8, LDK, g, q4);
          prep_a<SPLIT>(a, ah, al);
          prep_a<SPLIT>(a2, ah2, al2);
          mma3<SPLIT>(d, ah, al, bb);
          mma3<SPLIT>(d2, ah2, al2, bb2);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) d[i] += d2[i];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int t = pb * 16 + g + 8 * half;
          const int s = pn * 8 + 2 * q4;
          *reinterpret_cast<float2*>(Ps + t * LDC + s) =
              make_float2(masked_entry(d[2 * half], t, s, ltab, pin, sout, bsm),
                          masked_entry(d[2 * half + 1], t, s + 1, ltab, pin, sout, bsm));
        }
      }
      __syncthreads();  // B2

      // ---- Y = M V + A[t] (q S), staged in Ys
      {
        const int yb = warp >> 2, yn0 = (warp & 3) * YN;
        float mv[YN][4], qs[YN][4];
#pragma unroll
        for (int n = 0; n < YN; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) { mv[n][i] = 0.f; qs[n][i] = 0.f; }
        // The masked product's k range: up to the diagonal block (included unless v is not finite);
        // each range a constant, so the strip unrolls.
        const float* pr = Ps + yb * 16 * LDC;
        const float* vr = Vs + yn0 * 8;
        if (yb + (vbad ? 0 : 1) == 2) row_strip<SPLIT, YN>(mv, pr, LDC, vr, LDV, 32, g, q4);
        else if (yb + (vbad ? 0 : 1) == 1) row_strip<SPLIT, YN>(mv, pr, LDC, vr, LDV, 16, g, q4);
        row_strip<SPLIT, YN>(qs, Qs + yb * 16 * LDK, LDK, Ss + yn0 * 8, LDV, DKP, g, q4);
        const float r0 = rowd[yb * 16 + g], r1 = rowd[yb * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < YN; ++n) {
          const int col = (yn0 + n) * 8 + 2 * q4;
          *reinterpret_cast<float2*>(Ys + (yb * 16 + g) * LDV + col) =
              make_float2(fmaf(r0, qs[n][0], mv[n][0]), fmaf(r0, qs[n][1], mv[n][1]));
          *reinterpret_cast<float2*>(Ys + (yb * 16 + g + 8) * LDV + col) =
              make_float2(fmaf(r1, qs[n][2], mv[n][2]), fmaf(r1, qs[n][3], mv[n][3]));
        }
      }
      __syncthreads();  // B3: Y staged, every read of the old S done
    }

    // ---- S = A[C-1] S + (w beta k)^T V: k' is scaled while its fragment loads (not after the
    // segment's last chunk when nobody reads that state)
    for (int task = warp; task < (ch + 1 < c_end || keep_state ? s_tasks : 0); task += WARPS) {
      const int mi = task / ssplit, n0 = (task - (task / ssplit) * ssplit) * sgn;
      float* sp = Ss + mi * 16 * LDV + n0 * 8;
      const float* kc = Ks + mi * 16;
      const float* vc = Vs + n0 * 8;
      switch (sgn) {  // the strip width as a constant: no per-tile branches between the mma chains
        case 1: s_update_strip<SPLIT, 1>(sp, LDV, kc, LDK, vc, kscale, chunk_decay, g, q4); break;
        case 2: s_update_strip<SPLIT, 2>(sp, LDV, kc, LDK, vc, kscale, chunk_decay, g, q4); break;
        case 4: s_update_strip<SPLIT, 4>(sp, LDV, kc, LDK, vc, kscale, chunk_decay, g, q4); break;
        default: s_update_strip<SPLIT, NT8>(sp, LDV, kc, LDK, vc, kscale, chunk_decay, g, q4); break;
      }
    }

    // ---- y (fp32 FMAs on the diagonal blocks when this chunk's v is not finite)
    if (outputs) {
      write_y<scalar_t, C, NV, (DK > 0)>(y, p, Ys, LDV, Ps, LDC, Vs, t0, tc, nv, vbad);
    }
    __syncthreads();  // B4
  }

  leave_state(StateF32{Ss, LDV}, p, cb, seg_decay);
}

// ===================================== section: chunk_v3 kernel =============================
// chunk_v2's schedule for bf16 inputs on bf16 mma.sync m16n8k16 with fp32 accumulation. q, k and v
// are staged as their raw bf16 values (half of chunk_v2's shared-memory bytes), so each of their
// fragments is one ldmatrix (.trans for v, and for k as the state update's A operand). The fp32
// operands (the masked product P, the state S, the scaled keys w beta k) are split into two bf16
// terms, hi = bf16(x) and lo = bf16(x - hi), 16 significant bits together, each multiplied by an
// exact bf16 input: y's error stays that of its own bf16 rounding, where one bf16 term would add
// about 2^-9 per product. S itself is kept as such a pair (Sh + Sl, 16 significant bits: a rel-L2
// error near 1e-5 in the returned fp32 state, far below y's bf16 rounding), which frees the shared
// memory for two staging buffers. fp16 inputs stay on chunk_v2: TF32 holds fp16 values exactly and has fp32's range, while
// fp16 terms of S and P overflow at 65504 (gates above 1 get there).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x0, x1) as bf16x2 hi and lo, x0 in the low half. lo is 0 where x - hi is NaN (x infinite or NaN,
// which hi already carries): an infinite operand then gives inf, not inf - inf.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  float d0 = x0 - __low2float(h), d1 = x1 - __high2float(h);
  d0 = d0 == d0 ? d0 : 0.f;
  d1 = d1 == d1 ? d1 : 0.f;
  const __nv_bfloat162 l = __floats2bfloat162_rn(d0, d1);
  hi = reinterpret_cast<const uint32_t&>(h);
  lo = reinterpret_cast<const uint32_t&>(l);
}

__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// This lane's row address for an x4 ldmatrix of the 16x16 b16 block at p (pitch ld): tiles (rows 0-7,
// cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15). Plain, that is the row-major A fragment a0..a3;
// transposed, on a row-major k x n block, the B fragments (b0, b1) of n-tiles 0 and 1.
__device__ __forceinline__ const __nv_bfloat16* ldm_row(const __nv_bfloat16* p, int ld, int lane) {
  return p + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
}

// B fragments (k 16 x n 8) of N n-tiles of the row-major bf16 block at p (k rows, pitch ld).
template <int N>
__device__ __forceinline__ void frag_b_kn(uint32_t (&b)[N][2], const __nv_bfloat16* p, int ld, int lane) {
#pragma unroll
  for (int n = 0; n + 1 < N; n += 2) {
    uint32_t r[4];
    ldm4<true>(r, ldm_row(p + n * 8, ld, lane));
    b[n][0] = r[0]; b[n][1] = r[1]; b[n + 1][0] = r[2]; b[n + 1][1] = r[3];
  }
  if constexpr (N % 2 == 1) {  // the last tile alone (tiles 2 and 3 repeat 0 and 1)
    uint32_t r[4];
    ldm4<true>(r, p + (N - 1) * 8 + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld);
    b[N - 1][0] = r[0]; b[N - 1][1] = r[1];
  }
}

// Whether eight bf16 values are all finite (exponent bits not all ones).
__device__ __forceinline__ bool finite16(const uint4& w) {
  bool ok = true;
  const uint32_t x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) ok = ok && (x[i] & 0x7f80u) != 0x7f80u && (x[i] & 0x7f800000u) != 0x7f800000u;
  return ok;
}

// 32 rows x cols of a bf16 source (row stride st, column stride sd) as raw values at pitch ld, zero
// outside rows_valid x cols_valid; 16 bytes a load with `vec` (rows 16-byte aligned, cols_valid a
// multiple of 8). CHECK: returns whether this thread stored a NaN or inf.
template <bool CHECK>
__device__ __forceinline__ bool raw_tile(bool vec, __nv_bfloat16* dst, int ld, const __nv_bfloat16* src, int64_t st,
                                         int64_t sd, int rows_valid, int cols_valid, int cols) {
  bool bad = false;
  if (vec) {
    const int per_row = cols / 8;
    for (int e = threadIdx.x; e < 32 * per_row; e += blockDim.x) {
      const int r = e / per_row, c = (e - r * per_row) * 8;
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows_valid && c < cols_valid) w = __ldg(reinterpret_cast<const uint4*>(src + r * st + c));
      if (CHECK) bad |= !finite16(w);
      *reinterpret_cast<uint4*>(dst + r * ld + c) = w;
    }
  } else {
    for (int e = threadIdx.x; e < 32 * cols; e += blockDim.x) {
      const int r = e / cols, c = e - r * cols;
      __nv_bfloat16 x = __float2bfloat16_rn(0.f);
      if (r < rows_valid && c < cols_valid) x = src[r * st + c * sd];
      if (CHECK) bad |= !(fabsf(__bfloat162float(x)) <= 3.4028235e38f);
      dst[r * ld + c] = x;
    }
  }
  return bad;
}

// stage_chunk for chunk_v3 with D_k at run time: k (and q with outputs) as 32 x DKQ raw bf16 (D_k padded
// to 32), v as 32 x NV, gate and beta into registers.
__device__ __forceinline__ bool stage_chunk_raw(__nv_bfloat16* Qh, __nv_bfloat16* Kh, int ldk, __nv_bfloat16* Vh,
                                                int ldv, int DKQ, int NV, const ChunkParams& p,
                                                const ChunkBlock<__nv_bfloat16>& cb, int t0, int tc, float& g_reg,
                                                float& b_reg) {
  g_reg = 1.f;
  b_reg = 0.f;
  if ((int)threadIdx.x < tc) {
    g_reg = to_float(cb.gate[(int64_t)(t0 + threadIdx.x) * p.sg.t]);
    b_reg = to_float(cb.beta[(int64_t)(t0 + threadIdx.x) * p.sb.t]);
  }
  raw_tile<false>(p.vec_qk, Kh, ldk, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, p.sk.d, tc, p.Dk, DKQ);
  if (p.mode == 0) raw_tile<false>(p.vec_qk, Qh, ldk, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, tc, p.Dk, DKQ);
  return raw_tile<true>(p.vec_v, Vh, ldv, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, p.sv.d, tc, cb.nv, NV);
}

// 16 bytes global -> shared without passing through registers; `valid` false writes zeros (reads nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// A 32 x COLS raw bf16 tile (16-byte aligned rows, unit column stride) by cp.async, zero outside
// rows_valid x cols_valid. This thread copies the 16-byte pieces threadIdx.x + 256 u.
template <int COLS>
__device__ __forceinline__ void tile_async(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src, int64_t st,
                                           int rows_valid, int cols_valid) {
  constexpr int PER_ROW = COLS / 8, TOTAL = 32 * PER_ROW;
#pragma unroll
  for (int e0 = 0; e0 < TOTAL; e0 += kMaxThreads) {
    const int e = e0 + threadIdx.x, r = e / PER_ROW, c = (e % PER_ROW) * 8;
    const bool ok = r < rows_valid && c < cols_valid;
    if (TOTAL % kMaxThreads == 0 || e < TOTAL) cp_async16(dst + r * ld + c, src + (ok ? r * st + c : 0), ok);
  }
}

// Whether the pieces of such a tile that this thread copied (and has waited for) hold a NaN or inf.
template <int COLS>
__device__ __forceinline__ bool tile_bad(const __nv_bfloat16* dst, int ld) {
  constexpr int PER_ROW = COLS / 8, TOTAL = 32 * PER_ROW;
  bool bad = false;
#pragma unroll
  for (int e0 = 0; e0 < TOTAL; e0 += kMaxThreads) {
    const int e = e0 + threadIdx.x, r = e / PER_ROW, c = (e % PER_ROW) * 8;
    if (TOTAL % kMaxThreads == 0 || e < TOTAL) bad |= !finite16(*reinterpret_cast<const uint4*>(dst + r * ld + c));
  }
  return bad;
}

// One warp's strip of S (16 rows x N tiles of 8 columns, held as the pair Sh + Sl): S = decay S +
// (w beta k)^T v over the chunk, the scaled keys split into hi + lo.
template <int N>
__device__ __forceinline__ void s_update_strip_bf16(__nv_bfloat16* shp, __nv_bfloat16* slp, int ldh,
                                                    const __nv_bfloat16* kc, int ldk, const __nv_bfloat16* vc,
                                                    const float* kscale, float decay, int lane) {
  const int g = lane >> 2, q4 = lane & 3;
  float acc[N][4];
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int o = (g + 8 * r) * ldh + n * 8 + 2 * q4;
      const uint32_t h = *reinterpret_cast<const uint32_t*>(shp + o), l = *reinterpret_cast<const uint32_t*>(slp + o);
      acc[n][2 * r] = (bf16_lo(h) + bf16_lo(l)) * decay;
      acc[n][2 * r + 1] = (bf16_hi(h) + bf16_hi(l)) * decay;
    }
  }
#pragma unroll
  for (int s0 = 0; s0 < 32; s0 += 16) {
    // A = (w beta k)^T, 16 rows of D_k x 16 steps: k's tiles transposed; a0, a1 hold steps 2q, 2q + 1,
    // a2, a3 steps 2q + 8, 2q + 9.
    uint32_t kr[4], ah[4], al[4];
    ldm4<true>(kr, kc + (s0 + (lane >> 4) * 8 + (lane & 7)) * ldk + ((lane >> 3) & 1) * 8);
    const float w0 = kscale[s0 + 2 * q4], w1 = kscale[s0 + 2 * q4 + 1];
    const float w2 = kscale[s0 + 2 * q4 + 8], w3 = kscale[s0 + 2 * q4 + 9];
    split_bf16x2(bf16_lo(kr[0]) * w0, bf16_hi(kr[0]) * w1, ah[0], al[0]);
    split_bf16x2(bf16_lo(kr[1]) * w0, bf16_hi(kr[1]) * w1, ah[1], al[1]);
    split_bf16x2(bf16_lo(kr[2]) * w2, bf16_hi(kr[2]) * w3, ah[2], al[2]);
    split_bf16x2(bf16_lo(kr[3]) * w2, bf16_hi(kr[3]) * w3, ah[3], al[3]);
    uint32_t vb[N][2];
    frag_b_kn<N>(vb, vc + s0 * ldh, ldh, lane);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      mma_bf16(acc[n], ah, vb[n][0], vb[n][1]);
      mma_bf16(acc[n], al, vb[n][0], vb[n][1]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int c = n * 8 + 2 * q4;
    uint32_t h0, l0, h1, l1;
    split_bf16x2(acc[n][0], acc[n][1], h0, l0);
    split_bf16x2(acc[n][2], acc[n][3], h1, l1);
    *reinterpret_cast<uint32_t*>(shp + g * ldh + c) = h0;
    *reinterpret_cast<uint32_t*>(slp + g * ldh + c) = l0;
    *reinterpret_cast<uint32_t*>(shp + (g + 8) * ldh + c) = h1;
    *reinterpret_cast<uint32_t*>(slp + (g + 8) * ldh + c) = l1;
  }
}

// DK: D_k padded to 16 as a compile-time constant, or 0 for any D_k at run time (as chunk_v2). With DK > 0
// (16-byte aligned rows) the next chunk's q, k, v, gate and beta are in flight (cp.async into the other
// of two staging buffers) while this chunk computes, warp 6 computes the next chunk's gate products
// while warps 0-5 compute P (two sets of tables), and y is stored from the registers of the warps that
// computed it.
template <int NV, int DK>
__global__ void __launch_bounds__(kMaxThreads, 2) chunk_v3_kernel(const ChunkParams p) {
  using bf16 = __nv_bfloat16;
  constexpr int C = 32, WARPS = kMaxThreads / 32, NT8 = NV / 8, YN = NV / 32;
  constexpr int LDV = NV + 8, LDP = C + 8;  // pitch of the state's and v's rows (fp32 Ys too), P's pitch
  extern __shared__ __align__(128) float chunk3_buf[];
  const int DKP = DK > 0 ? DK : p.DKP, DKQ = (DKP + 31) & ~31, LDK = DKQ + 8;
  constexpr int TAB = 21 * C, GW = 6;  // one set of gate tables (as chunk_v2's); the warp that computes them
  float* Ys = chunk3_buf;        // C x LDV (run-time D_k only)
  float* tabs = Ys + C * LDV;    // two sets of gate tables: rowd, kscale, pin, sout, bsm, ltab
  bf16* Ph = reinterpret_cast<bf16*>(tabs + 2 * TAB);  // C x LDP: the masked product split in two
  bf16* Pl = Ph + C * LDP;
  bf16* Sh = Pl + C * LDP;       // DKP x LDV: the state split in two
  bf16* Sl = Sh + DKP * LDV;
  bf16* stage0 = Sl + DKP * LDV;  // staging buffer(s): q, k as C x LDK, v as C x LDV
  const int stage_size = 2 * C * LDK + C * LDV;

  griddep_wait();
  griddep_launch();
  const bool outputs = p.mode == 0;
  const ChunkBlock<bf16> cb(p, NV);
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int g = lane >> 2, q4 = lane & 3;
  init_state(StateSplit{Sh, Sl, LDV}, DKP, NV, p, cb);
  float seg_decay = 1.f;

  const int MI = DKP / 16, ssplit = s_splits(MI, NT8, WARPS);
  const int sgn = NT8 / ssplit, s_tasks = MI * ssplit;
  const bool keep_state = p.mode != 0 || (cb.seg == p.nseg - 1 && p.s_out != nullptr);
  const int c_begin = cb.seg * p.seg_chunks;
  const int c_end = min(c_begin + p.seg_chunks, (p.T + C - 1) / C);

  // The gate tables of set ts, from the gates and betas in the lanes of the calling warp.
  auto gate_tables = [&](int ts, float gr, float br) {
    float* t = tabs + ts * TAB;
    chunk_gate_products(gr, br, lane, t, t + C, t + 2 * C, t + 3 * C, t + 4 * C, t + 5 * C);
  };
  // Chunk ch into staging buffer sb (DK > 0), its gate and beta into g_next, b_next (lanes of warp GW).
  float g_next = 1.f, b_next = 0.f;
  auto issue = [&](int ch, int sb) {
    const int t0 = ch * C, tc = min(C, p.T - t0);
    bf16* Qb = stage0 + sb * stage_size;
    g_next = 1.f;
    b_next = 0.f;
    if (warp == GW && lane < tc) {
      g_next = to_float(cb.gate[(int64_t)(t0 + lane) * p.sg.t]);
      b_next = to_float(cb.beta[(int64_t)(t0 + lane) * p.sb.t]);
    }
    tile_async<(DK > 0 ? DK : 32)>(Qb + C * LDK, LDK, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, tc, p.Dk);
    if (outputs) tile_async<(DK > 0 ? DK : 32)>(Qb, LDK, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, tc, p.Dk);
    tile_async<NV>(Qb + 2 * C * LDK, LDV, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, tc, cb.nv);
    cp_async_commit();
  };
  if constexpr (DK > 0) {
    if (c_begin < c_end) issue(c_begin, 0);
    if (outputs && warp == GW) gate_tables(0, g_next, b_next);  // later sets come during the P phase
  }
  for (int ch = c_begin; ch < c_end; ++ch) {
    const int t0 = ch * C, tc = min(C, p.T - t0);
    const int sb = (ch - c_begin) & 1;  // staging buffer (DK > 0) and set of gate tables
    bf16* Qh = stage0 + (DK > 0 ? sb : 0) * stage_size;
    bf16* Kh = Qh + C * LDK;
    bf16* Vh = Kh + C * LDK;
    const float* rowd = tabs + sb * TAB;
    const float *kscale = rowd + C, *pin = rowd + 2 * C, *sout = rowd + 3 * C, *bsm = rowd + 4 * C;
    const float* ltab = rowd + 5 * C;
    bool v_bad;
    if constexpr (DK > 0) {
      const float g_reg = g_next, b_reg = b_next;
      // The other buffer was last read before the previous chunk's final barrier.
      if (ch + 1 < c_end) issue(ch + 1, sb ^ 1);
      else cp_async_commit();  // an empty group keeps "all but the newest group" meaning this chunk
      if (!outputs && warp == GW) gate_tables(sb, g_reg, b_reg);  // no P phase to hide them behind
      cp_async_wait<1>();
      v_bad = tile_bad<NV>(Vh, LDV);
    } else {
      float g_reg, b_reg;
      v_bad = stage_chunk_raw(Qh, Kh, LDK, Vh, LDV, DKQ, NV, p, cb, t0, tc, g_reg, b_reg);
      if (warp == 0) gate_tables(sb, g_reg, b_reg);
    }
    const bool vbad = __syncthreads_or(v_bad);  // B1 (also orders the initial Sh, Sl before q S)
    const float chunk_decay = rowd[C - 1];
    seg_decay *= chunk_decay;

    if (outputs) {
      // ---- P tiles (16 x 8) on or below the diagonal: q k^T exact in fp32, masked and decayed in
      // registers, stored split
      if (warp < 6) {
        const int pb = warp < 2 ? 0 : 1, pn = warp < 2 ? warp : warp - 2;
        float d[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};
        const bf16* A = Qh + pb * 16 * LDK;
        const bf16* Bk = Kh + pn * 8 * LDK;
#pragma unroll 4
        for (int kk = 0; kk < DKQ; kk += 32) {
          uint32_t kb[4], a[4], a2[4];  // kb: B = K^T for k columns kk .. kk + 31 (rows of K are its columns)
          ldm4(kb, Bk + (lane & 7) * LDK + kk + (lane >> 3) * 8);
          ldm4(a, ldm_row(A + kk, LDK, lane));
          ldm4(a2, ldm_row(A + kk + 16, LDK, lane));
          mma_bf16(d, a, kb[0], kb[1]);
          mma_bf16(d2, a2, kb[2], kb[3]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int t = pb * 16 + g + 8 * half, s = pn * 8 + 2 * q4;
          uint32_t hi, lo;
          split_bf16x2(masked_entry(d[2 * half] + d2[2 * half], t, s, ltab, pin, sout, bsm),
                       masked_entry(d[2 * half + 1] + d2[2 * half + 1], t, s + 1, ltab, pin, sout, bsm), hi, lo);
          *reinterpret_cast<uint32_t*>(Ph + t * LDP + s) = hi;
          *reinterpret_cast<uint32_t*>(Pl + t * LDP + s) = lo;
        }
      } else if (DK > 0 && warp == GW && ch + 1 < c_end) {
        gate_tables(sb ^ 1, g_next, b_next);  // the next chunk's (that set was last read in the previous chunk)
      }
      __syncthreads();  // B2

      // ---- Y = M V + A[t] (q S): stored from registers (DK > 0: y's rows 16-byte aligned), or staged in Ys
      {
        const int yb = warp >> 2, yn0 = (warp & 3) * YN;
        float mv[YN][4], ml[YN][4], qs[YN][4], ql[YN][4];
#pragma unroll
        for (int n = 0; n < YN; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) { mv[n][i] = 0.f; ml[n][i] = 0.f; qs[n][i] = 0.f; ql[n][i] = 0.f; }
        // The masked product up to the diagonal block, included unless this chunk's v is not finite.
        const int kend = (yb + (vbad ? 0 : 1)) * 16;
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 16) {
          if (k0 < kend) {
            uint32_t ph[4], pl[4], vb[YN][2];
            ldm4(ph, ldm_row(Ph + yb * 16 * LDP + k0, LDP, lane));
            ldm4(pl, ldm_row(Pl + yb * 16 * LDP + k0, LDP, lane));
            frag_b_kn<YN>(vb, Vh + k0 * LDV + yn0 * 8, LDV, lane);
#pragma unroll
            for (int n = 0; n < YN; ++n) {
              mma_bf16(mv[n], ph, vb[n][0], vb[n][1]);
              mma_bf16(ml[n], pl, vb[n][0], vb[n][1]);
            }
          }
        }
#pragma unroll 4
        for (int kk = 0; kk < DKP; kk += 16) {
          uint32_t a[4], sh[YN][2], sl[YN][2];
          ldm4(a, ldm_row(Qh + yb * 16 * LDK + kk, LDK, lane));
          frag_b_kn<YN>(sh, Sh + kk * LDV + yn0 * 8, LDV, lane);
          frag_b_kn<YN>(sl, Sl + kk * LDV + yn0 * 8, LDV, lane);
#pragma unroll
          for (int n = 0; n < YN; ++n) {
            mma_bf16(qs[n], a, sh[n][0], sh[n][1]);
            mma_bf16(ql[n], a, sl[n][0], sl[n][1]);
          }
        }
        if (vbad) {  // the diagonal block in fp32 FMAs, s <= t only: a masked zero never meets a non-finite v
#pragma unroll
          for (int n = 0; n < YN; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int t = yb * 16 + g + 8 * (i >> 1), j = (yn0 + n) * 8 + 2 * q4 + (i & 1);
              float acc = 0.f;
              for (int s = yb * 16; s <= t; ++s)
                acc = fmaf(__bfloat162float(Ph[t * LDP + s]) + __bfloat162float(Pl[t * LDP + s]),
                           __bfloat162float(Vh[s * LDV + j]), acc);
              mv[n][i] += acc;
            }
        }
        const float r0 = rowd[yb * 16 + g], r1 = rowd[yb * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < YN; ++n) {
          const int col = (yn0 + n) * 8 + 2 * q4;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int t = yb * 16 + g + 8 * h;
            const float r = h ? r1 : r0;
            const float y0 = fmaf(r, qs[n][2 * h] + ql[n][2 * h], mv[n][2 * h] + ml[n][2 * h]);
            const float y1 = fmaf(r, qs[n][2 * h + 1] + ql[n][2 * h + 1], mv[n][2 * h + 1] + ml[n][2 * h + 1]);
            if constexpr (DK > 0) {
              if (t < tc && col < cb.nv)  // nv is a multiple of 8 here
                *reinterpret_cast<__nv_bfloat162*>(cb.y + (int64_t)(t0 + t) * p.sy.t + col) = __floats2bfloat162_rn(y0, y1);
            } else {
              *reinterpret_cast<float2*>(Ys + t * LDV + col) = make_float2(y0, y1);
            }
          }
        }
      }
      __syncthreads();  // B3: every read of the old S done (and Y staged)
    }

    // ---- S = A[C-1] S + (w beta k)^T V (skipped after the segment's last chunk unless the state is read)
    for (int task = warp; task < (ch + 1 < c_end || keep_state ? s_tasks : 0); task += WARPS) {
      const int mi = task / ssplit, n0 = (task - (task / ssplit) * ssplit) * sgn;
      bf16* shp = Sh + mi * 16 * LDV + n0 * 8;
      bf16* slp = Sl + mi * 16 * LDV + n0 * 8;
      const bf16* kc = Kh + mi * 16;
      const bf16* vc = Vh + n0 * 8;
      switch (sgn) {
        case 1: s_update_strip_bf16<1>(shp, slp, LDV, kc, LDK, vc, kscale, chunk_decay, lane); break;
        case 2: s_update_strip_bf16<2>(shp, slp, LDV, kc, LDK, vc, kscale, chunk_decay, lane); break;
        case 4: s_update_strip_bf16<4>(shp, slp, LDV, kc, LDK, vc, kscale, chunk_decay, lane); break;
        default: s_update_strip_bf16<NT8>(shp, slp, LDV, kc, LDK, vc, kscale, chunk_decay, lane); break;
      }
    }

    if (DK == 0 && outputs) write_y<bf16, C, NV, false>(cb.y, p, Ys, LDV, nullptr, 0, nullptr, t0, tc, cb.nv, false);
    __syncthreads();  // B4
  }

  leave_state(StateSplit{Sh, Sl, LDV}, p, cb, seg_decay);
}

// ===================================== section: state_scan_v1 kernel ========================
// Turns each segment's own state contribution into the state at its end, in place:
// S = initial (or 0); for each segment s but the last: S = decay_s S + contribution_s; store S.
__global__ void __launch_bounds__(kMaxThreads) state_scan_v1_kernel(const ChunkParams p) {
  griddep_wait();  // launched with pdl behind the state phase
  griddep_launch();
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t per_head = (int64_t)p.Dk * p.Dv;
  if (e >= p.BH * per_head) return;
  const int64_t bh = e / per_head, ij = e - bh * per_head;
  const int i = (int)(ij / p.Dv), j = (int)(ij - (ij / p.Dv) * p.Dv);
  const int b = (int)(bh / p.H), h = (int)(bh - (bh / p.H) * p.H);
  float S = p.s_in != nullptr ? p.s_in[b * p.ssi.b + h * p.ssi.h + i * p.ssi.i + j * p.ssi.j] : 0.f;
  float* st = p.seg_states + bh * (p.nseg - 1) * per_head + ij;
  const float* dec = p.seg_decays + bh * (p.nseg - 1);
  // Eight segments' loads before their stores: one memory round trip per eight segments, not one
  // per segment (a load after a store to the same array is not moved above it by the compiler).
  constexpr int U = 8;
  for (int s0 = 0; s0 < p.nseg - 1; s0 += U) {
    float x[U], d[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u < p.nseg - 1) { x[u] = st[(s0 + u) * per_head]; d[u] = dec[s0 + u]; }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u < p.nseg - 1) {
        S = fmaf(d[u], S, x[u]);
        st[(s0 + u) * per_head] = S;
      }
  }
}

// ===================================== section: launcher ====================================
// Calls f with a value of the scalar type that `dtype` names (one dtype switch for every launcher).
template <typename F>
cudaError_t with_scalar(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Every launch: kernel<<<blocks, kMaxThreads, smem, stream>>>(args), as a programmatic dependent
// launch when pdl is set; returns the launch's error.
template <typename... Args>
cudaError_t launch_ex(void (*kernel)(Args...), int64_t blocks, size_t smem, cudaStream_t stream, bool pdl,
                      const Args&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3(kMaxThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename scalar_t>
cudaError_t launch_typed(const RecurrentParams& p, const RecurrentConfig& c, int64_t blocks, cudaStream_t s) {
  // Always kMaxThreads: threads past G * JB only stage, which keeps more loads in flight.
#define GR_CASE(R_, G_)                                                                                  \
  if (c.R == R_ && c.G == G_) {                                                                          \
    return launch_ex(recurrent_v1_kernel<scalar_t, R_, G_>, blocks, recurrent_smem(c), s, false, p);    \
  }
  GR_RG_PAIRS(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

// One attribute call per kernel and device: the chunked kernels need more than 48 KB of shared memory.
// `done` is one flag per device, owned by the caller's kernel instantiation.
template <typename K>
cudaError_t allow_smem(K kernel, bool (&done)[64]) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess || (dev < 64 && done[dev])) return err;
  int optin = 0;
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err == cudaSuccess && dev < 64) done[dev] = true;
  return err;
}

template <typename scalar_t>
cudaError_t launch_chunk_typed(const ChunkParams& p, int C, int NV, int64_t blocks, cudaStream_t s) {
#define GR_CASE(C_, NV_)                                                                        \
  if (C == C_ && NV == NV_) {                                                                   \
    static bool done[64] = {};                                                                  \
    const cudaError_t err = allow_smem(chunk_v1_kernel<scalar_t, C_, NV_>, done);               \
    if (err != cudaSuccess) return err;                                                         \
    return launch_ex(chunk_v1_kernel<scalar_t, C_, NV_>, blocks, chunk_smem(C_, NV_, p.DKP), s, false, p); \
  }
  GR_CHUNK_PAIRS(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

// D_k padded to 64 or 128 (with NV = 64) and q, k, v, y rows 16-byte aligned run an instantiation with
// every loop unrolled and vector staging only; anything else the general one. Each instantiation costs
// build time (the first import compiles them all).
template <typename scalar_t>
cudaError_t launch_chunk2_typed(const ChunkParams& p, int NV, int64_t blocks, cudaStream_t s) {
  const bool aligned = p.vec_qk && p.vec_v && p.vec_y;
#define GR_CASE(NV_, DK_)                                                                             \
  if (NV == NV_ && (DK_ == 0 || (p.DKP == DK_ && aligned))) {                                        \
    static bool done[64] = {};                                                                        \
    const cudaError_t err = allow_smem(chunk_v2_kernel<scalar_t, NV_, DK_>, done);                    \
    if (err != cudaSuccess) return err;                                                               \
    return launch_ex(chunk_v2_kernel<scalar_t, NV_, DK_>, blocks, chunk2_smem(NV_, p.DKP), s, p.pdl != 0, p); \
  }
  GR_CASE(64, 64) GR_CASE(64, 128) GR_CASE(32, 0) GR_CASE(64, 0)  // NV = 32 (D_v <= 32) is rare with wide keys
#undef GR_CASE
  return cudaErrorInvalidValue;
}

// The same instantiations for chunk_v3 (bf16 only).
cudaError_t launch_chunk3(const ChunkParams& p, int NV, int64_t blocks, cudaStream_t s) {
  const bool aligned = p.vec_qk && p.vec_v && p.vec_y;
#define GR_CASE(NV_, DK_)                                                                             \
  if (NV == NV_ && (DK_ == 0 || (p.DKP == DK_ && aligned))) {                                        \
    static bool done[64] = {};                                                                        \
    const cudaError_t err = allow_smem(chunk_v3_kernel<NV_, DK_>, done);                              \
    if (err != cudaSuccess) return err;                                                               \
    return launch_ex(chunk_v3_kernel<NV_, DK_>, blocks, chunk3_smem(NV_, p.DKP), s, p.pdl != 0, p);   \
  }
  GR_CASE(64, 64) GR_CASE(64, 128) GR_CASE(32, 0) GR_CASE(64, 0)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

}  // namespace

// ===================================== section: entry points ================================
// The launchers the host file calls (declared in "common"); everything above has internal linkage, so
// two builds of this file loaded in one process (a notebook re-running an edited copy) keep their own
// kernels and their own per-kernel flags (a static in a template function is otherwise one
// process-wide GNU-unique symbol: the second build skipped its shared-memory opt-in, measured).
cudaError_t launch_recurrent_v1(const RecurrentParams& p, const RecurrentConfig& c, DType dtype, int64_t blocks,
                                cudaStream_t stream) {
  return with_scalar(dtype, [&](auto x) { return launch_typed<decltype(x)>(p, c, blocks, stream); });
}

cudaError_t launch_chunk_v1(const ChunkParams& p, int C, int NV, DType dtype, int64_t blocks, cudaStream_t stream) {
  return with_scalar(dtype, [&](auto x) { return launch_chunk_typed<decltype(x)>(p, C, NV, blocks, stream); });
}

cudaError_t launch_chunk_v2(const ChunkParams& p, int NV, DType dtype, int64_t blocks, cudaStream_t stream) {
  return with_scalar(dtype, [&](auto x) { return launch_chunk2_typed<decltype(x)>(p, NV, blocks, stream); });
}

cudaError_t launch_chunk_v3(const ChunkParams& p, int NV, DType dtype, int64_t blocks, cudaStream_t stream) {
  return dtype == DType::bf16 ? launch_chunk3(p, NV, blocks, stream) : cudaErrorInvalidValue;
}

cudaError_t launch_state_scan_v1(const ChunkParams& p, cudaStream_t stream) {
  const int64_t n = p.BH * p.Dk * p.Dv;
  return launch_ex(state_scan_v1_kernel, (n + kMaxThreads - 1) / kMaxThreads, 0, stream, p.pdl != 0, p);
}

}  // namespace gr
"""

HOST_SRC = r"""
// ===================================== section: argument checks =============================
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>
#include <algorithm>
#include <vector>
#include <string>
#include <type_traits>
#include <utility>

namespace gr {

constexpr int kMaxDim = 256;
constexpr size_t kSmemBudget = 48 * 1024;  // recurrent_v1 stays under the static limit
constexpr int64_t kChunkedMinT = 256;      // use_chunked(): from the crossover sweep in BENCHMARKS.md
// The chunked kernel the plan uses (BENCHMARKS.md compares them): chunk_v3 for bf16, chunk_v2 otherwise.
inline int chunk_version(DType dt) { return dt == DType::bf16 ? 3 : 2; }

// Errors are returned, not thrown: the entry points return an undefined tensor (None in Python) and
// last_error() gives "ExceptionName: message" for Python to raise. (On the device's torch 2.11 build
// every failing check crashed the process while messages went through an ostream; this path is the
// one verified there, see cat() below.)
thread_local std::string g_error;
#define GR_REQUIRE(kind, cond, ...)                          \
  do {                                                       \
    if (!(cond)) {                                           \
      g_error = std::string(kind) + ": " + cat(__VA_ARGS__); \
      return false;                                          \
    }                                                        \
  } while (0)

// Messages are built by string appends only. Inserting an integer into a std::ostream from this
// extension crashed the device's torch 2.11 process (segfault in every message that held a number;
// std::to_string and string appends were fine there), so no ostream is used.
inline std::string piece(const char* s) { return s; }
inline std::string piece(const std::string& s) { return s; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline std::string piece(T x) { return std::to_string(x); }

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  ((s += piece(args)), ...);
  return s;
}

std::string shape_str(at::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

const char* dtype_str(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return "a non-float dtype";
  }
}

std::string device_str(const at::Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : t.is_cpu() ? std::string("cpu") : std::string("a non-CUDA device");
}

bool check_input(const at::Tensor& t, const char* name, int64_t dims, const char* layout) {
  GR_REQUIRE("TypeError", t.defined(), name, " must be a tensor, got an undefined tensor");
  const auto st = t.scalar_type();
  GR_REQUIRE("TypeError", st == at::kFloat || st == at::kHalf || st == at::kBFloat16, name,
                   " must be float32, float16 or bfloat16, got ", dtype_str(st));
  GR_REQUIRE("ValueError", t.dim() == dims, name, " must have ", dims, " dimensions ", layout, ", got shape ",
                    shape_str(t.sizes()));
  return true;
}

// Dtypes and shapes first, devices last, so that every shape error is also reachable on a CPU.
bool check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& gate, const at::Tensor& beta) {
  if (!check_input(q, "q", 4, "(B, T, H, D_k)") || !check_input(k, "k", 4, "(B, T, H, D_k)") ||
      !check_input(v, "v", 4, "(B, T, H, D_v)") || !check_input(gate, "gate", 3, "(B, T, H)") ||
      !check_input(beta, "beta", 3, "(B, T, H)"))
    return false;
  const std::pair<const at::Tensor*, const char*> others[] = {{&k, "k"}, {&v, "v"}, {&gate, "gate"}, {&beta, "beta"}};
  for (const auto& o : others)
    GR_REQUIRE("TypeError", o.first->scalar_type() == q.scalar_type(), o.second, " has dtype ",
                     dtype_str(o.first->scalar_type()), " but q has ", dtype_str(q.scalar_type()), "; all inputs must share one dtype");
  const auto bth = q.sizes().slice(0, 3);
  GR_REQUIRE("ValueError", k.sizes() == q.sizes(), "k must have the shape of q ", shape_str(q.sizes()), ", got ",
             shape_str(k.sizes()));
  GR_REQUIRE("ValueError", v.sizes().slice(0, 3) == bth, "v must be (B, T, H, D_v) with (B, T, H) = ", shape_str(bth),
                    " like q, got ", shape_str(v.sizes()));
  GR_REQUIRE("ValueError", gate.sizes() == bth, "gate must be (B, T, H) = ", shape_str(bth), ", got ",
             shape_str(gate.sizes()));
  GR_REQUIRE("ValueError", beta.sizes() == bth, "beta must be (B, T, H) = ", shape_str(bth), ", got ",
             shape_str(beta.sizes()));
  GR_REQUIRE("ValueError", q.size(3) >= 1 && q.size(3) <= kMaxDim, "q and k: D_k must be in 1..", kMaxDim,
                    ", got ", q.size(3));
  GR_REQUIRE("ValueError", v.size(3) >= 1 && v.size(3) <= kMaxDim, "v: D_v must be in 1..", kMaxDim, ", got ",
                    v.size(3));
  GR_REQUIRE("ValueError", q.size(1) <= INT32_MAX, "q: T must be below 2^31, got ", q.size(1));
  return true;
}

bool check_devices(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta) {
  const std::pair<const at::Tensor*, const char*> others[] = {{&k, "k"}, {&v, "v"}, {&gate, "gate"}, {&beta, "beta"}};
  GR_REQUIRE("ValueError", q.is_cuda(), "q must be a CUDA tensor, got a tensor on ", device_str(q));
  for (const auto& o : others)
    GR_REQUIRE("ValueError", o.first->device() == q.device(), o.second, " is on ", device_str(*o.first),
                      " but q is on ", device_str(q), "; all inputs must be on one CUDA device");
  return true;
}

bool check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                     const at::Tensor& beta) {
  return check_shapes(q, k, v, gate, beta) && check_devices(q, k, v, gate, beta);
}

// ===================================== section: dispatch ====================================
inline int pow2_at_least(int64_t x) { int p = 1; while (p < x) p <<= 1; return p; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Fewest lanes per column with at most 8 rows a lane, the smallest row count that covers D_k,
// all columns of a head in one block when they fit, and as many time steps as shared memory holds.
RecurrentConfig plan_recurrent(int64_t T, int64_t Dk, int64_t Dv) {
  RecurrentConfig c;
  c.G = pow2_at_least((Dk + 7) / 8);
  const int rows_needed = (int)((Dk + c.G - 1) / c.G);
  c.R = rows_needed <= 1 ? 1 : rows_needed <= 2 ? 2 : rows_needed <= 4 ? 4 : rows_needed <= 6 ? 6 : 8;
  const int min_cols = c.G >= 32 ? 1 : 32 / c.G;  // whole warps
  const int max_cols = kMaxThreads / c.G;
  const int jb = (int)((Dv + min_cols - 1) / min_cols) * min_cols;
  c.JB = jb < max_cols ? jb : max_cols;
  const int64_t tc = (int64_t)(kSmemBudget / recurrent_smem({c.R, c.G, c.JB, 1}));
  c.TC = (int)(T < tc ? (T > 0 ? T : 1) : tc);
  return c;
}

// The current device's SM count and opt-in shared memory per block (an H200's without a device, so
// that plan() also answers on a machine with no GPU).
struct DeviceLimits { int64_t sms; size_t smem; bool pdl; };  // pdl: sm_90 or newer
DeviceLimits device_limits() {
  static DeviceLimits cache[64] = {};
  if (c10::cuda::device_count() == 0) return {132, 232448, false};
  const int dev = c10::cuda::current_device();
  if (dev < 64 && cache[dev].sms > 0) return cache[dev];
  int sms = 0, smem = 0, major = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return {132, 232448, false};
  const DeviceLimits lim{sms, (size_t)smem, major >= 9};
  if (dev < 64) cache[dev] = lim;
  return lim;
}

// Programmatic dependent launch of state_scan_v1 and the output phase (0 to measure without).
#ifndef GR_PDL
#define GR_PDL 1
#endif

inline int dk_padded(int64_t Dk) { return (int)ceil_div(Dk, 16) * 16; }

// Chunks of 32 steps, column tiles of 32 for narrow states, and as many segments per (b, h) as fit
// the output phase into every SM slot once (sequence parallelism when B * H is small). Rounded down:
// one block over the slots is a second wave (17 segments at T = 65536, B = 1, H = 8: 2.70 ms; 16: 1.90 ms).
ChunkConfig plan_chunked(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, const DeviceLimits& lim,
                         DType dt) {
  ChunkConfig c;
  c.version = chunk_version(dt);
  c.NV = Dv <= 32 ? 32 : 64;
  c.C = 32;  // two blocks per SM; beat C = 64 at S1, S2 and S3 in fp32 and bf16 (BENCHMARKS.md)
  const int64_t tiles = B * H * ceil_div(Dv, c.NV), chunks = std::max<int64_t>(1, ceil_div(T, c.C));
  const int64_t want = lim.sms * 2;  // blocks that fill every SM slot once
  int64_t nseg = std::max<int64_t>(1, std::min<int64_t>(want / tiles, chunks));
  nseg = ceil_div(chunks, ceil_div(chunks, nseg));  // no empty segments
  c.nseg = (int)nseg;
  return c;
}

// Chunked once the sequence is long enough for the recurrent kernel's per-step latency to dominate,
// or earlier for wide heads in large batches (the recurrent kernel then needs several waves).
bool use_chunked(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv) {
  (void)Dv;
  return T >= kChunkedMinT || (Dk >= 96 && T >= 32 && B * H * T >= 8192);
}

std::string plan_text(const RecurrentConfig& c) {
  return "recurrent_v1 R=" + std::to_string(c.R) + " G=" + std::to_string(c.G) + " JB=" + std::to_string(c.JB) +
         " TC=" + std::to_string(c.TC);
}
std::string plan_text(const ChunkConfig& c) {
  return "chunk_v" + std::to_string(c.version) + " C=" + std::to_string(c.C) + " NV=" + std::to_string(c.NV) + " segments=" + std::to_string(c.nseg) +
         (c.nseg > 1 ? " (+ state_scan_v1)" : "");
}

std::string plan(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType dt) {
  if (use_chunked(B, T, H, Dk, Dv)) return plan_text(plan_chunked(B, T, H, Dk, Dv, device_limits(), dt));
  return plan_text(plan_recurrent(T, Dk, Dv));
}

// ===================================== section: launch ======================================
inline Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
inline Strides3 strides3(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
inline StateStrides state_strides(const at::Tensor* t) {
  return t ? StateStrides{t->stride(0), t->stride(1), t->stride(2), t->stride(3)} : StateStrides{0, 0, 0, 0};
}
inline DType dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? DType::f32 : t.scalar_type() == at::kHalf ? DType::f16 : DType::bf16;
}

// 16-byte loads are legal when every row segment a block reads starts on a 16-byte boundary.
inline bool rows_aligned(const at::Tensor& t, int64_t cols_per_block) {
  const int64_t V = 16 / t.element_size();
  return t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % V == 0 &&
         t.stride(1) % V == 0 && t.stride(2) % V == 0 && t.size(3) % V == 0 && cols_per_block % V == 0;
}

// Initial state in (nullptr: zero), final state out (nullptr: not wanted).
bool launch_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                      const at::Tensor& beta, at::Tensor& y, const RecurrentConfig& c, const at::Tensor* s_in,
                      at::Tensor* s_out) {
  const int64_t B = q.size(0), H = q.size(2), Dv = v.size(3);
  RecurrentParams p;
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
  p.gate = gate.data_ptr(); p.beta = beta.data_ptr(); p.y = y.data_ptr();
  p.sq = strides4(q); p.sk = strides4(k); p.sv = strides4(v); p.sy = strides4(y);
  p.sg = strides3(gate); p.sb = strides3(beta);
  p.T = (int)q.size(1); p.H = (int)H; p.Dk = (int)q.size(3); p.Dv = (int)Dv;
  p.JB = c.JB; p.TC = c.TC;
  p.col_blocks = (int)((Dv + c.JB - 1) / c.JB);
  p.s_in = s_in ? s_in->data_ptr<float>() : nullptr; p.ssi = state_strides(s_in);
  p.s_out = s_out ? s_out->data_ptr<float>() : nullptr; p.sso = state_strides(s_out);
  const int64_t blocks = B * H * p.col_blocks;
  GR_REQUIRE("ValueError", blocks <= INT32_MAX, "B * H = ", B * H, " is too large for one launch");
  p.vec = rows_aligned(q, q.size(3)) && rows_aligned(k, k.size(3)) && rows_aligned(v, c.JB);
  const cudaError_t err = launch_recurrent_v1(p, c, dtype_of(q), blocks, c10::cuda::getCurrentCUDAStream());
  GR_REQUIRE("RuntimeError", err == cudaSuccess, "recurrent_v1 launch failed: ", cudaGetErrorString(err));
  return true;
}

bool launch_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                    const at::Tensor& beta, at::Tensor& y, const ChunkConfig& c, const at::Tensor* s_in,
                    at::Tensor* s_out) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  ChunkParams p;
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
  p.gate = gate.data_ptr(); p.beta = beta.data_ptr(); p.y = y.data_ptr();
  p.sq = strides4(q); p.sk = strides4(k); p.sv = strides4(v); p.sy = strides4(y);
  p.sg = strides3(gate); p.sb = strides3(beta);
  p.T = (int)T; p.H = (int)H; p.Dk = (int)Dk; p.Dv = (int)Dv; p.BH = B * H;
  p.DKP = dk_padded(Dk);
  p.vtiles = (int)ceil_div(Dv, c.NV);
  const int64_t chunks = ceil_div(T, c.C);
  p.seg_chunks = (int)ceil_div(chunks, std::min<int64_t>(c.nseg, chunks));
  p.nseg = (int)ceil_div(chunks, p.seg_chunks);
  p.vec_qk = rows_aligned(q, Dk) && rows_aligned(k, Dk);
  p.vec_v = rows_aligned(v, c.NV);
  p.vec_y = rows_aligned(y, c.NV);
  p.s_in = s_in ? s_in->data_ptr<float>() : nullptr; p.ssi = state_strides(s_in);
  p.s_out = s_out ? s_out->data_ptr<float>() : nullptr; p.sso = state_strides(s_out);
  p.seg_states = nullptr; p.seg_decays = nullptr;
  p.pdl = 0;
  const int64_t blocks = p.BH * p.nseg * p.vtiles;
  GR_REQUIRE("ValueError", blocks <= INT32_MAX, "B * H = ", p.BH, " is too large for one launch");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const DType dt = dtype_of(q);
  auto launch_version = [&](int64_t n) {
    return c.version == 3 ? launch_chunk_v3(p, c.NV, dt, n, stream)
           : c.version == 2 ? launch_chunk_v2(p, c.NV, dt, n, stream) : launch_chunk_v1(p, c.C, c.NV, dt, n, stream);
  };
  at::Tensor work;  // freed on return; the caching allocator reuses it only after this stream's work
  if (p.nseg > 1) {
    const int64_t n = p.BH * (p.nseg - 1);
    work = at::empty({n * Dk * Dv + n}, q.options().dtype(at::kFloat));
    p.seg_states = work.data_ptr<float>();
    p.seg_decays = p.seg_states + n * Dk * Dv;
    p.mode = 1; p.seg_launch = p.nseg - 1;
    const int64_t state_blocks = p.BH * p.seg_launch * p.vtiles;
    cudaError_t err = launch_version(state_blocks);
    GR_REQUIRE("RuntimeError", err == cudaSuccess, "chunk_v", c.version, " (state phase) launch failed: ",
               cudaGetErrorString(err));
    // The scan and the output phase follow our own kernels: programmatic dependent launches (each
    // waits for its predecessor before touching memory), which hides their launch latency.
    p.pdl = GR_PDL && device_limits().pdl ? 1 : 0;
    err = launch_state_scan_v1(p, stream);
    GR_REQUIRE("RuntimeError", err == cudaSuccess, "state_scan_v1 launch failed: ", cudaGetErrorString(err));
  }
  p.mode = 0; p.seg_launch = p.nseg;
  if (c.version == 1) p.pdl = 0;  // chunk_v1 does not wait
  const cudaError_t err = launch_version(blocks);
  GR_REQUIRE("RuntimeError", err == cudaSuccess, "chunk_v", c.version, " launch failed: ", cudaGetErrorString(err));
  return true;
}

// The hot path: checks, one output allocation, the planned kernel(s).
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
               const at::Tensor& beta) {
  if (!check_arguments(q, k, v, gate, beta)) return at::Tensor();
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor y = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  if (y.numel() == 0) return y;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  if (use_chunked(B, T, H, Dk, Dv))
    return launch_chunked(q, k, v, gate, beta, y, plan_chunked(B, T, H, Dk, Dv, device_limits(), dtype_of(q)),
                          nullptr, nullptr)
               ? y : at::Tensor();
  return launch_recurrent(q, k, v, gate, beta, y, plan_recurrent(T, Dk, Dv), nullptr, nullptr) ? y : at::Tensor();
}

// ===================================== section: state and configuration API =================
bool check_state(const at::Tensor& s, const at::Tensor& q, const at::Tensor& v) {
  GR_REQUIRE("TypeError", s.scalar_type() == at::kFloat, "initial_state must be float32, got ", dtype_str(s.scalar_type()));
  const int64_t want[4] = {q.size(0), q.size(2), q.size(3), v.size(3)};
  GR_REQUIRE("ValueError", s.sizes() == at::IntArrayRef(want, 4), "initial_state must be (B, H, D_k, D_v) = ",
             shape_str(at::IntArrayRef(want, 4)), ", got ", shape_str(s.sizes()));
  return true;
}

bool check_recurrent_config(const at::Tensor& q, const RecurrentConfig& c) {
  bool compiled = false;
#define GR_IS(R_, G_) compiled = compiled || (c.R == R_ && c.G == G_);
  GR_RG_PAIRS(GR_IS)
#undef GR_IS
  GR_REQUIRE("ValueError", compiled, "(R, G) = (", c.R, ", ", c.G, ") is not a compiled pair (see GR_RG_PAIRS)");
  GR_REQUIRE("ValueError", c.R * c.G >= q.size(3), "R * G must cover D_k, got ", c.R * c.G);
  GR_REQUIRE("ValueError", c.JB >= 1 && (c.G * c.JB) % 32 == 0 && c.G * c.JB <= kMaxThreads,
             "G * JB must be a multiple of 32 and at most ", kMaxThreads, ", got ", c.G * c.JB);
  GR_REQUIRE("ValueError", c.TC >= 1 && recurrent_smem(c) <= kSmemBudget, "TC=", c.TC, " needs ", recurrent_smem(c),
             " bytes of shared memory, over ", kSmemBudget);
  return true;
}

bool check_chunk_config(const at::Tensor& q, const ChunkConfig& c) {
  bool compiled = c.version >= 2 ? (c.C == 32 && (c.NV == 32 || c.NV == 64)) : false;
#define GR_IS(C_, NV_) compiled = compiled || (c.version == 1 && c.C == C_ && c.NV == NV_);
  GR_CHUNK_PAIRS(GR_IS)
#undef GR_IS
  GR_REQUIRE("ValueError", compiled, "(C, NV) = (", c.C, ", ", c.NV, ") is not compiled for chunk_v", c.version,
             " (see GR_CHUNK_PAIRS; chunk_v2 and chunk_v3 have C = 32, NV = 32 or 64)");
  GR_REQUIRE("ValueError", c.nseg >= 1, "segments must be at least 1, got ", c.nseg);
  const size_t need = chunk_smem(c, dk_padded(q.size(3))), have = device_limits().smem;
  GR_REQUIRE("ValueError", need <= have, "C=", c.C, " NV=", c.NV, " needs ", need, " bytes of shared memory, over ",
             have);
  return true;
}

// algorithm: -1 planned, 0 recurrent_v1, 1 chunk_v1; config: empty (planned), (R, G, JB, TC) or
// (C, NV, segments). Returns [y] or [y, final_state]; [] when an argument was refused (see last_error).
bool run_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
            const at::Tensor& beta, const c10::optional<at::Tensor>& initial_state, bool want_final,
            int64_t algorithm, const std::vector<int64_t>& config, std::vector<at::Tensor>& out) {
  if (!check_shapes(q, k, v, gate, beta)) return false;
  c10::cuda::OptionalCUDAGuard guard;  // q's device before anything reads device limits (plan, config checks)
  if (q.is_cuda()) guard.set_device(q.device());
  const at::Tensor* s_in = initial_state.has_value() && initial_state->defined() ? &*initial_state : nullptr;
  if (s_in && !check_state(*s_in, q, v)) return false;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  GR_REQUIRE("ValueError", algorithm >= -1 && algorithm <= 4, "algorithm must be -1 (planned), 0 (recurrent), 1 "
             "(chunked, planned version), 2 (chunk_v1), 3 (chunk_v2) or 4 (chunk_v3), got ", algorithm);
  GR_REQUIRE("TypeError", algorithm != 4 || q.scalar_type() == at::kBFloat16, "chunk_v3 takes bfloat16 inputs, got ",
             dtype_str(q.scalar_type()));
  const bool chunked = algorithm >= 1 || (algorithm == -1 && use_chunked(B, T, H, Dk, Dv));
  RecurrentConfig rc = plan_recurrent(T, Dk, Dv);
  ChunkConfig cc = plan_chunked(B, T, H, Dk, Dv, device_limits(), dtype_of(q));
  if (algorithm >= 2) cc.version = (int)algorithm - 1;
  if (!config.empty()) {
    GR_REQUIRE("ValueError", algorithm != -1, "config needs an explicit algorithm");
    GR_REQUIRE("ValueError", config.size() == (chunked ? 3u : 4u), "config must be ",
               chunked ? "(C, NV, segments)" : "(R, G, JB, TC)", ", got ", config.size(), " values");
    if (chunked) {
      cc = {cc.version, (int)config[0], (int)config[1], (int)config[2]};
      if (!check_chunk_config(q, cc)) return false;
    } else {
      rc = {(int)config[0], (int)config[1], (int)config[2], (int)config[3]};
      if (!check_recurrent_config(q, rc)) return false;
    }
  }
  if (!check_devices(q, k, v, gate, beta)) return false;
  GR_REQUIRE("ValueError", !s_in || s_in->device() == q.device(), "initial_state is on ", device_str(*s_in),
             " but q is on ", device_str(q));
  at::Tensor y = at::empty({B, T, H, Dv}, q.options());
  at::Tensor fin;
  if (want_final)
    fin = T == 0 ? (s_in ? s_in->clone(at::MemoryFormat::Contiguous) : at::zeros({B, H, Dk, Dv}, q.options().dtype(at::kFloat)))
                 : at::empty({B, H, Dk, Dv}, q.options().dtype(at::kFloat));
  if (y.numel() > 0) {
    at::Tensor* s_out = want_final ? &fin : nullptr;
    const bool ok = chunked ? launch_chunked(q, k, v, gate, beta, y, cc, s_in, s_out)
                            : launch_recurrent(q, k, v, gate, beta, y, rc, s_in, s_out);
    if (!ok) return false;
  }
  out.push_back(y);
  if (want_final) out.push_back(fin);
  return true;
}

}  // namespace gr

at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta) {
  return gr::run(q, k, v, gate, beta);
}

std::vector<at::Tensor> forward_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& gate, const at::Tensor& beta,
                                   const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                                   int64_t algorithm, std::vector<int64_t> config) {
  std::vector<at::Tensor> out;
  if (!gr::run_ex(q, k, v, gate, beta, initial_state, output_final_state, algorithm, config, out)) out.clear();
  return out;
}

std::string last_error() { return gr::g_error; }
// dtype: 0 float32, 1 float16, 2 bfloat16 (the Python wrapper maps names).
std::string plan(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t dtype) {
  return gr::plan(B, T, H, Dk, Dv, static_cast<gr::DType>(dtype));
}
"""

CUDA_FLAGS = ["-O3"]


# ---------------------------------------------------------------------------------------------
# Build: once per (source, flags, torch, arch); a named, hashed build folder tells cached from new.
# ---------------------------------------------------------------------------------------------
def _arch_list():
    """Build for the visible device (its own arch); without one, for TORCH_CUDA_ARCH_LIST or Hopper."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")


def _split_compile_flags():
    """nvcc >= 12.1 optimizes the kernels in parallel, one thread per core (the first import is
    mostly nvcc). The SASS of every kernel but state_scan_v1's address arithmetic is the same with
    and without it, so it is left out of the build key. Older nvcc: no flag."""
    from torch.utils.cpp_extension import CUDA_HOME
    nvcc = os.path.join(CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout if os.path.exists(nvcc) else ""
    found = re.search(r"release (\d+)\.(\d+)", out)
    return ["--split-compile=0"] if found and (int(found.group(1)), int(found.group(2))) >= (12, 1) else []


def _build():
    arch = _arch_list()
    key = "\n".join([COMMON_SRC, KERNELS_SRC, HOST_SRC, " ".join(CUDA_FLAGS), torch.__version__,
                     str(torch.version.cuda), arch, os.environ.get("TORCH_CUDA_ARCH_LIST", "")])
    name = "gated_recurrence_" + hashlib.sha1(key.encode()).hexdigest()[:12]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions", "gated_recurrence")
    build_dir = os.path.join(root, name)
    so_path = os.path.join(build_dir, name + ".so")
    if os.path.exists(so_path):  # built before: import it directly, skipping load_inline's ninja run
        spec = importlib.util.spec_from_file_location(name, so_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    os.makedirs(build_dir, exist_ok=True)
    print(f"solution.py: compiling the CUDA extension for sm_{arch.replace('.', '')} "
          f"(about a minute, once; cached in {build_dir})", file=sys.stderr, flush=True)
    if not torch.cuda.is_available():  # no device to query: torch reads the arch list from here
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
    return load_inline(name=name, cpp_sources=COMMON_SRC + HOST_SRC, cuda_sources=COMMON_SRC + KERNELS_SRC,
                       functions=["forward", "forward_ex", "plan", "last_error"], extra_cflags=["-O3"],
                       extra_cuda_cflags=CUDA_FLAGS + _split_compile_flags(), build_directory=build_dir,
                       verbose=os.environ.get("GATED_RECURRENCE_VERBOSE_BUILD") == "1")


_ext = _build()


# ---------------------------------------------------------------------------------------------
# Functional API and the KernelBench module.
# ---------------------------------------------------------------------------------------------
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError}


def _checked(y):
    """The extension returns None ([] from forward_ex) where it refused the arguments; raise what it reports."""
    if y is None or (isinstance(y, list) and not y):
        kind, _, msg = _ext.last_error().partition(": ")
        raise _ERRORS[kind](msg)
    return y


_ALGORITHMS = {None: -1, "recurrent": 0, "chunked": 1, "chunk_v1": 2, "chunk_v2": 3, "chunk_v3": 4}


def gated_recurrence(q, k, v, gate, beta, initial_state=None, output_final_state=False):
    """y (B, T, H, D_v) of the gated recurrence, in the inputs' dtype. See the module docstring.

    initial_state: optional (B, H, D_k, D_v) float32 state S_0 (default zero). With
    output_final_state=True the result is (y, S_T), S_T a new float32 (B, H, D_k, D_v) tensor.
    """
    if initial_state is None and not output_final_state:
        return _checked(_ext.forward(q, k, v, gate, beta))
    out = _checked(_ext.forward_ex(q, k, v, gate, beta, initial_state, bool(output_final_state), -1, []))
    return (out[0], out[1]) if output_final_state else out[0]


def gated_recurrence_with(q, k, v, gate, beta, algorithm=None, config=(), initial_state=None,
                          output_final_state=False):
    """Like gated_recurrence, with the algorithm ("recurrent", "chunked" (the planned chunk kernel),
    "chunk_v1", "chunk_v2" or, for bfloat16, "chunk_v3") and its launch configuration chosen by the caller (benchmarks and tests):
    (R, G, JB, TC) for recurrent_v1, (C, NV, segments) for the chunk kernels, () for the planned one.
    plan() shows the default."""
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(a for a in _ALGORITHMS if a)} or None, got {algorithm!r}")
    out = _checked(_ext.forward_ex(q, k, v, gate, beta, initial_state, bool(output_final_state),
                                   _ALGORITHMS[algorithm], [int(x) for x in config]))
    return (out[0], out[1]) if output_final_state else out[0]


def gated_recurrence_config(q, k, v, gate, beta, R, G, JB, TC):
    """recurrent_v1 with an explicit launch configuration (R, G, JB, TC)."""
    return gated_recurrence_with(q, k, v, gate, beta, "recurrent", (R, G, JB, TC))


_DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def plan(B, T, H, Dk, Dv, dtype="float32"):
    """The kernel and launch configuration the dispatch picks for this shape and dtype (a torch dtype
    or its name), as text."""
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    return _ext.plan(B, T, H, Dk, Dv, _DTYPE_CODES[name])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, gate, beta):
        return gated_recurrence(q, k, v, gate, beta)
