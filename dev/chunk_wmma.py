"""chunk_wmma: the first chunked kernel of solution.py ("chunk_v1", first to fifth session), kept as a
standalone script. Dropped from solution.py when it was rewritten.

What it is: the chunkwise-parallel form (naive.chunked_naive has the math) on wmma m16n16k8 TF32
tiles. Per chunk of C steps: P = q k^T, mask, decay and beta applied in passes over shared memory,
Y = P V + (decayed q) S, S = decay S + (scaled k)^T V; fp32 inputs use 3xTF32 (hi/lo truncation split,
fp32-level error), fp16/bf16 one TF32 product; the diagonal 16x16 blocks of P V in fp32 FMAs (a masked
zero never meets a NaN v). One block per (b, h, segment, column tile of NV); segments > 1 run a state
phase, a scan of the segment states (state_scan) and the output phase, as the original did. Zero
initial state only (the production API's initial/final states are left out).

Why it was replaced (docs/perf-notes.md, "Chunked path: versions"): wmma's TF32 fragment loads compile
to generic 64-bit-addressed loads even from shared memory, and the split and the shared-memory passes
cost more issue slots than the tensor cores; raw mma.sync with shared-memory fragment loads, a
2-instruction split and mask/decay in registers (chunk_v2) was 1.7x faster at every shape. Last
measured (H200, third session, run 1): S1 0.116, S2 1.655, S3 0.584 ms fp32.

    python3 dev/chunk_wmma.py [--trials 30] [--no-timing]     (writes $OUT/dev_chunk_wmma.json with OUT set)

Checks itself against the float64 loop (naive.recurrent_naive), then times itself against
solution.gated_recurrence at S1-S3 fp32. The first run compiles the extension (a minute on 2 cores).
"""
import argparse
import json
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import naive  # noqa: E402
import reference  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402

# Seen by both translation units: the launch parameters and the launchers' declarations.
COMMON_SRC = r"""
#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

namespace cw {
constexpr int kMaxThreads = 256;
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct Strides4 { int64_t b, t, h, d; };
struct Strides3 { int64_t b, t, h; };

// A (b, h) sequence is cut into nseg segments of seg_chunks chunks of C steps. With nseg > 1 a state
// phase (mode 1) computes each segment's own state contribution and gate product, state_scan chains
// them, and the output phase (mode 0) runs every segment from its start state.
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
  int vec_qk, vec_v;  // 16-byte loads are legal for q and k / v
  int pdl;          // launch as a programmatic dependent of the previous kernel (sm_90+)
  float* seg_states;  // (B, H, nseg - 1, D_k, D_v): contributions, then (after the scan) end states
  float* seg_decays;  // (B, H, nseg - 1)
};

inline size_t chunk_smem(int C, int NV, int DKP) {
  return sizeof(float) * (size_t)(2 * C * (DKP + 4) + 2 * C * (NV + 8) + DKP * (NV + 8) + C * (C + 4) + 6 * C);
}

// (C, NV) pairs compiled (the Python wrapper's PAIRS).
#define CW_CHUNK_PAIRS(X) X(32, 32) X(32, 64) X(64, 32) X(64, 64)

cudaError_t launch_chunk_wmma(const ChunkParams& p, int C, int NV, DType dtype, int64_t blocks, cudaStream_t stream);
cudaError_t launch_state_scan(const ChunkParams& p, cudaStream_t stream);
}  // namespace cw
"""

# The .cu file (no torch headers).
KERNELS_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

