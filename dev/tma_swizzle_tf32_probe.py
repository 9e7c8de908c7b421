"""TMA with 128-byte swizzle for chunk_sm90's float32 (TF32) instantiation (docs/fwd-tf32-sw128-s36.md): settles, on
the device, the layout and the wgmma descriptors that dev/chunk_sm90_tf32_s36_sw128.patch uses, before its bitwise A/B.

Every tile is one 64-step tile of a (B, T, H, 128) float32 tensor, moved by a 5-D map built as solution.py's tile_map
builds it: dimensions {e, T, 128 / e, H, B}, byte strides {t, e * 4, h, b}, box {e, 64, groups, 1, 1}; e = 32 floats
(a 128-byte row, CU_TENSOR_MAP_SWIZZLE_128B, "sw128") or 4 floats (16 bytes, no swizzle: today's "nosw16", the
control). Shared memory is 1024-byte aligned; element (r, c) of a tile is at
    sw128:  swf_off(r, c) = (c / 32) 8192 + 128 r + ((((c / 4) ^ r) & 7) << 4) + 4 (c % 4)
    nosw16: (c / 4) 1024 + 16 r + 4 (c % 4)
Cases (each prints PASS or FAIL; a wrong layout shows errors of order 1):
  LOAD  a tile by TMA, every element read back by threads at its offset: bitwise equal to the tensor (checks the
        box landing and swf_off: the patch's k transpose, V^T reads).
  STORE a 64 x 64 half (cg0 = 2 half for sw128, 16 half for nosw16) written by threads at its offsets, one TMA
        store: bitwise equal where written, the rest untouched (the patch's y staging and store).
  SS    D = Q K^T, wgmma m64n64k8 TF32 SS, 16 k-steps over D = 128, A = q and B = k tiles, both K-major. sw128:
        descriptor layout type 1 (bits 62-63), SBO 1024 (8-row groups), LBO 16 (or 0: ignored for K-major swizzled),
        the k-step's start +32 bytes inside the 128-byte row (k-steps 0-3 of a group), then +8192 (the next 32
        columns): solution.py's sw_desc(p, 16) + sw_kstep(kb). nosw16: LBO 1024, SBO 128, k-step 2048 (HEAD's).
  RS    D = X Q^T, wgmma m64n64k8 TF32 RS (A = X from registers, B = the q tile): the form the patch's P^T and O1
        use (B = QS hi / lo). Same descriptors as SS's B.
  NEG   the sw128 tiles read with a no-swizzle descriptor (LBO 1024, SBO 128): must FAIL (shows the check
        discriminates). In bounds (it reads inside the two 32 KB regions), but last.
Inputs are rounded to TF32 first (products exact in fp32), so SS / RS match torch float64 to about 1e-6 relative;
the tolerance is 1e-4 of max |D|. No candidate here can address past the 64 KB of operands (the largest start is
24,672 + 7 x 1024 + 128 into a 32 KB region), so one process runs them all; --isolate runs each case in its own
process anyway (a fault then costs only that case).

    python3 dev/tma_swizzle_tf32_probe.py [--isolate] [--case NAME]   (writes $OUT/tma_swizzle_tf32_probe.json)
    python3 dev/tma_swizzle_tf32_probe.py --build-only                (compiles; no GPU; ptxas registers, warnings)
    Expected: every case PASS except NEG (FAIL), then "PATCH FORMS: PASS".

Built through tools/sm90_build.py (load_inline, sm_90a, -O3, ptxas -v); the TF32 wgmma forms are solution.py's
generator (_wgmma, via tf32_wgmma_src) and warpgroup helpers (WGMMA_SYNC_SRC), mbarriers from MBAR_SRC, read from its
source text (solution is not imported).
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from tools.common import save  # noqa: E402
from tools.sm90_build import build, print_build, probe_cuda, solution_source, tf32_wgmma_src  # noqa: E402

FORMS = tf32_wgmma_src(rs_forms=(False, True))

CUDA_SRC = solution_source("TMA_ENCODE_SRC") + solution_source("MBAR_SRC") + r"""
// ---- TMA (mbar_init, mbar_expect, mbar_wait: solution.py's MBAR_SRC, before this text) ----
__device__ __forceinline__ void tma5(void* dst, const CUtensorMap* map, int c1, int c2, int c3, int c4, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
               ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(map), "r"(0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
                 "r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
}
__device__ __forceinline__ void tma5_store(const CUtensorMap* map, const void* src, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n"
               ::"l"(map), "r"(0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"((uint32_t)__cvta_generic_to_shared(src))
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// A shared-memory matrix descriptor with its layout type (bits 62-63: 0 none, 1 128B swizzle).
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t layout) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)layout << 62);
}
// Byte offset of fp32 element (r, c) of a tile: sw128 (solution.py's sw_off<4>) or the no-swizzle core matrices.
__device__ __forceinline__ uint32_t tile_off(bool sw, int r, int c) {
  return sw ? (uint32_t)((c >> 5) * 8192 + r * 128 + ((((c >> 2) ^ r) & 7) << 4) + (c & 3) * 4)
            : (uint32_t)((c >> 2) * 1024 + r * 16 + (c & 3) * 4);
}

