"""Does compute-sanitizer racecheck follow chunk_sm90's producer/consumer named barriers?

chunk_sm90's aux warpgroup writes shared memory and signals with `bar.arrive id, 256`; a consumer warpgroup
waits with `bar.sync id, 256`, reads, and signals back the same way before the slot is rewritten two
chunks later. Racecheck reported hazards between the aux's P' stores and the consumers' scalar P' reads
(the NaN fallback path) but none on the gate tables, which travel the same barriers. Each variant below
is one step of that sequence in isolation, with 384 threads and the kernel's barrier ids; racecheck's
report per variant says which step it does not follow.

    compute-sanitizer --tool racecheck python3 dev/racecheck_named_barriers.py

variant 0: aux stores, bar.arrive; consumer bar.sync, loads 32-bit, bar.arrive back (the bare protocol)
variant 1: as 0, the aux warpgroup's own bar.sync (128) after its stores (the gate tables' order)
variant 2: as 0, the aux's own bar.sync before its stores (P''s order)
variant 3: as 2, then fence.proxy.async and membar.cta before the arrive (P''s exact sequence)
variant 4: as 3, the consumer loads 16-bit halves of the 32-bit stores (the fallback's reads)
variant 5: as 4, only one warp of each consumer warpgroup loads (the fallback runs in the bad warp only)
"""
import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <cstdint>
__device__ __forceinline__ void arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void wait(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void own(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

template <int V>
__global__ void __launch_bounds__(384, 1) probe(float* out, int nch) {
  __shared__ uint32_t buf[2][2048];  // two slots, as chunk_sm90's derived slots
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  if (wg == 0) {
    for (int c = 0; c < nch; ++c) {
      if (c >= 2) { wait(8 + (c & 1)); wait(10 + (c & 1)); }
      if (V >= 2) own(0);
      for (int e = t; e < 2048; e += 128) buf[c & 1][e] = 0x3f803f80u + c;
      if (V == 1) own(0);
      if (V >= 3) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __threadfence_block();
      }
      arrive(4 + (c & 1));
      arrive(6 + (c & 1));
    }
    for (int c = nch > 2 ? nch - 2 : 0; c < nch; ++c) { wait(8 + (c & 1)); wait(10 + (c & 1)); }
    return;
  }
  const int cw = wg - 1;
  float acc = 0.f;
  for (int c = 0; c < nch; ++c) {
    wait(4 + 2 * cw + (c & 1));
    const bool reads = V < 5 || (t / 32) == 1;
    if (reads) {
      for (int e = t; e < 2048; e += 128) {
        if (V >= 4) {
          const uint16_t* h = reinterpret_cast<const uint16_t*>(&buf[c & 1][e]);
          acc += float(h[0]) + float(h[1]);
        } else {
          acc += float(buf[c & 1][e]);
        }
      }
    }
    arrive(8 + 2 * cw + (c & 1));
  }
  out[blockIdx.x * 384 + tid] = acc;
}

torch::Tensor run(int64_t variant, int64_t nch) {
  auto out = torch::zeros({384}, torch::dtype(torch::kFloat32).device(torch::kCUDA));
  switch (variant) {
    case 0: probe<0><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
    case 1: probe<1><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
    case 2: probe<2><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
    case 3: probe<3><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
    case 4: probe<4><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
    default: probe<5><<<1, 384>>>(out.data_ptr<float>(), int(nch)); break;
  }
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "probe launch");
  return out;
}
"""

mod = load_inline("racecheck_named_barriers", cpp_sources="torch::Tensor run(int64_t variant, int64_t nch);",
                  cuda_sources=SRC, functions=["run"], extra_cuda_cflags=["-O3"], verbose=False)
for variant in range(6):
    mod.run(variant, 6)
    torch.cuda.synchronize()
    print(f"variant {variant}: ran", flush=True)
