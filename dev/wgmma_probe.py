"""Probe for a wgmma chunk_v4. Fifth session, run 6 (under compute-sanitizer): LBO = stride between core
matrices adjacent in K and SBO = adjacent in M/N is right (rel err 8e-4, TF32's), the swapped reading
is wrong; the fourth combination read past the then 4 KB operand area (fixed: 12 KB each).

1. Which shared-memory layout and descriptor convention TF32 wgmma reads. A 64x8 (A, K-major) and a
   64x8 (B^T, K-major) operand are staged as 8x4 "core matrices" (8 rows of 16 bytes, rows 16 bytes
   apart) in two physical orders (K-neighbours 128 bytes apart, or row-block neighbours 128 bytes
   apart), and each order is read with both (LBO, SBO) assignments. The PTX ISA says LBO is the byte
   distance between core matrices adjacent in K and SBO between those adjacent in M/N (no swizzle);
   the combination whose product matches float64 (TF32 error, ~3e-4) settles it.
2. TF32 wgmma throughput (m64nNk8, N = 64, 128, 256, operands in shared memory, every SM busy), to
   set against mma.sync's 310 TFLOPS (dev/mma_peak.py) and the 494 of the datasheet.

    python3 dev/wgmma_probe.py        (writes $OUT/wgmma_probe.json)

Needs the sm_90a target (wgmma): TORCH_CUDA_ARCH_LIST is set to 9.0a for this build only.
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


def wgmma_asm(n):
    """The inline-asm statement of one wgmma.m64n{n}k8.f32.tf32.tf32 accumulating into d[0 .. n/2)."""
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1;\\n}}\\n"'
            f' : {", ".join(f"{chr(34)}+f{chr(34)}(d[{i}])" for i in range(regs))}'
            f' : "l"(da), "l"(db), "r"(1));')


SRC = r"""
#include <torch/extension.h>
#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GR_WGMMA 1
#endif

__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = (uint64_t)((uint32_t)__cvta_generic_to_shared(p) & 0x3FFFF) >> 4;
  return addr | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}

// Element (r, k) of an R x 8 K-major TF32 operand at byte (r / 8) * rs + (k / 4) * ks + (r % 8) * 16 + (k % 4) * 4.
__device__ __forceinline__ void stage(unsigned char* base, const float* src, int rows, int ks, int rs) {
  for (int e = threadIdx.x; e < rows * 8; e += blockDim.x) {
    const int r = e / 8, k = e % 8;
    *reinterpret_cast<float*>(base + (r / 8) * rs + (k / 4) * ks + (r % 8) * 16 + (k % 4) * 4) = src[e];
  }
}

template <int N>
__device__ __forceinline__ void wgmma_n(float (&d)[N / 2], uint64_t da, uint64_t db);

template <> __device__ __forceinline__ void wgmma_n<64>(float (&d)[32], uint64_t da, uint64_t db) {
#ifdef GR_WGMMA
  WGMMA_64
#endif
}
template <> __device__ __forceinline__ void wgmma_n<128>(float (&d)[64], uint64_t da, uint64_t db) {
#ifdef GR_WGMMA
  WGMMA_128
#endif
}
template <> __device__ __forceinline__ void wgmma_n<256>(float (&d)[128], uint64_t da, uint64_t db) {
#ifdef GR_WGMMA
  WGMMA_256
#endif
}