namespace cw {
namespace {  // internal linkage up to the entry points

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Programmatic dependent launch (sm_90+): state_scan may start while the state phase still runs; it
// waits here before it touches memory. Both are no-ops for a kernel launched without pdl.
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


// The block's coordinates and pointers.
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

// The block's state slice in shared memory, fp32 at pitch ld.
struct StateF32 {
  float* s; int ld;
  __device__ __forceinline__ void set(int i, int j, float x) const { s[i * ld + j] = x; }
  __device__ __forceinline__ float get(int i, int j) const { return s[i * ld + j]; }
};

// The state slice (DKP x NV) at the segment's start: the scanned end state of the previous segment
// (output phase, segments after the first), else zero (the first segment; the state phase computes
// each segment's own contribution).
template <typename scalar_t>
__device__ __forceinline__ void init_state(const StateF32& st, int DKP, int NV, const ChunkParams& p,
                                           const ChunkBlock<scalar_t>& cb) {
  const float* s0 = p.mode == 0 && cb.seg > 0 ? cb.segment_state(p, cb.seg - 1) : nullptr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int i = warp; i < DKP; i += warps)
    for (int j = lane; j < NV; j += 32) {
      float x = 0.f;
      if (s0 != nullptr && i < p.Dk && j < cb.nv) x = s0[(int64_t)i * p.Dv + cb.j0 + j];
      st.set(i, j, x);
    }
}

// After the last chunk of the state phase: the segment's own contribution and gate product.
template <typename scalar_t>
__device__ __forceinline__ void leave_state(const StateF32& st, const ChunkParams& p, const ChunkBlock<scalar_t>& cb,
                                            float seg_decay) {
  if (p.mode == 0) return;
  float* dst = cb.segment_state(p, cb.seg);
  if (cb.vt == 0 && threadIdx.x == 0) p.seg_decays[cb.bh * (p.nseg - 1) + cb.seg] = seg_decay;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int i = warp; i < p.Dk; i += warps)
    for (int j = lane; j < cb.nv; j += 32) dst[(int64_t)i * p.Dv + cb.j0 + j] = st.get(i, j);
}

// Steps [t0, t0 + tc) into shared memory: k (and q with outputs) as C x DKP, v as C x NV; gate and
// beta of step threadIdx.x into registers (1 and 0 past the end).
template <typename scalar_t>
__device__ __forceinline__ void stage_chunk(float* Qs, float* Ks, int ldk, float* Vs, int ldv, int C, int DKP,
                                            int NV, const ChunkParams& p, const ChunkBlock<scalar_t>& cb, int t0,
                                            int tc, float& g_reg, float& b_reg) {
  g_reg = 1.f;
  b_reg = 0.f;
  if ((int)threadIdx.x < tc) {  // issued first: in flight while the tiles load
    g_reg = to_float(cb.gate[(int64_t)(t0 + threadIdx.x) * p.sg.t]);
    b_reg = to_float(cb.beta[(int64_t)(t0 + threadIdx.x) * p.sb.t]);
  }
  load_tile_any<scalar_t>(p.vec_qk, Ks, ldk, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, p.sk.d, tc, p.Dk, C, DKP);
  if (p.mode == 0)
    load_tile_any<scalar_t>(p.vec_qk, Qs, ldk, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, tc, p.Dk, C, DKP);
  load_tile_any<scalar_t>(p.vec_v, Vs, ldv, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, p.sv.d, tc, cb.nv, C, NV);
}

// y for steps [t0, t0 + tc) from the staged Ys plus the diagonal 16x16 blocks of the masked product
// in fp32 FMAs (s <= t only: a masked zero never meets a non-finite v).
template <typename scalar_t, int C, int NV>
__device__ __forceinline__ void write_y(scalar_t* y, const ChunkParams& p, const float* Ys, int ldv, const float* Ps,
                                        int ldc, const float* Vs, int t0, int tc, int nv) {
  for (int e = threadIdx.x; e < C * NV; e += blockDim.x) {
    const int t = e / NV, j = e % NV;
    float acc = Ys[t * ldv + j];
    const int s0d = t & ~15;
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if (s0d + r <= t) acc = fmaf(Ps[t * ldc + s0d + r], Vs[(s0d + r) * ldv + j], acc);
    if (t < tc && j < nv) y[(int64_t)(t0 + t) * p.sy.t + j * p.sy.d] = from_float<scalar_t>(acc);
  }
}

template <typename scalar_t, int C, int NV>
__global__ void __launch_bounds__(kMaxThreads, C == 32 ? 2 : 1) chunk_wmma_kernel(const ChunkParams p) {
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
    if (outputs) write_y<scalar_t, C, NV>(y, p, Ys, LDV, Ps, LDC, Vs, t0, tc, nv);
    __syncthreads();  // B5
  }

  leave_state(StateF32{Ss, LDV}, p, cb, seg_decay);
}


