"""chunk_sm90 (issue 14): the probes that settled its wgmma operand layouts, and a harness that checks
and times the production kernel (solution.py's CHUNK_SM90_SRC, unit chunk_sm90) against the float64
loop, chunk_bf16 and fla.

1. Probes (one warpgroup, 64 x 64 bf16 operands against torch): SS with A and B K-major in the
   no-swizzle core-matrix layout (element (r, c) at byte (c / 8) 1024 + 16 r + 2 (c % 8)); B stored
   [k][n] read MN-major under both readings of LBO / SBO; RS with A fragments from ldmatrix.trans of a
   [k][m] tile; RS with A packed from a previous accumulator. Tenth session, device run 1: LBO = 128 (K
   direction), SBO = 1024 (MN direction) for MN-major is right (6.6e-8), the other reading wrong (1.3);
   every other layout 6.5e-8 to 6.8e-8 (bf16 inputs exact, fp32 accumulation). Added after that run and
   still not run: a TMA load of one tile, a {8, 1, 64, 1} box per column group of a (B, T, H, D) map,
   compared byte for byte with the layout built by torch. The eleventh session's kernel took the one-box
   route instead (a 5-D map {8, T, D/8, H, B}, box {8, 64, D/8, 1, 1}), which the self-check below
   confirms through the production kernel.
2. Self-check of chunk_sm90 through solution._gated_recurrence_with(kernel="chunk_sm90", config=(segments,)):
   shapes with D_k 64 / 128, segments, gate classes, NaN and inf, states, float32 gates, each against
   1.1x the exact answer's own bf16 rounding.
3. Timing (KernelBench median) of chunk_sm90, chunk_bf16 and fla's chunk_simple_gla (when importable,
   DEV_FLA=1) at the issue's bf16 shapes.

    python3 dev/chunk_sm90.py [--trials 20] [--no-timing]     (writes $OUT/dev_chunk_sm90.json with OUT set)
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
import solution  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from tools.common import save  # noqa: E402


# The probe kernel; it builds on solution's CHUNK_SM90_SRC helpers (descriptors, the core-matrix layout,
# fences) and its generated wgmma instructions, plus the two SS forms the kernel itself does not use.
PROBE_SRC = r"""
#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
namespace gr {
namespace {
__device__ __forceinline__ uint32_t pack2(float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  return reinterpret_cast<const uint32_t&>(h);
}
// ---- layout probes: D (64 x 64, fp32) from 64 x 64 bf16 operands, one warpgroup.
// mode 0: SS, A [m][k], B [n][k] (K-major). mode 1: SS, B stored [k][n] read MN-major with (lbo, sbo).
// mode 2: RS, A stored [k][m], fragments by ldmatrix.trans; B [n][k]. mode 3: RS, A = bf16 of an
// accumulator C1 = A B^T (mode 0), times B2 [n][k]. mode 4: as 2, B stored [k][n] read MN-major.
__global__ void probe_kernel(int mode, const bf16* A, const bf16* B, const bf16* B2, float* D, int lbo, int sbo) {
  extern __shared__ __align__(1024) unsigned char sm[];
  unsigned char *sa = sm, *sbm = sm + 8192, *sb2 = sm + 16384;
  for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) {
    const int r = e / 64, c = e % 64;
    *reinterpret_cast<bf16*>(sa + cm_off(r, c)) = A[e];
    *reinterpret_cast<bf16*>(sbm + cm_off(r, c)) = B[e];
    *reinterpret_cast<bf16*>(sb2 + cm_off(r, c)) = B2[e];
  }
  fence_async_smem();
  __syncthreads();
  const int lane = threadIdx.x & 31, wl = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  const uint64_t da = sm_desc(sa, 1024, 128), db = sm_desc(sbm, 1024, 128), db2 = sm_desc(sb2, 1024, 128);
  const uint64_t dbm = sm_desc(sbm, (uint32_t)lbo, (uint32_t)sbo);
  uint32_t af[4][4];
  if (mode == 2 || mode == 4)
    for (int kb = 0; kb < 4; ++kb) {
      const int m = lane >> 3, s = 16 * kb + 8 * (m >> 1) + (lane & 7), dv = 16 * wl + 8 * (m & 1);
      ldm4<true>(af[kb], sa + cm_off(s, dv));
    }
  wg_fence();
  if (mode == 0 || mode == 3) {
    for (int kb = 0; kb < 4; ++kb) wgmma_ss64(d, desc_at(da, 2048 * kb), desc_at(db, 2048 * kb), 1);
  } else if (mode == 1) {
    for (int kb = 0; kb < 4; ++kb) wgmma_ss64_t(d, desc_at(da, 2048 * kb), desc_at(dbm, 256 * kb), 1);
  } else if (mode == 2) {
    for (int kb = 0; kb < 4; ++kb) wgmma_rs64(d, af[kb], desc_at(db, 2048 * kb), 1);
  } else {
    for (int kb = 0; kb < 4; ++kb) wgmma_rs64_t(d, af[kb], desc_at(dbm, 256 * kb), 1);
  }
  wg_commit();
  wg_wait<0>();
  acc_fence(d);
  if (mode == 3) {
    float d2[32];
    for (int i = 0; i < 32; ++i) d2[i] = 0.f;
    for (int kb = 0; kb < 4; ++kb)
      for (int r = 0; r < 4; ++r) af[kb][r] = pack2(d[8 * kb + 2 * r], d[8 * kb + 2 * r + 1]);
    wg_fence();
    for (int kb = 0; kb < 4; ++kb) wgmma_rs64(d2, af[kb], desc_at(db2, 2048 * kb), 1);
    wg_commit();
    wg_wait<0>();
    acc_fence(d2);
    for (int i = 0; i < 32; ++i) d[i] = d2[i];
  }
  for (int i = 0; i < 32; ++i) D[(16 * wl + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * qd + (i & 1)] = d[i];
}

// ---- TMA probe (not yet run on the device): one 64-row tile of a (B, T, H, D) bf16 tensor, one box of
// {8 columns, 1 head, 64 steps, 1 batch} a column group, each landing as one 1 KB column group of the
// core-matrix layout chunk_sm90 reads (rows past T zero-filled by the map). One thread arms an mbarrier
// with the byte count and issues the copies; every thread waits on the barrier's phase 0, then the tile
// goes back to global memory raw.
__global__ void tma_probe_kernel(const __grid_constant__ CUtensorMap map, int t0, int h, int b, int ncg,
                                 unsigned char* out) {
  extern __shared__ __align__(1024) unsigned char sm[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_a = (uint32_t)__cvta_generic_to_shared(&bar), dst = (uint32_t)__cvta_generic_to_shared(sm);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_a) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar_a), "r"(ncg * 1024) : "memory");
    for (int cg = 0; cg < ncg; ++cg)
      asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                   ::"r"(dst + cg * 1024), "l"(&map), "r"(8 * cg), "r"(h), "r"(t0), "r"(b), "r"(bar_a) : "memory");
  }
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar_a) : "memory");
  for (int e = threadIdx.x; e < ncg * 1024; e += blockDim.x) out[e] = sm[e];
}

}  // namespace

