"""A first backward on the GPU (issue 15): the reverse loop of training-design.md 1.1, per element, with
chunk-boundary checkpoints. Not the chunked tensor-core backward the issue asks for; a correct GPU gradient
to test that one against, and the short-T path's first version.

Math (naive.recurrent_backward_naive, the float64 reference): Sh_t = dL/dS_t; Sh_T = dS_T + q_T dy_T^T,
Sh_{t-1} = g_t Sh_t + q_{t-1} dy_{t-1}^T; dq_t = S_t dy_t, dk_t = beta_t Sh_t v_t, dv_t = beta_t Sh_t^T k_t,
dbeta_t = <Sh_t, k_t v_t^T>, dgate_t = <Sh_t, S_{t-1}>, dS_0 = g_1 Sh_1. No division by a gate anywhere.

Layout: a block a (b, h, 32-column tile of the state), 256 threads, a thread 4 adjacent columns of every 32nd
row (decode_kernel's 32-column layout), D_k <= 128. Each element's S and Sh evolve on their own, so a thread
runs its 16 elements through the steps; the per-step sums (rows for dq and dk, columns for dv, the whole tile
for dgate and dbeta) go through shuffles and one barrier a step. Launch 1 runs the forward and writes S at
every C-th step (C = 8) to a workspace; launch 2 walks the chunks backwards, recomputes each chunk's C + 1
states into shared memory from its checkpoint, then runs the chunk's steps in reverse. Sums over the column
tiles (dq, dk, dgate, dbeta) are written as per-tile partials and added in tile order here (deterministic).
Workspace: ceil(T / C) states a (b, h), 16 KB a tile each.

    python3 dev/recurrent_backward.py [--trials 20]     (writes $OUT/recurrent_backward.json with OUT set)

Checks every gradient against the float64 reference (relative L2) for every dtype, odd shapes (T = 1, 63,
300; D = 7, 33, 100; D_k != D_v), gates 0, negative and above 1, with and without an initial state and a
final-state gradient; then times it at a few shapes. Not run yet (written in the thirteenth session after
the device time ran out).
"""
import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import naive  # noqa: E402
import reference  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from tools.common import save  # noqa: E402

SRC = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <vector>
#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>

namespace {
constexpr int kThreads = 256, kWarps = kThreads / 32, NP = 4, C = 8;  // rows r0 + 32 r (r < NP), chunk C

__device__ __forceinline__ float f32(float x) { return x; }
__device__ __forceinline__ float f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename E>
struct Args {
  const E *q, *k, *v, *gate, *beta, *dy;  // contiguous (B, T, H, D) and (B, T, H)
  const float *s0, *dfinal;               // (B, H, D_k, D_v) or nullptr
  float* ckpt;                            // (B, H, vtiles, ceil(T / C), 128 x 32) as each thread's 16 values
  float *dq, *dk, *dg, *db;               // per-tile partials: (vtiles, B, T, H, D_k) and (vtiles, B, T, H)
  float *dv, *ds0;                        // (B, T, H, D_v), (B, H, D_k, D_v)
  int B, T, H, Dk, Dv, vtiles, nck;
};

// One step's inputs for this thread: k (and q) of its rows, v (and dy) of its 4 columns, gate, beta.
struct Step {
  float k[NP], q[NP], v[4], dy[4], g, b;
};

template <typename T>
__device__ __forceinline__ void load_step(const Args<T>& a, int64_t row, int r0, int j0, bool grads, Step& s) {
  // row = (b * T + t) * H + h: the (b, t, h) index of the contiguous inputs
  s.g = f32(a.gate[row]);
  s.b = f32(a.beta[row]);
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const int i = r0 + 32 * r;
    s.k[r] = i < a.Dk ? f32(a.k[row * a.Dk + i]) : 0.f;
    s.q[r] = grads && i < a.Dk ? f32(a.q[row * a.Dk + i]) : 0.f;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int j = j0 + e;
    s.v[e] = j < a.Dv ? f32(a.v[row * a.Dv + j]) : 0.f;
    s.dy[e] = grads && j < a.Dv ? f32(a.dy[row * a.Dv + j]) : 0.f;
  }
}