// Turns each segment's own state contribution into the state at its end, in place:
// S = 0; for each segment s but the last: S = decay_s S + contribution_s; store S.
__global__ void __launch_bounds__(kMaxThreads) state_scan_kernel(const ChunkParams p) {
  griddep_wait();  // launched with pdl behind the state phase
  griddep_launch();
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t per_head = (int64_t)p.Dk * p.Dv;
  if (e >= p.BH * per_head) return;
  const int64_t bh = e / per_head, ij = e - bh * per_head;
  float S = 0.f;
  float* st = p.seg_states + bh * (p.nseg - 1) * per_head + ij;
  const float* dec = p.seg_decays + bh * (p.nseg - 1);
  // Eight segments' loads before their stores: one memory round trip per eight segments.
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

// ---- launcher
// Calls f with a value of the scalar type that `dtype` names.
template <typename F>
cudaError_t with_scalar(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// kernel<<<blocks, kMaxThreads, smem, stream>>>(args), as a programmatic dependent launch when pdl is
// set; returns the launch's error.
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

// One attribute call per kernel and device: the kernel needs more than 48 KB of shared memory.
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
#define CW_CASE(C_, NV_)                                                                          \
  if (C == C_ && NV == NV_) {                                                                     \
    static bool done[64] = {};                                                                    \
    const cudaError_t err = allow_smem(chunk_wmma_kernel<scalar_t, C_, NV_>, done);               \
    if (err != cudaSuccess) return err;                                                           \
    return launch_ex(chunk_wmma_kernel<scalar_t, C_, NV_>, blocks, chunk_smem(C_, NV_, p.DKP), s, false, p); \
  }
  CW_CHUNK_PAIRS(CW_CASE)
#undef CW_CASE
  return cudaErrorInvalidValue;
}

}  // namespace

// ---- entry points (declared in the common part)
cudaError_t launch_chunk_wmma(const ChunkParams& p, int C, int NV, DType dtype, int64_t blocks, cudaStream_t stream) {
  return with_scalar(dtype, [&](auto x) { return launch_chunk_typed<decltype(x)>(p, C, NV, blocks, stream); });
}