struct Maps2 {
  CUtensorMap m[2];
};
// B's (or SS A's) descriptor of k-step kb: start = region + (kb / per) group + (kb % per) inner.
struct Operand {
  uint32_t inner, per, group, lbo, sbo, layout;
};
struct Where {  // a tile's coordinates (t0, h, b) and, for stores, the column group cg0 / the half
  int t0, h, b, cg0, half;
};
constexpr int kRegion = 32768;  // operand A (or the loaded tile) at 0, B at 32 KB, the mbarrier at 64 KB

// MODE 0: load map 0's tile, out[64][128] from shared memory at tile_off. 1: store: in[64][64] written at tile_off
// into columns 64 half .. (as the patch's y half: its own base, 16 KB half), map 1's TMA store at cg0.
// 2: SS D = A B^T (A = map 0's tile, B = map 1's), out[64][64]. 3: RS D = X B^T (X [64][128] from global memory).
template <int MODE>
__global__ void __launch_bounds__(128) probe_kernel(const __grid_constant__ Maps2 maps, const Where w, bool sw,
                                                     const Operand oa, const Operand ob, const float* in, float* out) {
#ifdef GR_WGMMA
  extern __shared__ unsigned char smraw[];
  unsigned char* sm = smraw + ((1024 - ((uint32_t)__cvta_generic_to_shared(smraw) & 1023)) & 1023);
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm + 2 * kRegion);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  if (MODE == 1) {
    unsigned char* ys = sm + 16384 * w.half;
    for (int e = tid; e < 64 * 64; e += 128) {
      const int r = e >> 6, c = e & 63;
      *reinterpret_cast<float*>(ys + tile_off(sw, r, c)) = in[e];
    }
    fence_async_smem();
    __syncthreads();
    if (tid == 0) tma5_store(&maps.m[1], ys, w.t0, w.cg0, w.h, w.b);
    return;
  }
  if (tid == 0) {
    mbar_init(bar);
    mbar_expect(bar, MODE == 2 ? 2 * kRegion : kRegion);
    tma5(sm + (MODE == 3 ? kRegion : 0), &maps.m[0], w.t0, 0, w.h, w.b, bar);
    if (MODE == 2) tma5(sm + kRegion, &maps.m[1], w.t0, 0, w.h, w.b, bar);
  }
  __syncthreads();
  mbar_wait(bar, 0);
  if (MODE == 0) {
    for (int e = tid; e < 64 * 128; e += 128) out[e] = *reinterpret_cast<const float*>(sm + tile_off(sw, e >> 7, e & 127));
    return;
  }
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(sm);
  float d[32];