// This thread's 16 state values: element (r, e) is S[r0 + 32 r][j0 + e].
__device__ __forceinline__ void load_state(const float* base, int Dk, int Dv, int r0, int j0, float (&S)[NP][4]) {
#pragma unroll
  for (int r = 0; r < NP; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + 32 * r, j = j0 + e;
      S[r][e] = base != nullptr && i < Dk && j < Dv ? base[(int64_t)i * Dv + j] : 0.f;
    }
}

// Checkpoint and shared-memory layout: value (r, e) of thread tid at [(r * 256 + tid) * 4 + e] (float4 a
// (r, thread): consecutive threads, consecutive 16 bytes).
__device__ __forceinline__ void put(float* dst, const float (&S)[NP][4]) {
#pragma unroll
  for (int r = 0; r < NP; ++r)
    reinterpret_cast<float4*>(dst)[r * kThreads + threadIdx.x] = make_float4(S[r][0], S[r][1], S[r][2], S[r][3]);
}
__device__ __forceinline__ void get(const float* src, float (&S)[NP][4]) {
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const float4 x = reinterpret_cast<const float4*>(src)[r * kThreads + threadIdx.x];
    S[r][0] = x.x; S[r][1] = x.y; S[r][2] = x.z; S[r][3] = x.w;
  }
}
constexpr int kStateFloats = NP * kThreads * 4;  // 128 x 32

// The forward kernels' update, fmaf(g, S, k (beta v)): the recomputed states are bitwise theirs.
__device__ __forceinline__ void advance(const Step& s, float (&S)[NP][4]) {
#pragma unroll
  for (int r = 0; r < NP; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) S[r][e] = fmaf(s.g, S[r][e], s.k[r] * (s.b * s.v[e]));
}

// Launch 1: the forward, S_{c C} into the checkpoints (S_0 included).
template <typename T>
__global__ void __launch_bounds__(kThreads) bwd_forward_kernel(const Args<T> a) {
  const int tile = blockIdx.x % a.vtiles, bh = blockIdx.x / a.vtiles, h = bh % a.H, b = bh / a.H;
  const int tid = threadIdx.x, r0 = tid >> 3, j0 = 32 * tile + 4 * (tid & 7);
  float S[NP][4];
  load_state(a.s0 ? a.s0 + ((int64_t)b * a.H + h) * a.Dk * a.Dv : nullptr, a.Dk, a.Dv, r0, j0, S);
  float* ck = a.ckpt + (int64_t)blockIdx.x * a.nck * kStateFloats;
  Step s;
  for (int t = 0; t < a.T; ++t) {
    if (t % C == 0) put(ck + (int64_t)(t / C) * kStateFloats, S);
    load_step(a, ((int64_t)b * a.T + t) * a.H + h, r0, j0, false, s);
    advance(s, S);
  }
}

