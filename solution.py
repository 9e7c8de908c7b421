"""Gated outer-product linear recurrence as one CUDA kernel (KernelBench drop-in: ModelNew).

Math, per batch b and head h, S_0 = 0 (a D_k x D_v state kept in fp32):

    S_t = gate_t * S_{t-1} + beta_t * k_t v_t^T
    y_t = S_t^T q_t            (y_t[j] = sum_i q_t[i] S_t[i, j])

q, k: (B, T, H, D_k); v, y: (B, T, H, D_v); gate, beta: (B, T, H); any strides; float32,
float16 or bfloat16 (all the same dtype); 1 <= D_k, D_v <= 256. Arithmetic is fp32, y has the
input dtype.

Algorithms (the dispatch in the host section "dispatch" picks one per call; `plan()` names it):

    kernel          serves        how
    recurrent_v1    every shape   column j of S evolves on its own, so each column is owned by a
                                  group of G lanes of one warp (G * R >= D_k rows, R rows per lane,
                                  S in registers); a block of 256 threads stages C time steps of
                                  q, k, v, gate, beta in shared memory with 16-byte loads where the
                                  layout allows (one barrier per C steps, none per step), then the
                                  lanes run the C steps and the G lanes of a column reduce q . S
                                  with warp shuffles (G is a template parameter).

Measured on one H200, KernelBench timing (median per call, L2 flushed), BENCHMARKS.md has the
command and the other shapes:

    recurrent_v1    (2, 128, 4, 24) fp32   0.0223 ms   (eager 9.15 ms, fla fused_recurrent 0.221 ms)
                    (4, 1024, 8, 64) fp32  0.256 ms    (fla chunk 0.427 ms)
                    (8, 2048, 16, 128) fp32 5.48 ms    (fla chunk 0.648 ms: the chunked path is next)

Functional API: `gated_recurrence(q, k, v, gate, beta) -> y`. `ModelNew` is a shell over it.
Bad arguments raise ValueError / TypeError naming the argument (checked in C++).
"""
import hashlib
import importlib.util
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

__all__ = ["ModelNew", "gated_recurrence", "gated_recurrence_config", "plan", "KERNELS"]

# Every kernel name the dispatch can return; tests check this list against the docstring and plan().
KERNELS = ("recurrent_v1",)

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

struct RecurrentParams {
  const void* q; const void* k; const void* v; const void* gate; const void* beta; void* y;
  Strides4 sq, sk, sv, sy;
  Strides3 sg, sb;
  int T, H, Dk, Dv;
  int JB;          // state columns per block
  int TC;          // time steps staged in shared memory at once
  int col_blocks;  // ceil(Dv / JB)
  int vec;         // q, k, v rows are 16-byte aligned runs (checked by the caller): 16-byte loads
};

struct RecurrentConfig { int R, G, JB, TC; };

inline size_t recurrent_smem(const RecurrentConfig& c) {
  return sizeof(float) * (size_t)c.TC * (2 * c.G * c.R + c.JB + 2);
}

// (R, G) pairs compiled: the dispatch's rule (G = 1 with any R, else R in {6, 8}) plus (4, 8).
#define GR_RG_PAIRS(X) X(1, 1) X(2, 1) X(4, 1) X(6, 1) X(8, 1) X(6, 2) X(8, 2) X(6, 4) X(8, 4) X(4, 8) \
  X(6, 8) X(8, 8) X(6, 16) X(8, 16) X(6, 32) X(8, 32)

cudaError_t launch_recurrent_v1(const RecurrentParams& p, const RecurrentConfig& c, DType dtype, int64_t blocks,
                                cudaStream_t stream);
}  // namespace gr
"""

KERNELS_SRC = r"""
// ===================================== section: device helpers ==============================
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace gr {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

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

  float S[R];
#pragma unroll
  for (int r = 0; r < R; ++r) S[r] = 0.f;

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
}