__device__ __forceinline__ void wg_fence() {
#ifdef GR_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit_wait() {
#ifdef GR_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// One warpgroup: D (64 x 64) = A (64 x 8) B (64 x 8)^T, operands staged with the given layout. Each
// operand gets 12 KB although it fills 2 KB: a wrong (LBO, SBO) reading reaches 7.4 KB past its start
// (with 4 KB, the fourth combination read past the allocation: "illegal memory access", fifth session).
constexpr int kOperandB = 12288;
__global__ void layout_probe(const float* A, const float* B, float* D, int ks, int rs, int lbo, int sbo) {
  extern __shared__ __align__(1024) unsigned char smem[];
  stage(smem, A, 64, ks, rs);
  stage(smem + kOperandB, B, 64, ks, rs);
#ifdef GR_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy stores -> wgmma reads
#endif
  __syncthreads();
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  wg_fence();
  wgmma_n<64>(d, smem_desc(smem, lbo, sbo), smem_desc(smem + kOperandB, lbo, sbo));
  wg_commit_wait();
  // Accumulator layout: warp w owns rows 16w..16w+15; d[i] is (16w + g + 8 * ((i / 2) % 2), 8 * (i / 4) + 2q + i % 2).
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, q = l % 4;
  for (int i = 0; i < 32; ++i) D[(16 * w + g + 8 * ((i / 2) % 2)) * 64 + 8 * (i / 4) + 2 * q + i % 2] = d[i];
}

template <int N>
__global__ void rate_probe(float* out, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int e = threadIdx.x; e < (2048 + N * 32) / 4; e += blockDim.x)
    reinterpret_cast<float*>(smem)[e] = 1.f + 1e-3f * (e % 97);
#ifdef GR_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint64_t da = smem_desc(smem, 128, 256), db = smem_desc(smem + 2048, 128, 256);
  wg_fence();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int u = 0; u < 4; ++u) wgmma_n<N>(d, da, db);
  }
  wg_commit_wait();
  float s = 0.f;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

void layout(torch::Tensor A, torch::Tensor B, torch::Tensor D, int64_t ks, int64_t rs, int64_t lbo, int64_t sbo) {
  layout_probe<<<1, 128, 2 * kOperandB>>>(A.data_ptr<float>(), B.data_ptr<float>(), D.data_ptr<float>(), (int)ks, (int)rs,
                                 (int)lbo, (int)sbo);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "layout_probe launch failed");
}

void rate(torch::Tensor out, int64_t blocks, int64_t n, int64_t iters) {
  const size_t smem = 2048 + n * 32;
  if (n == 64) rate_probe<64><<<blocks, 128, smem>>>(out.data_ptr<float>(), (int)iters);
  if (n == 128) rate_probe<128><<<blocks, 128, smem>>>(out.data_ptr<float>(), (int)iters);
  if (n == 256) rate_probe<256><<<blocks, 128, smem>>>(out.data_ptr<float>(), (int)iters);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "rate_probe launch failed");
}
"""


def build():
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    src = SRC
    for n in (64, 128, 256):
        src = src.replace(f"WGMMA_{n}\n", wgmma_asm(n) + "\n")
    return load_inline("wgmma_probe", cpp_sources="void layout(torch::Tensor, torch::Tensor, torch::Tensor, int64_t, "
                       "int64_t, int64_t, int64_t);\nvoid rate(torch::Tensor, int64_t, int64_t, int64_t);",
                       cuda_sources=src, functions=["layout", "rate"], extra_cuda_cflags=["-O3"])


def main():
    mod = build()
    result = {"layouts": [], "rates": []}
    A, B = torch.randn(64, 8, device="cuda"), torch.randn(64, 8, device="cuda")
    ref = A.double() @ B.double().T
    for name, ks, rs in [("K-neighbours 128 B apart", 128, 256), ("row-block neighbours 128 B apart", 1024, 128)]:
        for lbo, sbo in [(ks, rs), (rs, ks)]:
            D = torch.full((64, 64), float("nan"), device="cuda")
            mod.layout(A, B, D, ks, rs, lbo, sbo)
            torch.cuda.synchronize()
            err = ((D.double() - ref).norm() / ref.norm()).item()
            row = {"layout": name, "ks": ks, "rs": rs, "lbo": lbo, "sbo": sbo, "rel_err": err}
            result["layouts"].append(row)
            print(f"{name:34s} LBO={lbo:5d} SBO={sbo:5d}: rel err {err:.2e}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in (64, 128, 256):
        blocks, iters = sms * 4, 2048
        out = torch.empty(blocks * 128, device="cuda")
        t = kernelbench_time(mod.rate, (out, blocks, n, iters), trials=5, flush=False)["median"] * 1e-3
        tflops = blocks * iters * 4 * 2 * 64 * n * 8 / t / 1e12
        result["rates"].append({"n": n, "tflops": tflops})
        print(f"wgmma m64n{n}k8 tf32: {tflops:6.1f} TFLOPS", flush=True)
    save("wgmma_probe.json", result)


if __name__ == "__main__":
    main()