cudaError_t launch_state_scan(const ChunkParams& p, cudaStream_t stream) {
  const int64_t n = p.BH * p.Dk * p.Dv;
  return launch_ex(state_scan_kernel, (n + kMaxThreads - 1) / kMaxThreads, 0, stream, p.pdl != 0, p);
}

}  // namespace cw
"""

# The C++ file: one entry point. The Python wrapper has checked shapes, dtypes, devices and (C, NV).
# (No integers in TORCH_CHECK messages: on the device's torch 2.11 an integer sent to an ostream from
# an extension crashed the process, see solution.py's history.)
HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <algorithm>

namespace cw {
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
inline Strides3 strides3(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
inline DType dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? DType::f32 : t.scalar_type() == at::kHalf ? DType::f16 : DType::bf16;
}

// 16-byte loads are legal when every row segment a block reads starts on a 16-byte boundary.
inline bool rows_aligned(const at::Tensor& t, int64_t cols_per_block) {
  const int64_t V = 16 / t.element_size();
  return t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % V == 0 &&
         t.stride(1) % V == 0 && t.stride(2) % V == 0 && t.size(3) % V == 0 && cols_per_block % V == 0;
}
}  // namespace cw

// y (B, T, H, D_v), written in place: state phase and scan when segments > 1, then the output phase.
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
             const at::Tensor& beta, const at::Tensor& y, int64_t C, int64_t NV, int64_t segments) {
  using namespace cw;
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  if (y.numel() == 0) return;
  int dev = 0, optin = 0, major = 0;
  TORCH_CHECK(cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess,
              "chunk_wmma: device attribute query failed");
  ChunkParams p;
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
  p.gate = gate.data_ptr(); p.beta = beta.data_ptr(); p.y = y.data_ptr();
  p.sq = strides4(q); p.sk = strides4(k); p.sv = strides4(v); p.sy = strides4(y);
  p.sg = strides3(gate); p.sb = strides3(beta);
  p.T = (int)T; p.H = (int)H; p.Dk = (int)Dk; p.Dv = (int)Dv; p.BH = B * H;
  p.DKP = (int)ceil_div(Dk, 16) * 16;
  TORCH_CHECK(chunk_smem((int)C, (int)NV, p.DKP) <= (size_t)optin,
              "chunk_wmma: this (C, NV, D_k) needs more shared memory than the device's opt-in limit");
  p.vtiles = (int)ceil_div(Dv, NV);
  const int64_t chunks = ceil_div(T, C);
  p.seg_chunks = (int)ceil_div(chunks, std::min<int64_t>(segments, chunks));
  p.nseg = (int)ceil_div(chunks, p.seg_chunks);  // no empty segments
  p.vec_qk = rows_aligned(q, Dk) && rows_aligned(k, Dk);
  p.vec_v = rows_aligned(v, NV);
  p.seg_states = nullptr; p.seg_decays = nullptr;
  p.pdl = 0;
  const int64_t blocks = p.BH * p.nseg * p.vtiles;
  TORCH_CHECK(blocks <= INT32_MAX, "chunk_wmma: B * H * segments * column tiles is too large for one launch");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const DType dt = dtype_of(q);
  at::Tensor work;  // freed on return; the caching allocator reuses it only after this stream's work
  if (p.nseg > 1) {
    const int64_t n = p.BH * (p.nseg - 1);
    work = at::empty({n * Dk * Dv + n}, q.options().dtype(at::kFloat));
    p.seg_states = work.data_ptr<float>();
    p.seg_decays = p.seg_states + n * Dk * Dv;
    p.mode = 1; p.seg_launch = p.nseg - 1;
    cudaError_t err = launch_chunk_wmma(p, (int)C, (int)NV, dt, p.BH * p.seg_launch * p.vtiles, stream);
    TORCH_CHECK(err == cudaSuccess, "chunk_wmma (state phase) launch failed: ", cudaGetErrorString(err));
    p.pdl = major >= 9 ? 1 : 0;  // the scan waits for the state phase in the kernel (griddepcontrol.wait)
    err = launch_state_scan(p, stream);
    TORCH_CHECK(err == cudaSuccess, "state_scan launch failed: ", cudaGetErrorString(err));
  }
  p.mode = 0; p.seg_launch = p.nseg;
  const cudaError_t err = launch_chunk_wmma(p, (int)C, (int)NV, dt, blocks, stream);
  TORCH_CHECK(err == cudaSuccess, "chunk_wmma launch failed: ", cudaGetErrorString(err));
}
"""

PAIRS = ((32, 32), (32, 64), (64, 32), (64, 64))  # (C, NV) compiled: CW_CHUNK_PAIRS
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_module = None


def _ext():
    """The extension, built on first use (cached by torch under TORCH_EXTENSIONS_DIR as dev_chunk_wmma)."""
    global _module
    if _module is None:
        if not torch.cuda.is_available():  # a build without a device: torch reads the arch list from here
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        _module = load_inline(name="dev_chunk_wmma", cpp_sources=COMMON_SRC + HOST_SRC,
                              cuda_sources=COMMON_SRC + KERNELS_SRC, functions=["forward"],
                              extra_cflags=["-O3"], extra_cuda_cflags=["-O3"],
                              verbose=os.environ.get("DEV_VERBOSE_BUILD") == "1")
    return _module