// Launch 2: chunks in reverse; each chunk's states S_{c0} .. S_{c1} recomputed into shared memory first.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) bwd_reverse_kernel(const Args<T> a) {
  extern __shared__ __align__(16) float st[];  // (C + 1) states, put() layout
  __shared__ float red_v[2][kWarps][32];       // a step's column sums (dv), a warp's
  __shared__ float red_s[2][kWarps][2];        // a step's tile sums (dgate, dbeta), a warp's
  const int tile = blockIdx.x % a.vtiles, bh = blockIdx.x / a.vtiles, h = bh % a.H, b = bh / a.H;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r0 = tid >> 3, j0 = 32 * tile + 4 * (tid & 7);
  const int64_t part = (int64_t)tile * a.B * a.T * a.H;  // this tile's partials
  float G[NP][4];  // Sh
  load_state(a.dfinal ? a.dfinal + ((int64_t)b * a.H + h) * a.Dk * a.Dv : nullptr, a.Dk, a.Dv, r0, j0, G);
  const float* ck = a.ckpt + (int64_t)blockIdx.x * a.nck * kStateFloats;
  int n = 0;  // steps done (the reduction buffers' parity)
  for (int c = a.nck - 1; c >= 0; --c) {
    const int c0 = c * C, c1 = min(a.T, c0 + C);
    float S[NP][4];
    get(ck + (int64_t)c * kStateFloats, S);
    put(st, S);
    Step s;
    for (int t = c0; t < c1; ++t) {  // only this thread reads back what it puts: no barrier
      load_step(a, ((int64_t)b * a.T + t) * a.H + h, r0, j0, false, s);
      advance(s, S);
      put(st + (t - c0 + 1) * kStateFloats, S);
    }
    for (int t = c1 - 1; t >= c0; --t, ++n) {
      const int64_t row = ((int64_t)b * a.T + t) * a.H + h;
      load_step(a, row, r0, j0, true, s);
      float Sn[NP][4], Sp[NP][4];  // S_{t+1} and S_t in naive's numbering: after and before step t
      get(st + (t - c0 + 1) * kStateFloats, Sn);
      get(st + (t - c0) * kStateFloats, Sp);
      float dq[NP], u[NP], dvp[4] = {0.f, 0.f, 0.f, 0.f}, dgp = 0.f;
#pragma unroll
      for (int r = 0; r < NP; ++r) {
        dq[r] = 0.f;
        u[r] = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          G[r][e] = fmaf(s.q[r], s.dy[e], G[r][e]);  // Sh_t
          dq[r] = fmaf(Sn[r][e], s.dy[e], dq[r]);
          u[r] = fmaf(G[r][e], s.v[e], u[r]);
          dvp[e] = fmaf(G[r][e], s.k[r], dvp[e]);
          dgp = fmaf(G[r][e], Sp[r][e], dgp);
        }
      }
      // rows: the 8 lanes of a row group (lane % 8) hold the tile's 32 columns
#pragma unroll
      for (int r = 0; r < NP; ++r)
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
          dq[r] += __shfl_xor_sync(0xffffffffu, dq[r], o);
          u[r] += __shfl_xor_sync(0xffffffffu, u[r], o);
        }
      float dbp = 0.f;  // k_i u_i over this thread's rows (u complete for the tile after the shuffles)
#pragma unroll
      for (int r = 0; r < NP; ++r) dbp = fmaf(s.k[r], u[r], dbp);
      if ((lane & 7) != 0) dbp = 0.f;  // one lane a row group counts its rows
      // columns: lanes 8 apart share columns (the warp's 4 row groups)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dvp[e] += __shfl_xor_sync(0xffffffffu, dvp[e], 8);
        dvp[e] += __shfl_xor_sync(0xffffffffu, dvp[e], 16);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        dgp += __shfl_xor_sync(0xffffffffu, dgp, o);
        dbp += __shfl_xor_sync(0xffffffffu, dbp, o);
      }
      if (lane < 8)
#pragma unroll
        for (int e = 0; e < 4; ++e) red_v[n & 1][warp][4 * lane + e] = dvp[e];
      if (lane == 0) {
        red_s[n & 1][warp][0] = dgp;
        red_s[n & 1][warp][1] = dbp;
      }
      if ((lane & 7) == 0)
#pragma unroll
        for (int r = 0; r < NP; ++r) {
          const int i = r0 + 32 * r;
          if (i < a.Dk) {
            a.dq[(part + row) * a.Dk + i] = dq[r];
            a.dk[(part + row) * a.Dk + i] = s.b * u[r];
          }
        }
      __syncthreads();  // also: step n - 1's readers of the other buffers are done
      if (tid < 32 && 32 * tile + tid < a.Dv) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += red_v[n & 1][w][tid];
        a.dv[row * a.Dv + 32 * tile + tid] = s.b * sum;
      }
      if (tid == 32) {
        float g = 0.f, bt = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          g += red_s[n & 1][w][0];
          bt += red_s[n & 1][w][1];
        }
        a.dg[part + row] = g;
        a.db[part + row] = bt;
      }