#pragma unroll
  for (int kb = 0; kb < 16; ++kb) {
    const uint64_t db = desc(s0 + kRegion + (kb / ob.per) * ob.group + (kb % ob.per) * ob.inner, ob.lbo, ob.sbo,
                             ob.layout);
    if constexpr (MODE == 2) {
      const uint64_t da = desc(s0 + (kb / oa.per) * oa.group + (kb % oa.per) * oa.inner, oa.lbo, oa.sbo, oa.layout);
      wg_fence();
      if (kb == 0) wgmma_tf32_ss_z(d, da, db);
      else wgmma_tf32_ss(d, da, db, 1);
    } else {
      uint32_t a[4];  // a[r]: X[16 warp + g + 8 (r & 1)][8 kb + qd + 4 (r >> 1)]
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = __float_as_uint(in[(16 * warp + g + 8 * (r & 1)) * 128 + 8 * kb + qd + 4 * (r >> 1)]);
      wg_fence();
      if (kb == 0) wgmma_tf32_rs_z(d, a, db);
      else wgmma_tf32_rs(d, a, db, 1);
    }
    wg_commit();
  }
  wg_wait<0>();
  acc_fence(d);
#pragma unroll
  for (int i = 0; i < 32; ++i) out[(16 * warp + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * qd + (i & 1)] = d[i];
#endif
}

// (get_encode: solution.py TMA_ENCODE_SRC, at the top)