def chunk_wmma(q, k, v, gate, beta, C=32, NV=64, segments=1, out=None):
    """y (B, T, H, D_v) in the inputs' dtype (fp32, fp16 or bf16, all alike; any strides; D_k, D_v in
    1..256), S_0 = 0. C: chunk length, NV: state columns per block ((C, NV) in PAIRS); segments: per
    (b, h) sequence, > 1 adds the state phase and the scan. out: a (B, T, H, D_v) tensor to write y
    into (the self-check passes one filled with NaN)."""
    if (C, NV) not in PAIRS:
        raise ValueError(f"(C, NV) must be one of {PAIRS}, got {(C, NV)}")
    if int(segments) < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    xs = (q, k, v, gate, beta)
    if q.dtype not in _DTYPES or any(x.dtype != q.dtype for x in xs):
        raise TypeError(f"inputs must share one dtype of {_DTYPES}, got {[x.dtype for x in xs]}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3] \
            or gate.shape != q.shape[:3] or beta.shape != q.shape[:3]:
        raise ValueError(f"shapes must be q, k (B, T, H, D_k), v (B, T, H, D_v), gate, beta (B, T, H); got "
                         f"{[tuple(x.shape) for x in xs]}")
    if not (1 <= q.shape[3] <= 256 and 1 <= v.shape[3] <= 256):
        raise ValueError(f"D_k and D_v must be in 1..256, got {q.shape[3]}, {v.shape[3]}")
    if not q.is_cuda or any(x.device != q.device for x in xs):
        raise ValueError("inputs must be on one CUDA device")
    shape = (*q.shape[:3], v.shape[3])
    if out is None:
        out = torch.empty(shape, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be a {q.dtype} tensor of shape {shape} on {q.device}")
    _ext().forward(q, k, v, gate, beta, out, C, NV, int(segments))
    return out


def planned_segments(B, T, H, Dv, C=32, NV=64, sms=None):
    """The segment rule of chunk_v1's last plan (as solution.py's plan_chunked): as many segments per
    (b, h) as fit the output phase's blocks into two per SM once, no empty segments."""
    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    tiles, chunks = B * H * -(-Dv // NV), max(1, -(-T // C))
    nseg = max(1, min(2 * sms // tiles, chunks))
    return -(-chunks // -(-chunks // nseg))


# ---------------------------------------------------------------------------------------------
# Self-check and timing
# ---------------------------------------------------------------------------------------------
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SHAPES = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (3, 63, 5, 7, 7), (2, 63, 3, 33, 33), (1, 40, 2, 100, 100),
          (1, 20, 2, 256, 256), (2, 50, 3, 24, 100), (1, 33, 2, 100, 7), (1, 300, 2, 9, 13), (2, 700, 3, 64, 64),
          (1, 257, 2, 256, 40)]
CONFIGS = [(32, 64, 1), (32, 32, 1), (64, 64, 1), (64, 32, 2), (32, 64, 5), (32, 32, 1000)]  # (C, NV, segments)
HALF_CONFIGS = [(32, 64, 1), (64, 32, 3)]
GATES = [0.0, -0.5, 1.02, (-1.2, 1.2), (0.0, 0.05), (0.99, 1.0)]
BENCH = {"S1": (4, 1024, 8, 64), "S2": (8, 2048, 16, 128), "S3": (1, 8192, 8, 128)}


def make(B, T, H, Dk, Dv, dtype=torch.float32, gate=None):
    """reference.make_inputs on the GPU; gate: a constant, a (low, high) uniform range, or None (sigmoid)."""
    q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=torch.float32, device="cuda")
    if isinstance(gate, float):
        g = torch.full_like(g, gate)
    elif isinstance(gate, tuple):
        g = torch.empty_like(g).uniform_(*gate)
    return [x.to(dtype) for x in (q, k, v, g, b)]


def poisoned_call(xs, C, NV, segments):
    """chunk_wmma into a NaN-filled output, after filling freed device memory with NaN (the segment
    states come from the caching allocator)."""
    torch.empty(1 << 24, device="cuda").fill_(float("nan"))
    out = torch.full((*xs[0].shape[:3], xs[2].shape[3]), float("nan"), dtype=xs[0].dtype, device="cuda")
    return chunk_wmma(*xs, C=C, NV=NV, segments=segments, out=out)


def check():
    """Every case against the float64 loop; returns the rows (case, err, tol, ok)."""
    rows = []

    def record(case, y, ref, tol):
        fin = ~torch.isnan(ref)
        if not torch.equal(torch.isnan(y), ~fin):
            err = float("inf")  # NaN where the reference has none (an unwritten output), or the reverse
        else:
            err = rel_l2(y[fin], ref[fin]) if bool(fin.any()) else 0.0
        rows.append({"case": case, "err": err, "tol": tol, "ok": err <= tol})
        print(f"{'ok ' if err <= tol else 'BAD'} {case}: rel-L2 {err:.2e} (tol {tol:.0e})", flush=True)

    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            xs = make(*shape, dtype=dtype)
            ref = naive.recurrent_naive(*xs)[0]
            for C, NV, nseg in CONFIGS if dtype == torch.float32 else HALF_CONFIGS:
                if C == 64 and shape[3] > 128:  # over the shared memory of one block
                    continue
                y = poisoned_call(xs, C, NV, nseg)
                record(f"{shape} {str(dtype)[6:]} C={C} NV={NV} segments={nseg}", y, ref, TOL[dtype])
    for gate in GATES:
        for dtype in (torch.float32, torch.bfloat16):
            xs = make(2, 200, 3, 24, 40, dtype=dtype, gate=gate)
            ref = naive.recurrent_naive(*xs)[0]
            for C, NV, nseg in ((32, 64, 2), (64, 32, 3)):
                record(f"gate={gate} {str(dtype)[6:]} C={C} NV={NV} segments={nseg}", poisoned_call(xs, C, NV, nseg),
                       ref, TOL[dtype])
    for i, (name, idx) in enumerate({"q": (0, 5, 1, 3), "k": (1, 7, 2, 0), "v": (0, 9, 0, 4), "gate": (1, 11, 1),
                                     "beta": (0, 13, 2)}.items()):
        xs = make(2, 100, 3, 24, 20)
        xs[i][idx] = float("nan")
        record(f"NaN in {name} (same NaN pattern as the reference)", poisoned_call(xs, 32, 32, 2),
               naive.recurrent_naive(*xs)[0], 1e-5)
    xs = make(2, 300, 3, 32, 64)
    xs = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in xs[:3]] + xs[3:]  # strided q, k, v
    record("transposed layout (2, 300, 3, 32, 64)", poisoned_call(xs, 32, 64, 3), naive.recurrent_naive(*xs)[0], 1e-5)
    return rows


def bench(trials):
    """chunk_wmma (C = 32, NV = 64, the old plan's segments) against solution.gated_recurrence, fp32."""
    try:
        import solution
    except Exception as e:  # noqa: BLE001  (the production file is not this script's subject)
        print(f"import solution failed, timing chunk_wmma alone: {type(e).__name__}: {e}", flush=True)
        solution = None
    rows = []
    for name, (B, T, H, D) in BENCH.items():
        xs = reference.make_inputs(B, T, H, D, dtype=torch.float32, device="cuda")
        ref = naive.recurrent_naive(*xs)[0]
        nseg = planned_segments(B, T, H, D)

        def ours(*x, s=nseg):
            return chunk_wmma(*x, C=32, NV=64, segments=s)

        row = {"shape": name, "dims": (B, T, H, D), "dtype": "float32", "chunk_wmma_config": (32, 64, nseg),
               "chunk_wmma_err": rel_l2(ours(*xs), ref),
               "chunk_wmma_ms": kernelbench_time(ours, xs, trials=trials)["median"]}
        if solution is not None:
            row["solution_plan"] = solution.plan(B, T, H, D, D, torch.float32)
            row["solution_err"] = rel_l2(solution.gated_recurrence(*xs), ref)
            row["solution_ms"] = kernelbench_time(solution.gated_recurrence, xs, trials=trials)["median"]
        rows.append(row)
    print("\n| shape | chunk_wmma (C, NV, segments) | chunk_wmma | err | solution | err | ratio | plan |", flush=True)
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        sol = (f"{r['solution_ms'] * 1e3:.1f} us | {r['solution_err']:.1e} | "
               f"{r['chunk_wmma_ms'] / r['solution_ms']:.2f}x | {r['solution_plan']}") if "solution_ms" in r else "- | - | - | -"
        print(f"| {r['shape']} {r['dims']} | {r['chunk_wmma_config']} | {r['chunk_wmma_ms'] * 1e3:.1f} us | "
              f"{r['chunk_wmma_err']:.1e} | {sol} |", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=30, help="timed calls per kernel and shape")
    ap.add_argument("--no-timing", action="store_true", help="the self-check only")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    result["checks"] = check()
    bad = sum(not r["ok"] for r in result["checks"])
    print(f"self-check: {bad} bad of {len(result['checks'])}", flush=True)
    if not args.no_timing:
        result["timing"] = bench(args.trials)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "dev_chunk_wmma.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
