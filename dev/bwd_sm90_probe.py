"""The Hopper backward's first probes (docs/training-design.md section 7), bf16, sm_90a only; one standalone script,
run from the repository root.

B6, the go / no-go timing of a 64-step chunk's wgmma sequence on dummy data, is retired (twenty-third session):
dev/chunk_bwd_sm90.py (at ae07d82; now solution.py's chunk_bwd_sm90) was that sequence on real data, checked and timed. Its code and results are at commit
2a0ab49 (`git show 2a0ab49:dev/bwd_sm90_probe.py`; `docs/bwd-sm90-probe-s22.json`; perf-notes, twenty-second and
twenty-third sessions). What stays:
- the ceiling of 3 warpgroups a CTA (SS m64n64k16 back to back, one CTA on every SM);
- B1 (after the ceiling): each operand form the design uses against float64 on one warpgroup: SS with A MN-major
  (new here: chunk_sm90 uses MN-major B only), A and B MN-major, B MN-major at K = 128, the accumulator recast to
  RS A fragments in two bf16 terms, and RS m64n128 with B MN-major; the MN-major ones also with LBO and SBO
  exchanged, which must come out wrong. FORMS and wgmma_bf16 served dev/chunk_bwd_sm90.py too (at ae07d82).

    python3 dev/bwd_sm90_probe.py [--trials N]   (writes $OUT/bwd_sm90_probe.json)
    python3 dev/bwd_sm90_probe.py --build-only   (compiles only, no GPU; CUDA_HOME=/usr/local/cuda)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from timing import kernelbench_time  # noqa: E402
from tools.common import save  # noqa: E402
from tools.sm90_build import (BF16_TILE_SRC, PROBE_HELPERS_SRC, build, print_build, probe_cuda,  # noqa: E402
                               solution_function)


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

# After tools/sm90_build.probe_cuda's head (namespace bp; sm_desc, desc_at, dummy; BF16_TILE_SRC: split2, kdesc,
# mdesc).
CUDA_SRC = r"""
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
// Shared memory (bytes). bf16 tiles [k / 8][row][8] (K-major: LBO = rows x 16, SBO 128): q, k, v, dy (64 x 128
// each); G hi / lo (128 x 128 each); the masked weights' hi / lo (64 x 64 each); QK in fp32 (E's input); the
// consumers' output staging (64 x 64 bf16 each); tables; f, e, dbeta, c0 parts; slack past the end for the
// descriptors' reach (dummy layouts). S comes from global memory: its 64 KB do not fit beside the rest.
constexpr int kQ = 0, kK = 16384, kV = 32768, kY = 49152, kGH = 65536, kGL = 98304, kMQH = 131072, kMQL = 139264;
constexpr int kMDH = 147456, kMDL = 155648, kMPH = 163840, kMPL = 172032, kQKF = 180224, kOut = 196608;
constexpr int kTab = 212992, kPart = 214016, kEnd = 217088;
constexpr int kSmem = kEnd + 8192;
static_assert(kSmem <= 232448, "fits the opt-in shared memory of an H200");

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


}  // namespace

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
int bp_peak(float* out, int sms, int iters, cudaStream_t s);
int bp_b1(const float* A, const float* B, const float* B2, float* D, int mode, int swap, cudaStream_t s);
}
static void check(int e, const char* what) {
  TORCH_CHECK(e == 0, what, ": ", cudaGetErrorString((cudaError_t)e));
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
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    cuda = probe_cuda("bp", WGMMA_SRC, CUDA_SRC, PROBE_HELPERS_SRC + BF16_TILE_SRC)
    mod, summary = build("bwd_sm90_probe", HOST_SRC, cuda, ["peak", "b1"], "bp")
    print_build(summary)
    res = {"build": summary}
    if args.build_only:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 384, device="cuda")
    res.update(device=torch.cuda.get_device_name(0), sms=sms)
    iters = 2000
    ms = kernelbench_time(mod.peak, (out, sms, iters), trials=args.trials, warmup=2, flush=False)["median"]
    tflops = sms * 3 * iters * 8 * UNIT_FLOP / (ms * 1e-3) / 1e12
    res["peak_tflops"] = tflops
    print(f"ceiling: 3 warpgroups a CTA, SS m64n64k16 back to back: {tflops:6.1f} TFLOPS "
          f"(= {sms * 192 * UNIT_FLOP / (tflops * 1e12) * 1e6:.2f} us for a 192-unit chunk)", flush=True)
    save("bwd_sm90_probe.json", res)
    res["B1"] = probe_b1(mod)  # after the ceiling: a wrong descriptor here could poison the context
    save("bwd_sm90_probe.json", res)


if __name__ == "__main__":
    main()