#pragma unroll
      for (int r = 0; r < NP; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) G[r][e] *= s.g;  // towards Sh_{t-1}
    }
  }
  // dS_0 = g_1 Sh_1: G after the last multiplication
  float* ds0 = a.ds0 + ((int64_t)b * a.H + h) * a.Dk * a.Dv;
#pragma unroll
  for (int r = 0; r < NP; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + 32 * r, j = j0 + e;
      if (i < a.Dk && j < a.Dv) ds0[(int64_t)i * a.Dv + j] = G[r][e];
    }
}

template <typename T>
std::vector<torch::Tensor> run(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor gate,
                               torch::Tensor beta, torch::Tensor dy, torch::Tensor s0, torch::Tensor dfinal) {
  const int B = q.size(0), Tn = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  TORCH_CHECK(Dk <= 32 * NP, "D_k <= 128");
  const int vtiles = (Dv + 31) / 32, nck = (Tn + C - 1) / C;
  auto f = q.options().dtype(torch::kFloat);
  auto ckpt = torch::empty({(int64_t)B * H * vtiles * std::max(nck, 1) * kStateFloats}, f);
  auto dq = torch::empty({vtiles, B, Tn, H, Dk}, f), dk = torch::empty({vtiles, B, Tn, H, Dk}, f);
  auto dg = torch::empty({vtiles, B, Tn, H}, f), db = torch::empty({vtiles, B, Tn, H}, f);
  auto dv = torch::empty({B, Tn, H, Dv}, f), ds0 = torch::empty({B, H, Dk, Dv}, f);
  Args<T> a{reinterpret_cast<const T*>(q.data_ptr()), reinterpret_cast<const T*>(k.data_ptr()),
            reinterpret_cast<const T*>(v.data_ptr()), reinterpret_cast<const T*>(gate.data_ptr()),
            reinterpret_cast<const T*>(beta.data_ptr()), reinterpret_cast<const T*>(dy.data_ptr()),
            s0.numel() ? s0.data_ptr<float>() : nullptr, dfinal.numel() ? dfinal.data_ptr<float>() : nullptr,
            ckpt.data_ptr<float>(), dq.data_ptr<float>(), dk.data_ptr<float>(), dg.data_ptr<float>(),
            db.data_ptr<float>(), dv.data_ptr<float>(), ds0.data_ptr<float>(), B, Tn, H, Dk, Dv, vtiles, nck};
  auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned grid = (unsigned)(B * H * vtiles);
  const size_t smem = (size_t)(C + 1) * kStateFloats * sizeof(float);
  static bool opted = false;
  if (!opted) {
    TORCH_CHECK(cudaFuncSetAttribute(bwd_reverse_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ==
                cudaSuccess, "smem attribute");
    opted = true;
  }
  if (grid > 0) {
    bwd_forward_kernel<T><<<grid, kThreads, 0, stream>>>(a);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "bwd_forward launch");
    bwd_reverse_kernel<T><<<grid, kThreads, smem, stream>>>(a);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "bwd_reverse launch");
  }
  return {dq, dk, dv, dg, db, ds0};
}
}  // namespace