int sm90_tma_probe(const void* x, int B, int T, int H, int D, int t0, int h, int b, void* out, cudaStream_t s) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                       cudaEnableDefault, &found) != cudaSuccess || encode == nullptr)
    return -1;
  alignas(64) CUtensorMap map;
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
  const cuuint64_t strides[3] = {(cuuint64_t)D * 2, (cuuint64_t)H * D * 2, (cuuint64_t)T * H * D * 2};  // bytes, dims 1..3
  const cuuint32_t box[4] = {8, 1, 64, 1}, step[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(x), dims, strides, box, step,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return 1000 + (int)r;
  tma_probe_kernel<<<1, 128, (D / 8) * 1024, s>>>(map, t0, h, b, D / 8, static_cast<unsigned char*>(out));
  return (int)cudaGetLastError();
}

int sm90_probe(int mode, const void* A, const void* B, const void* B2, float* D, int lbo, int sbo, cudaStream_t s) {
  probe_kernel<<<1, 128, 24576, s>>>(mode, static_cast<const bf16*>(A), static_cast<const bf16*>(B),
                                     static_cast<const bf16*>(B2), D, lbo, sbo);
  return (int)cudaGetLastError();
}

}  // namespace gr
"""
HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

namespace gr {
int sm90_probe(int mode, const void* A, const void* B, const void* B2, float* D, int lbo, int sbo, cudaStream_t s);
int sm90_tma_probe(const void* x, int B, int T, int H, int D, int t0, int h, int b, void* out, cudaStream_t s);
}  // namespace gr

void tma_probe(const at::Tensor& x, int64_t t0, int64_t h, int64_t b, const at::Tensor& out) {
  const int err = gr::sm90_tma_probe(x.data_ptr(), (int)x.size(0), (int)x.size(1), (int)x.size(2), (int)x.size(3),
                                     (int)t0, (int)h, (int)b, out.data_ptr(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == 0, "tma probe failed: code ", err);
}

void probe(int64_t mode, const at::Tensor& A, const at::Tensor& B, const at::Tensor& B2, const at::Tensor& D,
           int64_t lbo, int64_t sbo) {
  const int err = gr::sm90_probe((int)mode, A.data_ptr(), B.data_ptr(), B2.data_ptr(), D.data_ptr<float>(), (int)lbo,
                                 (int)sbo, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == 0, "probe launch failed: ", cudaGetErrorString((cudaError_t)err));
}
"""