// ===================================== section: launcher ====================================
template <typename scalar_t>
cudaError_t launch_typed(const RecurrentParams& p, const RecurrentConfig& c, int64_t blocks, cudaStream_t s) {
  // Always kMaxThreads: threads past G * JB only stage, which keeps more loads in flight.
#define GR_CASE(R_, G_)                                                                                  \
  if (c.R == R_ && c.G == G_) {                                                                          \
    recurrent_v1_kernel<scalar_t, R_, G_><<<(unsigned)blocks, kMaxThreads, recurrent_smem(c), s>>>(p); \
    return cudaGetLastError();                                                                           \
  }
  GR_RG_PAIRS(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

cudaError_t launch_recurrent_v1(const RecurrentParams& p, const RecurrentConfig& c, DType dtype, int64_t blocks,
                                cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: return launch_typed<float>(p, c, blocks, stream);
    case DType::f16: return launch_typed<__half>(p, c, blocks, stream);
    case DType::bf16: return launch_typed<__nv_bfloat16>(p, c, blocks, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gr
"""

HOST_SRC = r"""
// ===================================== section: argument checks =============================
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <string>
#include <type_traits>
#include <utility>

namespace gr {

constexpr int kMaxDim = 256;
constexpr size_t kSmemBudget = 48 * 1024;  // the static limit: no cudaFuncSetAttribute per call

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
bool check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
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
  GR_REQUIRE("ValueError", q.is_cuda(), "q must be a CUDA tensor, got a tensor on ", device_str(q));
  for (const auto& o : others)
    GR_REQUIRE("ValueError", o.first->device() == q.device(), o.second, " is on ", device_str(*o.first),
                      " but q is on ", device_str(q), "; all inputs must be on one CUDA device");
  return true;
}

// ===================================== section: dispatch ====================================
inline int pow2_at_least(int64_t x) { int p = 1; while (p < x) p <<= 1; return p; }

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

std::string plan(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv) {
  (void)B; (void)H;
  const RecurrentConfig c = plan_recurrent(T, Dk, Dv);
  return "recurrent_v1 R=" + std::to_string(c.R) + " G=" + std::to_string(c.G) + " JB=" +
         std::to_string(c.JB) + " TC=" + std::to_string(c.TC);
}

inline Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
inline Strides3 strides3(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// 16-byte loads are legal when every row segment a block reads starts on a 16-byte boundary.
inline bool rows_aligned(const at::Tensor& t, int64_t cols_per_block) {
  const int64_t V = 16 / t.element_size();
  return t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % V == 0 &&
         t.stride(1) % V == 0 && t.stride(2) % V == 0 && t.size(3) % V == 0 && cols_per_block % V == 0;
}

bool launch_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                      const at::Tensor& beta, at::Tensor& y, const RecurrentConfig& c) {
  const int64_t B = q.size(0), H = q.size(2), Dv = v.size(3);
  RecurrentParams p;
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
  p.gate = gate.data_ptr(); p.beta = beta.data_ptr(); p.y = y.data_ptr();
  p.sq = strides4(q); p.sk = strides4(k); p.sv = strides4(v); p.sy = strides4(y);
  p.sg = strides3(gate); p.sb = strides3(beta);
  p.T = (int)q.size(1); p.H = (int)H; p.Dk = (int)q.size(3); p.Dv = (int)Dv;
  p.JB = c.JB; p.TC = c.TC;
  p.col_blocks = (int)((Dv + c.JB - 1) / c.JB);
  const int64_t blocks = B * H * p.col_blocks;
  GR_REQUIRE("ValueError", blocks <= INT32_MAX, "B * H = ", B * H, " is too large for one launch");
  p.vec = rows_aligned(q, q.size(3)) && rows_aligned(k, k.size(3)) && rows_aligned(v, c.JB);
  const DType dt = q.scalar_type() == at::kFloat ? DType::f32 : q.scalar_type() == at::kHalf ? DType::f16 : DType::bf16;
  const cudaError_t err = launch_recurrent_v1(p, c, dt, blocks, c10::cuda::getCurrentCUDAStream());
  GR_REQUIRE("RuntimeError", err == cudaSuccess, "recurrent_v1 launch failed: ", cudaGetErrorString(err));
  return true;
}

at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
               const at::Tensor& beta, const RecurrentConfig* forced) {
  if (!check_arguments(q, k, v, gate, beta)) return at::Tensor();
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor y = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  if (y.numel() == 0) return y;
  const RecurrentConfig c = forced ? *forced : plan_recurrent(q.size(1), q.size(3), v.size(3));
  return launch_recurrent(q, k, v, gate, beta, y, c) ? y : at::Tensor();
}

}  // namespace gr

at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta) {
  return gr::run(q, k, v, gate, beta, nullptr);
}

namespace gr {
bool check_config(const at::Tensor& q, const RecurrentConfig& c) {
  bool compiled = false;
#define GR_IS(R_, G_) compiled = compiled || (c.R == R_ && c.G == G_);
  GR_RG_PAIRS(GR_IS)
#undef GR_IS
  GR_REQUIRE("ValueError", compiled, "(R, G) = (", c.R, ", ", c.G, ") is not a compiled pair (see GR_RG_PAIRS)");
  GR_REQUIRE("ValueError", q.dim() == 4 && c.R * c.G >= q.size(3), "R * G must cover D_k, got ", c.R * c.G);
  GR_REQUIRE("ValueError", c.JB >= 1 && (c.G * c.JB) % 32 == 0 && c.G * c.JB <= kMaxThreads,
             "G * JB must be a multiple of 32 and at most ", kMaxThreads, ", got ", c.G * c.JB);
  GR_REQUIRE("ValueError", c.TC >= 1 && recurrent_smem(c) <= kSmemBudget, "TC=", c.TC, " needs ", recurrent_smem(c),
             " bytes of shared memory, over ", kSmemBudget);
  return true;
}
}  // namespace gr

// For benchmarks and tests of non-default configurations.
at::Tensor forward_config(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                          const at::Tensor& beta, int64_t R, int64_t G, int64_t JB, int64_t TC) {
  const gr::RecurrentConfig c{(int)R, (int)G, (int)JB, (int)TC};
  return gr::check_config(q, c) ? gr::run(q, k, v, gate, beta, &c) : at::Tensor();
}

std::string last_error() { return gr::g_error; }
std::string plan(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv) { return gr::plan(B, T, H, Dk, Dv); }
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
                       functions=["forward", "forward_config", "plan", "last_error"], extra_cflags=["-O3"],
                       extra_cuda_cflags=CUDA_FLAGS, build_directory=build_dir,
                       verbose=os.environ.get("GATED_RECURRENCE_VERBOSE_BUILD") == "1")


_ext = _build()


# ---------------------------------------------------------------------------------------------
# Functional API and the KernelBench module.
# ---------------------------------------------------------------------------------------------
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError}


def _checked(y):
    """The extension returns None where it refused the arguments; raise what it reports."""
    if y is None:
        kind, _, msg = _ext.last_error().partition(": ")
        raise _ERRORS[kind](msg)
    return y


def gated_recurrence(q, k, v, gate, beta):
    """y (B, T, H, D_v) of the gated recurrence, in the inputs' dtype. See the module docstring."""
    return _checked(_ext.forward(q, k, v, gate, beta))


def gated_recurrence_config(q, k, v, gate, beta, R, G, JB, TC):
    """recurrent_v1 with an explicit launch configuration (benchmarks and tests); plan() shows the default."""
    return _checked(_ext.forward_config(q, k, v, gate, beta, R, G, JB, TC))


def plan(B, T, H, Dk, Dv):
    """The kernel and launch configuration the dispatch picks for this shape, as text."""
    return _ext.plan(B, T, H, Dk, Dv)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, gate, beta):
        return gated_recurrence(q, k, v, gate, beta)