std::vector<torch::Tensor> recurrent_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor gate,
                                              torch::Tensor beta, torch::Tensor dy, torch::Tensor s0,
                                              torch::Tensor dfinal) {
  if (q.scalar_type() == torch::kFloat) return run<float>(q, k, v, gate, beta, dy, s0, dfinal);
  if (q.scalar_type() == torch::kHalf) return run<__half>(q, k, v, gate, beta, dy, s0, dfinal);
  return run<__nv_bfloat16>(q, k, v, gate, beta, dy, s0, dfinal);
}
"""


def build():
    return load_inline("dev_recurrent_backward", cpp_sources="std::vector<torch::Tensor> recurrent_backward("
                       "torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor gate, torch::Tensor beta, "
                       "torch::Tensor dy, torch::Tensor s0, torch::Tensor dfinal);", cuda_sources=SRC,
                       functions=["recurrent_backward"], extra_cuda_cflags=["-O3"], verbose=False)


def backward(mod, q, k, v, gate, beta, dy, s0=None, dfinal=None):
    """(dq, dk, dv, dgate, dbeta, dS0), float32; the per-tile partials added in tile order."""
    none = torch.empty(0, device=q.device)
    xs = [x.contiguous() for x in (q, k, v, gate, beta, dy)]
    dq, dk, dv, dg, db, ds0 = mod.recurrent_backward(*xs, none if s0 is None else s0.float().contiguous(),
                                                     none if dfinal is None else dfinal.float().contiguous())
    return dq.sum(0), dk.sum(0), dv, dg.sum(0), db.sum(0), ds0


CASES = [  # (B, T, H, D_k, D_v, gate, initial state, final-state gradient)
    (2, 63, 3, 33, 100, None, True, True), (1, 1, 2, 7, 7, None, False, False), (2, 300, 2, 64, 24, None, True, False),
    (1, 40, 1, 128, 128, None, False, True), (2, 17, 2, 16, 40, 0.0, True, True), (2, 17, 2, 16, 40, (-1.0, 1.0), True, True),
    (2, 17, 2, 16, 40, (1.0, 1.1), False, True), (1, 129, 2, 100, 33, (0.95, 1.0), True, True),
]
NAMES = ("dq", "dk", "dv", "dgate", "dbeta", "dS0")


def check(mod):
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for B, T, H, Dk, Dv, gate, with_s0, with_df in CASES:
            q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=torch.float32)
            if isinstance(gate, float):
                g = torch.full_like(g, gate)
            elif isinstance(gate, tuple):
                g = torch.empty_like(g).uniform_(*gate)
            dy = torch.randn(B, T, H, Dv)
            s0 = torch.randn(B, H, Dk, Dv) if with_s0 else None
            df = torch.randn(B, H, Dk, Dv) if with_df else None
            xs = [x.to(dtype) for x in (q, k, v, g, b, dy)]  # the reference sees the same rounded inputs
            want = naive.recurrent_backward_naive(*[x.float() for x in xs], initial_state=s0, d_final_state=df)
            got = backward(mod, *[x.cuda() for x in xs], None if s0 is None else s0.cuda(),
                           None if df is None else df.cuda())
            errs = {n: rel_l2(gt.cpu().double(), w) for n, gt, w in zip(NAMES, got, want)}
            rows.append({"dtype": str(dtype), "shape": (B, T, H, Dk, Dv), "gate": gate, "s0": with_s0,
                         "dfinal": with_df, "max_err": max(errs.values()), **errs})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    mod = build()
    rows = check(mod)
    for row in rows:
        print(row, flush=True)
    times = []
    for B, T, H, D in [(2, 128, 4, 24), (4, 1024, 8, 64), (8, 2048, 16, 128)]:
        xs = [x.cuda().bfloat16() for x in reference.make_inputs(B, T, H, D, D)] + \
             [torch.randn(B, T, H, D, device="cuda").bfloat16()]
        ms = kernelbench_time(lambda: backward(mod, *xs), [], trials=args.trials)["median"]
        times.append({"shape": (B, T, H, D), "dtype": "bfloat16", "ms": ms})
        print(times[-1], flush=True)
    worst = max(r["max_err"] for r in rows)
    print(f"worst relative L2 error over {len(rows)} cases: {worst:.2e}", flush=True)
    if os.environ.get("OUT"):
        save("recurrent_backward.json", {"device": torch.cuda.get_device_name(0), "checks": rows, "times": times})


if __name__ == "__main__":
    main()