_QUIET = ("#pragma nv_diagnostic push\n#pragma nv_diag_suppress 177\n", "#pragma nv_diagnostic pop\n")
_module = None


def build():
    """The probe extension dev_chunk_sm90 (sm_90a only), compiled on first use: solution's PRELUDE, DEVICE,
    CHUNK, SEGMENT_SCAN, WGMMA and CHUNK_SM90 sources, two more wgmma forms, PROBE_SRC."""
    global _module
    if _module is None:
        extra = "namespace gr {\nnamespace {\n" + solution._wgmma(64, False, 0, False) + \
            solution._wgmma(64, False, 1, False) + "}\n}\n"
        cuda = [solution.PRELUDE_SRC, _QUIET[0], solution.DEVICE_SRC, solution.CHUNK_SRC, solution.SEGMENT_SCAN_SRC,
                solution.WGMMA_SRC, solution.CHUNK_SM90_SRC, _QUIET[1], extra, PROBE_SRC]
        _module = load_inline(name="dev_chunk_sm90", cpp_sources=[solution.PRELUDE_SRC, HOST_SRC], cuda_sources=cuda,
                              functions=["probe", "tma_probe"], extra_cflags=["-O3"],
                              extra_cuda_cflags=solution.CUDA_FLAGS + solution._UNIT_GENCODE["chunk_sm90"] +
                              solution._split_compile_flags(),
                              verbose=os.environ.get("DEV_VERBOSE_BUILD") == "1", **solution._LEAN)
    return _module