// tile_map's 5-D map of a (B, T, H, 128) float32 tensor (strides in elements): sw128 or nosw16, box groups.
static int encode_map(CUtensorMap* m, const void* base, bool sw, int64_t T, int64_t H, int64_t B, int64_t st,
                      int64_t sh, int64_t sb, int groups) {
  const auto encode = get_encode();
  if (encode == nullptr) return -1;
  const int ew = sw ? 128 : 16, e = ew / 4;
  const cuuint64_t dims[5] = {(cuuint64_t)e, (cuuint64_t)T, (cuuint64_t)(128 / e), (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[4] = {(cuuint64_t)(st * 4), (cuuint64_t)ew, (cuuint64_t)(sh * 4), (cuuint64_t)(sb * 4)};
  const cuuint32_t box[5] = {(cuuint32_t)e, 64, (cuuint32_t)groups, 1, 1}, one[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, const_cast<void*>(base), dims, strides, box, one,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, sw ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : 1000 + (int)r;
}

}  // namespace
}  // namespace tsp

struct Tens {  // a (B, T, H, 128) float32 tensor: base and strides in elements
  const void* p;
  int64_t B, T, H, sb, st, sh;
};

// mode as probe_kernel's; a, b: the tensors of maps 0 and 1 (mode 1: b is y); in / out: device buffers.
int tsp_launch(int mode, Tens a, Tens b, bool sw, const int* wh, const unsigned* oa_, const unsigned* ob_,
               const float* in, float* out, cudaStream_t s) {
  using namespace tsp;
  Maps2 maps;
  const int groups = sw ? 4 : 32;
  int r = mode == 1 ? 0 : encode_map(&maps.m[0], a.p, sw, a.T, a.H, a.B, a.st, a.sh, a.sb, groups);
  if (r != 0) return r;
  if (mode == 1 || mode == 2) {
    r = encode_map(&maps.m[1], b.p, sw, b.T, b.H, b.B, b.st, b.sh, b.sb, mode == 1 ? groups / 2 : groups);
    if (r != 0) return r;
  }
  const Where w{wh[0], wh[1], wh[2], wh[3], wh[4]};
  const Operand oa{oa_[0], oa_[1], oa_[2], oa_[3], oa_[4], oa_[5]}, ob{ob_[0], ob_[1], ob_[2], ob_[3], ob_[4], ob_[5]};
  const int smem = 2 * kRegion + 64 + 1024;
  const auto k = mode == 0 ? probe_kernel<0> : mode == 1 ? probe_kernel<1> : mode == 2 ? probe_kernel<2> : probe_kernel<3>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  k<<<1, 128, smem, s>>>(maps, w, sw, oa, ob, in, out);
  return (int)cudaGetLastError();
}
"""

HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

struct Tens {
  const void* p;
  int64_t B, T, H, sb, st, sh;
};
int tsp_launch(int mode, Tens a, Tens b, bool sw, const int* wh, const unsigned* oa_, const unsigned* ob_,
               const float* in, float* out, cudaStream_t s);

static Tens tens(const torch::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4 && x.size(3) == 128 && x.scalar_type() == torch::kFloat32,
              "a (B, T, H, 128) float32 CUDA tensor");
  const int64_t st = x.stride(1), sh = x.size(2) == 1 ? x.size(1) * st : x.stride(2),
                sb = x.size(0) == 1 ? x.size(2) * sh : x.stride(0);
  return Tens{x.data_ptr(), x.size(0), x.size(1), x.size(2), sb, st, sh};
}

// where: (t0, h, b, cg0, half); oa, ob: (inner, per, group, lbo, sbo, layout); in: mode 1 the 64 x 64 source, mode 3
// X (64 x 128); returns out (mode 0: 64 x 128; 2, 3: 64 x 64; 1: empty).
torch::Tensor tsp_run(int64_t mode, torch::Tensor a, torch::Tensor b, bool sw, std::vector<int64_t> where,
                      std::vector<int64_t> oa, std::vector<int64_t> ob, torch::Tensor in) {
  TORCH_CHECK(where.size() == 5 && oa.size() == 6 && ob.size() == 6, "where: 5 values, oa / ob: 6");
  int wh[5];
  unsigned pa[6], pb[6];
  for (int i = 0; i < 5; ++i) wh[i] = (int)where[i];
  for (int i = 0; i < 6; ++i) { pa[i] = (unsigned)oa[i]; pb[i] = (unsigned)ob[i]; }
  auto out = torch::full({64, mode == 0 ? 128 : 64}, NAN, a.options());
  TORCH_CHECK(in.is_cuda() && in.is_contiguous() && in.scalar_type() == torch::kFloat32, "in: contiguous float32");
  const int r = tsp_launch((int)mode, tens(a), tens(b), sw, wh, pa, pb, in.data_ptr<float>(), out.data_ptr<float>(),
                           c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(r == 0, "tsp_launch: ", r);
  return out;
}
"""
FUNCTIONS = ["tsp_run"]

# Descriptor operands (inner, per, group, lbo, sbo, layout): a k-step's start = (kb / per) group + (kb % per) inner.
SW_K = lambda lbo: (32, 4, 8192, lbo, 1024, 1)  # noqa: E731  (the patch: sw_desc(p, 16) + sw_kstep(kb))
NOSW_K = (2048, 1 << 20, 0, 1024, 128, 0)     # HEAD: sm_desc(p + 2048 kb, 1024, 128)
CASES = ["LOAD nosw16", "LOAD sw128", "STORE nosw16", "STORE sw128", "SS nosw16", "SS sw128 lbo=16",
         "SS sw128 lbo=0", "RS nosw16", "RS sw128 lbo=16", "NEG sw128 tiles, no-swizzle descriptor"]
PATCH_FORMS = ["LOAD sw128", "STORE sw128", "SS sw128 lbo=16", "RS sw128 lbo=16"]


def tf32(x):
    """x rounded to TF32 (nearest, low 13 mantissa bits zero): the tensor core then reads it exactly."""
    import torch
    i = x.contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def run_case(mod, name):
    import torch
    torch.manual_seed(0)
    B, T, H = 2, 256, 3
    t0, h, bb = 128, 2, 1
    # strided like a real input: (B, H, T, D) storage seen as (B, T, H, D)
    q = tf32(torch.randn(B, H, T, 128, device="cuda")).transpose(1, 2)
    k = tf32(torch.randn(B, H, T, 128, device="cuda")).transpose(1, 2)
    x = tf32(torch.randn(64, 128, device="cuda"))
    qt, kt = q[bb, t0:t0 + 64, h], k[bb, t0:t0 + 64, h]
    where = [t0, h, bb, 0, 0]
    none = torch.zeros(1, device="cuda")
    sw = "sw128" in name
    if name.startswith("LOAD"):
        out = mod.tsp_run(0, q, q, sw, where, [0] * 6, [0] * 6, none)
        torch.cuda.synchronize()
        bad = (out != qt).sum().item()
        return {"mismatches": bad, "pass": bad == 0}
    if name.startswith("STORE"):
        bad = 0
        for half in (0, 1):
            y = torch.full((B, T, H, 128), float("nan"), device="cuda")
            src = torch.randn(64, 64, device="cuda")
            mod.tsp_run(1, y, y, sw, [t0, h, bb, (2 if sw else 16) * half, half], [0] * 6, [0] * 6, src)
            torch.cuda.synchronize()
            want = torch.full_like(y, float("nan"))
            want[bb, t0:t0 + 64, h, 64 * half:64 * half + 64] = src
            bad += ((y != want) & ~(y.isnan() & want.isnan())).sum().item()
        return {"mismatches": bad, "pass": bad == 0}
    if name.startswith("NEG"):
        oa = ob = NOSW_K
        sw = True
    else:
        oa = ob = SW_K(0 if "lbo=0" in name else 16) if sw else NOSW_K
    if name.startswith("RS"):
        out = mod.tsp_run(3, q, q, sw, where, list(oa), list(ob), x)
        want = x.double() @ qt.double().T
    else:
        out = mod.tsp_run(2, q, k, sw, where, list(oa), list(ob), none)
        want = qt.double() @ kt.double().T
    torch.cuda.synchronize()
    err = (out.double() - want).abs().max().item()
    scale = want.abs().max().item()
    ok = err <= 1e-4 * max(scale, 1.0)
    return {"max_err": err, "scale": scale, "pass": ok}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-only", action="store_true", help="compile and print ptxas registers/warnings; no GPU")
    ap.add_argument("--isolate", action="store_true", help="each case in its own process")
    ap.add_argument("--case", choices=CASES, help="run this case only (prints one JSON line)")
    ap.add_argument("--verbose-build", action="store_true")
    args = ap.parse_args()
    if args.isolate and not args.case:
        result = {"cases": {}}
        for name in CASES:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", name], capture_output=True,
                               text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(line[-1]) if p.returncode == 0 and line else \
                {"pass": False, "error": f"rc {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"}
            result["cases"][name] = r
            print(f"  {name}: {'PASS' if r['pass'] else 'FAIL'}  {json.dumps(r)}", flush=True)
        return finish(result)
    cuda = probe_cuda("tsp", FORMS, CUDA_SRC, helpers="", includes=("cuda.h", "cudaTypedefs.h", "cuda_runtime.h"))
    mod, summary = build("tma_swizzle_tf32_probe", HOST_SRC, cuda, FUNCTIONS, "tsp", verbose=args.verbose_build)
    if args.case:
        print(json.dumps(run_case(mod, args.case)), flush=True)
        return
    print_build(summary)
    result = {"build": summary, "cases": {}}
    if args.build_only:
        return
    import torch
    result["device"] = torch.cuda.get_device_name(0)
    for name in CASES:
        try:
            r = run_case(mod, name)
        except Exception as e:  # noqa: BLE001 (a case's failure is its result; a sticky error ends the run)
            r = {"pass": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        result["cases"][name] = r
        print(f"  {name}: {'PASS' if r['pass'] else 'FAIL'}  {json.dumps(r)}", flush=True)
    finish(result)


def finish(result):
    cases = result["cases"]
    neg = next((r for n, r in cases.items() if n.startswith("NEG")), None)
    forms = all(cases.get(n, {}).get("pass") for n in PATCH_FORMS)
    print(f"PATCH FORMS: {'PASS' if forms else 'FAIL'}"
          f"{'' if neg is None or not neg['pass'] else '  (but NEG passed: the check does not discriminate)'}", flush=True)
    save("tma_swizzle_tf32_probe.json", result)  # ($OUT/tma_swizzle_tf32_probe.json)


if __name__ == "__main__":
    main()