def probes():
    """Each operand layout against torch; returns rows (mode, lbo, sbo, rel_err)."""
    mod = build()
    gen = torch.Generator(device="cuda").manual_seed(0)
    A, B, B2 = (torch.randn(64, 64, device="cuda", generator=gen).bfloat16() for _ in range(3))
    Ad, Bd, B2d = A.double(), B.double(), B2.double()
    cases = [(0, 1024, 128, Ad @ Bd.T), (1, 128, 1024, Ad @ Bd), (1, 1024, 128, Ad @ Bd),
             (2, 1024, 128, Ad.T @ Bd.T), (3, 1024, 128, (A.float() @ B.float().T).bfloat16().double() @ B2d.T),
             (4, 128, 1024, Ad.T @ Bd), (4, 1024, 128, Ad.T @ Bd)]
    rows = []
    for mode, lbo, sbo, ref in cases:
        D = torch.full((64, 64), float("nan"), device="cuda")
        mod.probe(mode, A, B, B2, D, lbo, sbo)
        torch.cuda.synchronize()
        err = ((D.double() - ref).norm() / ref.norm()).item()
        rows.append({"mode": mode, "lbo": lbo, "sbo": sbo, "rel_err": err})
        print(f"probe mode {mode} LBO={lbo} SBO={sbo}: rel err {err:.2e}", flush=True)
    return rows


def tma_probe():
    """One TMA load of a 64-row tile (T = 70, the chunk at t0 = 64: 6 rows in range, 58 zero-filled) against
    the core-matrix layout built by torch. Returns a row (ok, and the first differing byte if any)."""
    B, T, H, D, t0, h, b = 2, 70, 3, 128, 64, 1, 1
    x = torch.randn(B, T, H, D, device="cuda").bfloat16()
    out = torch.zeros(D // 8 * 1024, dtype=torch.uint8, device="cuda")
    build().tma_probe(x, t0, h, b, out)
    torch.cuda.synchronize()
    rows = torch.zeros(64, D, dtype=torch.bfloat16, device="cuda")
    rows[:T - t0] = x[b, t0:, h]
    want = rows.view(64, D // 8, 8).transpose(0, 1).contiguous().view(torch.uint8).flatten()  # [cg][row][8]
    diff = (out != want).nonzero()
    row = {"probe": "tma per column group", "ok": diff.numel() == 0,
           "first_diff_byte": int(diff[0]) if diff.numel() else None}
    print(f"probe TMA, a box per column group: {'same bytes' if row['ok'] else 'DIFFERENT at ' + str(row['first_diff_byte'])}",
          flush=True)
    return row


def sm90(*xs, segments=None, **states):
    """solution's chunk_sm90 on xs (planned segments, or that many)."""
    return solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=() if segments is None else (segments,),
                                           **states)


def check():
    rows = []

    def record(case, y, ref, tol, same=torch.isnan):
        fin = torch.isfinite(ref)
        if not torch.equal(same(y), same(ref)):
            err = float("inf")
        else:
            err = rel_l2(y[fin].double(), ref[fin]) if bool(fin.any()) else 0.0
        rows.append({"case": case, "err": err, "tol": tol, "ok": err <= tol})
        print(f"{'ok ' if err <= tol else 'BAD'} {case}: rel-L2 {err:.2e} (tol {tol:.1e})", flush=True)

    def floor(ref):  # the exact answer's own bf16 rounding (finite entries)
        fin = torch.isfinite(ref)
        return rel_l2(ref[fin].bfloat16().double(), ref[fin])

    for shape, segs in [((2, 64, 2, 128, 128), None), ((1, 300, 3, 128, 128), None), ((1, 300, 3, 64, 128), None),
                        ((2, 1000, 2, 128, 128), 4), ((1, 777, 1, 128, 128), 3), ((1, 2048, 2, 128, 128), None),
                        ((2, 33, 1, 64, 128), None)]:
        xs = [x.cuda().bfloat16() for x in reference.make_inputs(*shape)]
        ref = naive.recurrent_naive(*xs)[0]
        record(f"{shape} segments={segs}", sm90(*xs, segments=segs), ref, 1.1 * floor(ref))
    for gate in (0.0, -0.5, 1.02, (-1.2, 1.2), (0.99, 1.0)):
        xs = [x.cuda() for x in reference.make_inputs(2, 200, 2, 128, 128)]
        xs[3] = torch.full_like(xs[3], gate) if isinstance(gate, float) else torch.empty_like(xs[3]).uniform_(*gate)
        xs = [x.bfloat16() for x in xs]
        ref = naive.recurrent_naive(*xs)[0]
        record(f"gate={gate}", sm90(*xs, segments=2), ref, 1.1 * floor(ref))
    for i, (name, idx) in enumerate({"q": (0, 5, 1, 3), "k": (1, 70, 0, 0), "v": (0, 9, 0, 4), "gate": (1, 100, 1),
                                     "beta": (0, 13, 0)}.items()):
        xs = [x.cuda().bfloat16() for x in reference.make_inputs(2, 200, 2, 128, 128)]
        xs[i][idx] = float("nan")
        ref = naive.recurrent_naive(*xs)[0]
        record(f"NaN in {name}", sm90(*xs, segments=2), ref, 1.1 * floor(ref))
    xs = [x.cuda().bfloat16() for x in reference.make_inputs(2, 200, 2, 128, 128)]
    xs[2][0, 20, 1, 7] = float("inf")
    ref = naive.recurrent_naive(*xs)[0]
    record("inf in v (finiteness as the float64 loop)", sm90(*xs, segments=2), ref, 1.1 * floor(ref),
           same=torch.isfinite)
    for segs in (None, 3):
        xs = [x.cuda().bfloat16() for x in reference.make_inputs(2, 350, 2, 128, 128)]
        s0 = torch.randn(2, 2, 128, 128, device="cuda").transpose(2, 3)
        ref_y, ref_s = naive.recurrent_naive(*xs, initial_state=s0)
        y, st = sm90(*xs, segments=segs, initial_state=s0, output_final_state=True)
        record(f"states segments={segs}: y", y, ref_y, 1.1 * floor(ref_y))
        record(f"states segments={segs}: final state", st, ref_s, 1e-4)
    xs = [x.cuda() for x in reference.make_inputs(2, 300, 2, 128, 128)]
    xs = [x.bfloat16() for x in xs[:3]] + xs[3:]
    ref = naive.recurrent_naive(*xs)[0]
    record("float32 gates", sm90(*xs), ref, 1.1 * floor(ref))
    return rows


BENCH = {"S2-bf16": (8, 2048, 16, 128), "S4-bf16": (16, 4096, 32, 128), "S3-bf16": (1, 8192, 8, 128),
         "S1-bf16-dk128": (4, 1024, 8, 128)}


def bench(trials):
    rows = []
    fla = None
    if os.environ.get("DEV_FLA", "1") == "1":
        import importlib.util
        if importlib.util.find_spec("fla") is not None:
            from fla.ops.simple_gla import chunk_simple_gla
            fla = chunk_simple_gla
    for name, (B, T, H, D) in BENCH.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16() for _ in range(3)] + \
             [torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen)).bfloat16() for _ in range(2)]
        row = {"shape": name, "dims": (B, T, H, D), "plan": solution.plan(B, T, H, D, D, torch.bfloat16)}
        row["sm90_ms"] = kernelbench_time(sm90, xs, trials=trials)["median"]
        row["chunk_bf16_ms"] = kernelbench_time(
            lambda *x: solution._gated_recurrence_with(*x, kernel="chunk_bf16"), xs, trials=trials)["median"]
        if fla is not None:
            q, k, v, g, b = xs
            gl, kb = torch.log(g.float()), (k * b[..., None]).contiguous()
            row["fla_ms"] = kernelbench_time(lambda: fla(q, kb, v, g=gl, scale=1.0), [], trials=trials)["median"]
        rows.append(row)
        print(row, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-probes", action="store_true")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "probes": [] if args.no_probes else probes() + [tma_probe()], "checks": check()}
    bad = [r["case"] for r in result["checks"] if not r["ok"]]
    print(f"self-check: {len(bad)} bad of {len(result['checks'])} {bad}", flush=True)
    result["timing"] = [] if args.no_timing else bench(args.trials)
    if os.environ.get("OUT"):
        save("dev_chunk_sm90.json", result)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
