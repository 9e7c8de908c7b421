"""What the two dev harnesses of the float32 Hopper backward share (dev/bwd_fp32_passA.py, dev/bwd_fp32_passB.py):
the build of solution.py's unit backward_sm90_fp32 (its production CUDA text, from solution's constants: nothing
compiled twice, no kernel text here) with a dev entry and a torch binding, its launch on a case's tensors (the
checkpoint rows made here), the chunk models' products, padding and tables, the test cases and metric, the
--cpu-check and --check loops with their verdict, --bench's report, the result file and the command line. Not a
script: each harness imports it and is run itself, from the repository root (each one's docstring says what its
commands do):

    python3 dev/bwd_fp32_passB.py --cpu-check [--split b|d|t|k|r] | --build-only | --check | --bench [--trials N]
    python3 dev/bwd_fp32_passA.py --cpu-check [--split b|d|t|k|r] | --build-only | --check | --bench [--trials N]
"""
import argparse
import math
import os
import sys

import torch

import fp32_split_emulation as emu
import naive
from tools.common import save
from tools.sm90_build import FUNC_ATTRS_SRC, build, print_build, solution_source

RESULT = {}  # this run's results (one pass a process), saved as the pass's JSON
KCK32 = 128 * 128 + 8  # a checkpoint row (solution's kCk32): S [dk][dv], then the forward's 8 warps' max |S|

# The dev entry, after the unit's text (its kernels and launches are in gr's anonymous namespace): which 0, the unit's
# entry point (both kernels, as the host launches them); 1, the dq kernel (pass A) alone; 2, the dv kernel (pass B)
# alone; and a kernel's attributes (registers, local bytes, threads, static shared memory).
DEV_CUDA = r"""
namespace gr {
int dev_bwd32(int which, const BwdProblem& pr, cudaStream_t s, const char** failed) {
  if (which == 0) {
    Plan pl = {};
    pl.kernel = Kernel::chunk_bwd_sm90_fp32;
    pl.dtype = DType::f32;
    return gr_execute_backward_sm90_fp32(&pl, &pr, nullptr, s, failed);
  }
  bwd32::Params p;
  static_cast<BwdProblem&>(p) = pr;
  p.ckpt = static_cast<const float*>(pr.fwd_ckpt);
  p.nck = (pr.T + 63) / 64;
  return (int)(which == 1 ? launch_chunk_bwd_sm90_fp32_dq(p, s, failed) : launch_chunk_bwd_sm90_fp32_dv(p, s, failed));
}
FUNC_ATTRS
int dev_bwd32_attrs(int which, int* res) {
  return func_attrs(which == 1 ? (const void*)bwd32::pa::chunk_bwd_sm90_fp32_kernel
                               : (const void*)bwd32::pb::chunk_bwd_sm90_fp32_dv_kernel, res);
}
}  // namespace gr
"""

# The binding (after solution's PRELUDE, which declares gr::BwdProblem): bwd32(which, ...) fills a BwdProblem from
# the tensors as the host does (q, k, v, dy: any (b, t, h) strides that are multiples of 4 with unit d-stride and
# 16-byte rows; gate, beta: any strides; dfinal: any strides or empty; the outputs contiguous, ds0 empty for none;
# ckpt (B H, chunks, KCK32) contiguous, empty for the dv kernel alone; flag an int32 the caller zeroed) and runs
# dev_bwd32 on the current stream.
DEV_HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <vector>
PRELUDE
namespace gr {
int dev_bwd32(int which, const BwdProblem& pr, cudaStream_t s, const char** failed);
int dev_bwd32_attrs(int which, int* res);
}
static gr::Strides4 rows(const at::Tensor& t, const at::Tensor& q, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.sizes() == q.sizes() && t.stride(3) == 1 &&
              reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 4 == 0 && t.stride(1) % 4 == 0 &&
              t.stride(2) % 4 == 0, name, ": (B, T, H, 128) float32 on the GPU, unit d-stride, 16-byte rows");
  return {t.stride(0), t.stride(1), t.stride(2), 1};
}
static gr::Strides3 steps(const at::Tensor& t, const at::Tensor& q, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.dim() == 3 && t.size(0) == q.size(0) &&
              t.size(1) == q.size(1) && t.size(2) == q.size(2), name, ": (B, T, H) float32 on the GPU");
  return {t.stride(0), t.stride(1), t.stride(2)};
}
static void* out(const at::Tensor& t, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == at::IntArrayRef(shape),
              name, ": a contiguous float32 output of its shape");
  return t.data_ptr();
}
void bwd32(int64_t which, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dy,
           const at::Tensor& gate, const at::Tensor& beta, const at::Tensor& ckpt, const at::Tensor& dfinal,
           const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& dgate,
           const at::Tensor& dbeta, const at::Tensor& ds0, const at::Tensor& flag) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) == 128, "q (B, T, H, 128)");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), nck = (T + 63) / 64;
  gr::BwdProblem pr{};
  pr.q = q.data_ptr(); pr.k = k.data_ptr(); pr.v = v.data_ptr(); pr.dy = dy.data_ptr();
  pr.sq = rows(q, q, "q"); pr.sk = rows(k, q, "k"); pr.sv = rows(v, q, "v"); pr.sdy = rows(dy, q, "dy");
  pr.gate = gate.data_ptr(); pr.beta = beta.data_ptr();
  pr.sg = steps(gate, q, "gate"); pr.sb = steps(beta, q, "beta");
  pr.g32 = pr.b32 = true;
  pr.T = (int)T; pr.H = (int)H; pr.Dk = 128; pr.Dv = 128; pr.BH = B * H;
  TORCH_CHECK((which == 2 && ckpt.numel() == 0) ||  // (the dv kernel reads no checkpoint)
              (ckpt.is_cuda() && ckpt.scalar_type() == at::kFloat && ckpt.is_contiguous() &&
               ckpt.sizes() == at::IntArrayRef({B * H, nck, (int64_t)gr::kCk32})), "ckpt (B H, chunks, kCk32)");
  pr.fwd_ckpt = ckpt.numel() ? ckpt.data_ptr() : nullptr;
  const std::vector<int64_t> state{B, H, 128, 128};
  TORCH_CHECK(dfinal.numel() == 0 || (dfinal.is_cuda() && dfinal.scalar_type() == at::kFloat &&
                                      dfinal.sizes() == at::IntArrayRef(state)), "dfinal (B, H, 128, 128) or empty");
  pr.dfinal = dfinal.numel() ? dfinal.data_ptr<float>() : nullptr;
  if (dfinal.numel()) pr.sdf = {dfinal.stride(0), dfinal.stride(1), dfinal.stride(2), dfinal.stride(3)};
  pr.y = out(dq, q.sizes().vec(), "dq"); pr.dk = out(dk, q.sizes().vec(), "dk"); pr.dv = out(dv, q.sizes().vec(), "dv");
  pr.dgate = out(dgate, {B, T, H}, "dgate"); pr.dbeta = out(dbeta, {B, T, H}, "dbeta");
  pr.ds0 = ds0.numel() ? static_cast<float*>(out(ds0, state, "ds0")) : nullptr;
  TORCH_CHECK(flag.is_cuda() && flag.scalar_type() == at::kInt && flag.numel() == 1, "flag: one int32");
  pr.nonfinite = flag.data_ptr<int>();
  const c10::cuda::OptionalCUDAGuard guard(q.device());
  const char* failed = "";
  const int e = gr::dev_bwd32((int)which, pr, c10::cuda::getCurrentCUDAStream(), &failed);
  TORCH_CHECK(e == 0, failed, ": ", cudaGetErrorString((cudaError_t)e));
}
std::vector<int64_t> bwd32_attrs(int64_t which) {  // (registers, local bytes, threads, static shared memory)
  int r[4] = {0, 0, 0, 0};
  const int e = gr::dev_bwd32_attrs((int)which, r);
  TORCH_CHECK(e == 0, "attributes: ", cudaGetErrorString((cudaError_t)e));
  return {r[0], r[1], r[2], r[3]};
}
"""
FUNCTIONS = ["bwd32", "bwd32_attrs"]
KERNELS = {1: "chunk_bwd_sm90_fp32", 2: "chunk_bwd_sm90_fp32_dv"}  # which -> the kernel


def build_module():
    """The dev extension: solution.py's unit backward_sm90_fp32 as it builds (PRELUDE, DEVICE, WGMMA,
    BACKWARD_SM90_FP32 sources, read by tools/sm90_build.solution_source) plus DEV_CUDA, and DEV_HOST; sm_90a, its
    ptxas report printed and kept in RESULT["build"]. One module for both harnesses (the same cache)."""
    prelude, device, wgmma, unit = solution_source("PRELUDE_SRC", "DEVICE_SRC", "WGMMA_SRC", "BACKWARD_SM90_FP32_SRC")
    cuda = "\n".join((prelude, device, wgmma, unit, DEV_CUDA.replace("FUNC_ATTRS", FUNC_ATTRS_SRC)))
    mod, summary = build("bwd_fp32_dev", DEV_HOST.replace("PRELUDE", prelude), cuda, FUNCTIONS, "gr")
    print_build(summary, launch_regs=168, split_kernels="bwd32::")
    RESULT["build"] = summary
    return mod


def checkpoints(k, v, gate, beta):
    """S at each 64-step chunk start, (B, H, nck, D, D) float64, by the forward recurrence a step at a time (on k's
    device: --check makes them on the GPU)."""
    k, v, gate, beta = (x.double() for x in (k, v, gate, beta))
    B, T, H, D = k.shape
    S = torch.zeros(B, H, D, v.shape[-1], dtype=torch.float64, device=k.device)
    out = []
    for t in range(T):
        if t % 64 == 0:
            out.append(S)
        S = gate[:, t, :, None, None] * S + beta[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
    return torch.stack(out, 2)


def ckpt_rows(ck):
    """The kernel's checkpoint rows from S (B, H, nck, 128, 128) [dk][dv]: (B H, nck, KCK32) float32, S rounded once,
    then the 8 maxima the forward writes: slot w = 4 cw + wl, the max |S| over the dv columns 16 w .. 16 w + 15 that
    its consumer warp held (all dk rows; amax: an inf stays, a NaN propagates)."""
    B, H, nck = ck.shape[:3]
    s = ck.float().reshape(B * H, nck, 128, 128)
    slots = s.abs().reshape(B * H, nck, 128, 8, 16).amax((2, 4))
    return torch.cat([s.reshape(B * H, nck, 128 * 128), slots], -1).contiguous()


def run_unit(mod, which, q, k, v, gate, beta, dy, dsT=None, ckpt=None, want_ds0=True):
    """The dev extension on one case's tensors (CUDA, any layouts the kernels take): which 0, both kernels (the unit's
    entry), 1, the dq kernel, 2, the dv kernel; ckpt: the checkpoint rows (made from the float64 recurrence when None;
    none for the dv kernel alone).
    Every output NaN-poisoned first (an element a kernel misses stays NaN), the flag zeroed. Returns dq, dk, dv, dgate,
    dbeta, dS_0 (None without want_ds0) and the flag (an int)."""
    B, T, H, _ = q.shape
    if ckpt is None:
        ckpt = q.new_empty(0) if which == 2 else ckpt_rows(checkpoints(k, v, gate, beta))
    dq, dk, dv = (torch.full((B, T, H, 128), float("nan"), device=q.device) for _ in range(3))
    dgate, dbeta = (torch.full((B, T, H), float("nan"), device=q.device) for _ in range(2))
    ds0 = torch.full((B, H, 128, 128), float("nan"), device=q.device) if want_ds0 else q.new_empty(0)
    flag = torch.zeros(1, dtype=torch.int32, device=q.device)
    mod.bwd32(which, q, k, v, dy, gate, beta, ckpt, dsT if dsT is not None else q.new_empty(0), dq, dk, dv, dgate,
              dbeta, ds0, flag)
    return dq, dk, dv, dgate, dbeta, ds0 if want_ds0 else None, int(flag.item())


# ---------------------------------------------------------------------------------------------
# The chunk models' common parts (each pass's model: its kernel's tables and chunk formulas, plainly): the products,
# float64 or float32 as wgmma sequences of a split scheme (the kernels' bf16 x3, or (d)'s scaled fp16 x3); the tiles
# as the row dots read them; the inputs padded to whole chunks; a chunk's tables.
# ---------------------------------------------------------------------------------------------
# --split: training-design 8.4's scheme -> (fp32_split_emulation's mode, the label the outputs print)
SPLITS = {"b": ("bf16x3", "bf16 x3"), "d": ("fp16x3s", "scaled fp16 x3"),
          "t": ("fp16x3t", "tile-scaled fp16 x3"),
          "k": ("fp16x3k", "k-step-scaled fp16 x3"), "r": ("fp16x3r", "step-scaled fp16 x3")}
# Splits k and r (scales along the contraction; the models' own products, StepScaled below): the rows of a chunk
# matrix indexed by steps carry one power of two a group of STEP_GROUP[split] steps (k: a wgmma k-step, 16; r: every
# step).
STEP_GROUP = {"k": 16, "r": 1}


def model_mm(emulate, split="b"):
    """mm(a, b, acc=None) = acc + a b: float64 (emulate None), or float32 with dev/fp32_split_emulation.py's mm in
    split's scheme (b: bf16 hi / lo; d: fp16 hi / lo after a power-of-two scale per row of a and column of b; t: the
    same with one scale a matrix; three terms; each k-step and term's exact partial added to an fp32 accumulator,
    rounded to nearest with "rn" or truncated with "rz")."""
    if emulate is None:
        def mm(a, b, acc=None):
            return a @ b if acc is None else acc + a @ b
        return mm

    def mm(a, b, acc=None):
        emu.RZ = emulate == "rz"
        out = emu.mm(a, b, SPLITS[split][0], acc=acc)
        emu.RZ = False
        return out
    return mm


def model_pair(emulate, split="b"):
    """pair(x): a tile x (rows along the last dimension) as a row dot reads it: x itself (float64), or the hi + lo of
    its shared-memory pair: bf16 (b: within 2^-17 of x) or fp16 after a power-of-two scale per row (d: as
    fp32_split_emulation's fp16x3s splits a row of A, within about 2^-22 of x), times the scale."""
    if emulate is None:
        return lambda x: x
    if split == "b":
        def pair(x):
            hi, lo = emu.split_bf16(x, 2)
            return hi + lo
        return pair

    def pair(x):
        # float64 (..., rows, 1): the row's max |x| to 2^15 (d), or the tile's (t)
        s = emu.pow2_scale(x, -1) if split == "d" else emu.pow2_scale(emu.pow2_scale_in(x), -1)
        xs = (x.double() / s).float()
        hi = xs.half().float()
        lo = (xs - hi).half().float()
        return ((hi + lo).double() * s).float()  # hi + lo exact in float32 (22 bits); the power of two exact
    return pair


class StepScaled:
    """Splits k and r (scales along the chunk's steps; training-design 8.6's t refined where a product sums over the
    steps). A tile whose rows are steps (q, k, v, dy) is stored as ONE fp16 hi / lo pair of x 2^-e, e per group of
    `gran` rows (k: the 16 steps of a wgmma k-step; r: every step): ceil(log2 of the group's max |x|) - 15, as pow2_scale.
    Its readers:
      - products that do not sum over its rows (QK, KG, Dd, R^T, Rk^T): the group's 2^e is a per-row (M) or per-column
        (N) factor of the accumulator after the product (outer);
      - products that sum over its rows (G's update, dv, dq^T, dk^T, M): the tile is the product's NATURAL side (its
        stored pair as is), the other operand is made for that product alone and is COMPENSATED (contract): its slice
        r of the contraction is taken times 2^-(E - e_nat[r]), E = max_r (e_comp[r] + e_nat[r]) (its own group
        exponent plus the natural side's), so that every k-step's partial has the one scale 2^E: the largest group's
        product at full range, a group far below it underflows only where it is negligible against it;
      - the row dots: hi + lo times its row's 2^e (value).
    Zero groups have no exponent (-inf): a product group where either side is zero is zero. Every product as
    fp32_split_emulation's mm: three terms (hh + hl + lh) a 16-step k-step, each exact partial added to a float32
    accumulator at the product's scale (rounded to nearest, or truncated with emu.RZ), then times its powers of two."""

    def __init__(self, gran):
        self.gran = gran

    @staticmethod
    def exps(m):
        """float64 exponents ceil(log2 m) - 15 of maxima m >= 0; -inf for m == 0."""
        m = m.double()
        return torch.where(m > 0, torch.ceil(torch.log2(torch.where(m > 0, m, torch.ones_like(m)))) - 15,
                           torch.full_like(m, -math.inf))

    def group_exp(self, x, gran=None):
        """x (..., K, X): exponents (..., K, 1), one a group of gran rows (the max over the group's rows and all X)."""
        gran = min(gran or self.gran, x.shape[-2])
        m = x.abs().amax(-1)
        K = m.shape[-1]
        mg = m.reshape(*m.shape[:-1], K // gran, gran).amax(-1).repeat_interleave(gran, -1)
        return self.exps(mg)[..., None]

    @staticmethod
    def scale(e):
        return torch.exp2(torch.where(torch.isfinite(e), e, torch.zeros_like(e)))

    @staticmethod
    def halves(xs):
        """fp16 hi, lo of float32 xs (already scaled), as float32."""
        hi = xs.half().float()
        return hi, (xs - hi).half().float()

    def nat(self, x, tile=False):
        """A step-indexed tile x (..., R, C) as its stored pair: dict hi, lo (..., R, C), e (..., R, 1) (-inf where
        zero); tile: one exponent for the whole matrix (t's, for G and S)."""
        if tile:
            e = self.exps(x.abs().amax((-1, -2), keepdim=True))  # (..., 1, 1)
        else:
            e = self.group_exp(x)
        hi, lo = self.halves((x.double() / self.scale(e)).float())
        return {"hi": hi, "lo": lo, "e": e}

    def value(self, t):
        """A pair as the row dots read it: (hi + lo) times its row's 2^e (hi + lo exact in float32)."""
        return ((t["hi"] + t["lo"]).double() * self.scale(t["e"])).float()

    @staticmethod
    def T(t):
        """The pair transposed (rows -> columns; e (..., 1, R))."""
        return {"hi": t["hi"].transpose(-1, -2), "lo": t["lo"].transpose(-1, -2), "e": t["e"].transpose(-1, -2)}

    @staticmethod
    def _run(ah, al, bh, bl, post, acc):
        """The wgmma sequence at the scaled values: acc (unscaled) taken to the product's scale 1 / post first (a
        power of two a row / column / element), three terms a k-step, each partial rounded into float32, then times
        post."""
        K = ah.shape[-1]
        shape = (*ah.shape[:-1], bh.shape[-1])
        out = torch.zeros(shape, dtype=torch.float32) if acc is None else (acc.double() / post).float()
        for k0 in range(0, K, 16):
            for x, y in ((ah, bh), (ah, bl), (al, bh)):
                out = emu.add_round(out, x[..., k0:k0 + 16].double() @ y[..., k0:k0 + 16, :].double())
        return (out.double() * post).float()

    def outer(self, a, b, acc=None):
        """a (M, K) @ b (K, N), pairs (nat / T) whose exponents lie along M (a: e (..., M, 1)) and N (b: e (..., 1, N))
        or are one a tile: the accumulator times 2^(e_a[m] + e_b[n])."""
        post = self.scale(a["e"]) * self.scale(b["e"])
        return self._run(a["hi"], a["lo"], b["hi"], b["lo"], post, acc)

    def contract(self, comp, nat, comp_is_a, acc=None, inplace=False, gran=None):
        """A product over the steps: comp (float32 values) is compensated against the natural pair nat.
        comp_is_a: comp is A (M, K), nat is B (K, N) with e (..., K, 1); else nat is A (M, K) with e (..., 1, K)
        and comp is B (K, N). inplace: comp is first split at its own group exponents (its natural pair) and then its
        hi and lo are each taken times 2^(e_comp + e_nat - E) in fp16 (a kernel rescaling a stored pair in place),
        instead of split once from comp 2^-(E - e_nat)."""
        ck = comp.transpose(-1, -2) if comp_is_a else comp  # (..., K, X): the contraction along rows
        en = nat["e"] if comp_is_a else nat["e"].transpose(-1, -2)  # (..., K, 1)
        ec = self.group_exp(ck, gran)
        P = ec + en
        E = P.amax(-2, keepdim=True)  # (..., 1, 1)
        ok = torch.isfinite(P)
        Ef = torch.where(torch.isfinite(E), E, torch.zeros_like(E))
        if inplace:
            hi, lo = self.halves((ck.double() / self.scale(ec)).float())
            f = torch.exp2(torch.where(ok, P - Ef, torch.zeros_like(P)))
            hi, lo = (hi.double() * f).half().float(), (lo.double() * f).half().float()
        else:
            hi, lo = self.halves((ck.double() / torch.exp2(torch.where(ok, Ef - en, torch.zeros_like(en)))).float())
        zero = torch.zeros((), dtype=torch.float32)
        hi, lo = torch.where(ok, hi, zero), torch.where(ok, lo, zero)
        post = torch.exp2(Ef)
        if comp_is_a:
            return self._run(hi.transpose(-1, -2), lo.transpose(-1, -2), nat["hi"], nat["lo"], post, acc)
        return self._run(nat["hi"], nat["lo"], hi, lo, post, acc)


def model_inputs(rows, gate, beta, f):
    """(rows, gate, beta, nck): the rows (B, T, H, D) as (B, H, 64 nck, D), gate and beta (B, T, H) as (B, H, 64 nck),
    in dtype f; the last chunk's rows past T are zero rows, their gates 1, betas 0 (as the kernels')."""
    rows = [x.to(f).transpose(1, 2) for x in rows]
    gate, beta = (x.to(f).transpose(1, 2) for x in (gate, beta))
    T = gate.shape[-1]
    nck = math.ceil(T / 64)
    pad = nck * 64 - T
    rows = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in rows]
    gate = torch.nn.functional.pad(gate, (0, pad), value=1.0)
    beta = torch.nn.functional.pad(beta, (0, pad), value=0.0)
    return rows, gate, beta, nck


def chunk_tables(g):
    """(L, A) of a chunk's gates g (B, H, 64): L[t][s] = L[t-1][s] g_t and A[t] = A[t-1] g_t, running products in
    g's dtype in the kernels' order (WG0's build_tables)."""
    L = naive.decay_matrix(g)
    A = torch.empty_like(g)
    run = torch.ones_like(g[..., 0])
    for t in range(64):
        run = run * g[..., t]
        A[..., t] = run
    return L, A


# ---------------------------------------------------------------------------------------------
# Cases (--cpu-check and --check of both passes): shapes x gate classes (tests/test_backward.py's GATE_CASES), dS_T
# on every other case, and the gate-1.002 stress case.
# ---------------------------------------------------------------------------------------------
SHAPES = [(1, 1, 2), (1, 63, 2), (2, 64, 1), (1, 130, 2), (1, 300, 2)]  # (B, T, H)
GATES = {"sigmoid": None, "zero": 0.0, "zeros-at-steps": None, "negative": (-1.0, 0.0), "above1": (1.0, 1.05),
         "near1": (1 - 1e-4, 1 + 1e-4), "one": 1.0}
ZERO_STEPS = (0, 63, 64, 127)
STRESS = ((1, 2100, 2), "const 1.002")
# rows of q, k, v, dy each times 10^u, u uniform in (-3, 3), sigmoid gates: a tile whose rows differ by up to 1e6
# (one power-of-two scale a tile, split t, keeps the large rows' precision; the small ones weigh little in the norm)
ROWSCALE = ((1, 300, 2), "row scales")
# a loss on a few steps (dy zero on each chunk's first 48 steps, or on its last 48), sigmoid gates: within a chunk
# q A[t] spans far more than fp16's range, and the steps that meet a nonzero dy may be the tiny ones (split t's one
# scale a tile loses them all: dS_0 of pass B, thirty-second session)
MASKED = [((1, 256, 2), "dy masked early"), ((1, 256, 2), "dy masked late"), ((1, 256, 2), "q early, dy late"),
          ((1, 256, 2), "g0.3, dy k-step's last step"), ((1, 60, 2), "last-token loss")]


def cases():
    out = [(s, gname) for s in SHAPES for gname in GATES] + [STRESS, ROWSCALE] + MASKED
    return [(s, gname, i % 2 == 1) for i, (s, gname) in enumerate(out)]


# --check only: cases in other layouts the kernels take (on_device's "strided"), and inputs that are not finite, where
# the kernels' flag must be set (the host then recomputes with chunk_bwd): an inf in k, a NaN in dy.
STRIDED = [((2, 130, 3), "sigmoid"), ((1, 300, 2), "above1")]
NONFINITE = {"inf in k": ("k", (0, 70, 1, 5), math.inf), "NaN in dy": ("dy", (0, 100, 0, 7), math.nan)}


def device_cases():
    """--check's cases (shape, gate, dS_T, layout): cases() contiguous, STRIDED strided, NONFINITE's (flag only)."""
    return [(s, g, d, "contiguous") for s, g, d in cases()] + [(s, g, True, "strided") for s, g in STRIDED] + \
        [((1, 130, 2), name, True, "contiguous") for name in NONFINITE]


def make_case(shape, gname, with_dsT, seed):
    gen = torch.Generator().manual_seed(seed)
    B, T, H = shape
    q, k, v, dy = (torch.randn(B, T, H, 128, generator=gen) for _ in range(4))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    if gname == "const 1.002":
        gate = torch.full((B, T, H), 1.002)
    elif gname == "row scales":
        gate = torch.sigmoid(torch.randn(B, T, H, generator=gen))
        q, k, v, dy = (x * 10.0 ** (6 * torch.rand(B, T, H, 1, generator=gen) - 3) for x in (q, k, v, dy))
    elif gname in [m[1] for m in MASKED]:  # (a loss on few steps; the thirty-second session's holes of split t / k)
        gate = torch.full((B, T, H), 0.3) if gname.startswith("g0.3") else torch.sigmoid(torch.randn(B, T, H, generator=gen))
        t = torch.arange(T)
        if gname.startswith("dy masked"):
            dy[:, t % 64 < 48 if gname.endswith("early") else t % 64 >= 16] = 0
        elif gname == "q early, dy late":  # they meet on steps 24 .. 39 of each chunk only
            q[:, t % 64 >= 40] = 0
            dy[:, t % 64 < 24] = 0
        elif gname == "g0.3, dy k-step's last step":  # q A[t] falls 2^-26 within one 16-step k-step
            dy[:, t % 16 != 15] = 0
        else:  # last-token loss: dy at step T - 1 only
            dy[:, :T - 1] = 0
    elif gname in NONFINITE:
        gate = torch.sigmoid(torch.randn(B, T, H, generator=gen))
        name, at, x = NONFINITE[gname]
        (k if name == "k" else dy)[at] = x
    else:
        spec = GATES[gname]
        if spec is None:
            gate = torch.sigmoid(torch.randn(B, T, H, generator=gen))
        elif isinstance(spec, float):
            gate = torch.full((B, T, H), spec)
        else:
            gate = spec[0] + (spec[1] - spec[0]) * torch.rand(B, T, H, generator=gen)
        if gname == "zeros-at-steps":
            gate[:, [t for t in ZERO_STEPS if t < T]] = 0.0
    dsT = torch.randn(B, H, 128, 128, generator=gen) if with_dsT else None
    return q, k, v, gate, beta, dy, dsT


def rel(x, ref):
    """Relative L2 error (absolute where the reference is exactly zero, e.g. dS_0 at a zero first gate)."""
    err = (x.double().cpu() - ref.double()).norm().item()
    n = ref.double().norm().item()
    return err / n if n > 0 else err


def cpu_check(names, header, reference, models, line, emulated_worst, split="b"):
    """--cpu-check: at every case, a pass's chunk model (float64) and its emulation in split's scheme (RN, RZ)
    against the reference, per gradient of `names`. models(case) gives model(emulate, split) of the case's inputs;
    line(row) prints a row; emulated_worst(rows, label) gives the emulation's worst (recorded) and the line that says
    it (label: the scheme's, SPLITS')."""
    rows, worst = [], 0.0
    print(header)
    for n, (shape, gname, with_dsT) in enumerate(cases()):
        case = make_case(shape, gname, with_dsT, seed=100 + n)
        ref = reference(*case)
        model = models(*case)
        row = {"shape": shape, "gate": gname, "dsT": with_dsT}
        row.update({f"model_{x}": rel(m, r) for x, m, r in zip(names, model(None, split), ref)})
        worst = max([worst] + [row[f"model_{x}"] for x in names])
        for mode in ("rn", "rz"):
            row.update({f"emu_{mode}_{x}": rel(m, r) for x, m, r in zip(names, model(mode, split), ref)})
        rows.append(row)
        print(line(row), flush=True)
    emu_worst, emu_line = emulated_worst(rows, SPLITS[split][1])
    print(f"model against naive: worst rel-L2 {worst:.2e} (float64; ~1e-12 or below expected)")
    print(emu_line)
    RESULT["cpu_check"] = {"rows": rows, "model_worst": worst, "emulated_worst": emu_worst, "split": split}


def on_device(case, layout):
    """A case (q, k, v, gate, beta, dy, dS_T) on the GPU in a layout the kernels take: "contiguous", or "strided": q
    stored (B, H, T, D), k in rows padded to 132 floats, v one head's rows expanded over the heads (h stride 0: the
    values change, and the CPU case returned with them), dy stored (T, B, H, D), gate a slice of (B, T, H, 2), beta
    stored (B, H, T), dS_T transposed. Returns (the CPU case, the device tensors)."""
    if layout == "contiguous":
        return case, tuple(x.cuda().contiguous() if x is not None else None for x in case)
    q, k, v, gate, beta, dy, dsT = case
    B, T, H, D = q.shape
    v = v[:, :, :1].expand(B, T, H, D).contiguous()
    kp = torch.zeros(B, T, H, D + 4)
    kp[..., :D] = k
    dev = (q.transpose(1, 2).contiguous().cuda().transpose(1, 2), kp.cuda()[..., :D],
           v[:, :, :1].contiguous().cuda().expand(B, T, H, D), torch.stack([gate, -gate], -1).cuda()[..., 0],
           beta.transpose(1, 2).contiguous().cuda().transpose(1, 2),
           dy.permute(1, 0, 2, 3).contiguous().cuda().permute(1, 0, 2, 3),
           dsT.transpose(2, 3).contiguous().cuda().transpose(2, 3) if dsT is not None else None)
    return (q, k, v, gate, beta, dy, dsT), dev


def device_check(mod, names, labels, measure, emulated_text, split):
    """--check: at every case of device_cases(), measure(mod, cpu_case, device_case, split) gives the kernels' row
    (rel-L2 per gradient of `names`, printed as `labels`, "finite" and the non-finite "flag", in the pass's order) and
    a thunk of the case's RZ emulation errors; the 1e-5 bar and the flag 0, and where a row is over the bar, whether
    the scheme itself is (emulated_text(row) prints the emulation's errors). A NONFINITE case: the flag 1, nothing
    else."""
    rows, worst = [], 0.0
    for n, (shape, gname, with_dsT, layout) in enumerate(device_cases()):
        cpu, dev = on_device(make_case(shape, gname, with_dsT, seed=100 + n), layout)
        label = f"{str(shape) + ' ' + gname + (' strided' if layout != 'contiguous' else ''):42s} " \
                f"dS_T {'yes' if with_dsT else 'no ':3s}"
        if gname in NONFINITE:
            flag = measure(mod, cpu, dev, split=split, flag_only=True)
            row = {"shape": shape, "gate": gname, "dsT": with_dsT, "layout": layout, "flag": flag, "ok": flag == 1}
            rows.append(row)
            print(f"{label}  flag {flag} (must be 1)  {'ok' if row['ok'] else 'FLAG NOT SET'}", flush=True)
            continue
        measured, emulated = measure(mod, cpu, dev, split=split)
        row = {"shape": shape, "gate": gname, "dsT": with_dsT, "layout": layout, **measured}
        row["ok"] = row["finite"] and row["flag"] == 0 and all(row[x] < 1e-5 for x in names)
        note = ""
        if row["finite"] and row["flag"] == 0 and not row["ok"]:
            # over the bar: is the scheme itself over it here (T = 1: single dot products, whose relative error grows
            # with their cancellation), and is the kernel within 2x of the scheme's emulation?
            row.update({f"emu_rz_{x}": e for x, e in zip(names, emulated())})
            row["as_emulated"] = all(row[x] < 1e-5 or (row[f"emu_rz_{x}"] >= 1e-5 and row[x] < 2 * row[f"emu_rz_{x}"])
                                     for x in names)
            note = f"  (emulated {emulated_text(row)}: " \
                   f"{'as the scheme' if row['as_emulated'] else 'WORSE than the scheme'})"
        worst = max([worst] + [row[x] for x in names]) if row["finite"] else float("inf")
        rows.append(row)
        print(f"{label}  " + "  ".join(f"{lab} {row[x]:.2e}" for x, lab in zip(names, labels))
              + f"  finite {row['finite']}  flag {row['flag']}  {'ok' if row['ok'] else 'OVER'}{note}", flush=True)
    ok = all(r["ok"] for r in rows)
    scheme = all(r["ok"] or r.get("as_emulated", False) for r in rows)
    flags = all(r["ok"] for r in rows if r["gate"] in NONFINITE) and all(r["flag"] == 0 for r in rows
                                                                       if r["gate"] not in NONFINITE)
    verdict = "PASS" if ok else "PASS but for the scheme's own error (see OVER rows)" if scheme and flags else "FAIL"
    print(f"check: worst rel-L2 {worst:.2e} against the 1e-5 bar; the non-finite flag "
          f"{'as expected' if flags else 'WRONG'} (0 on every finite case, 1 on {', '.join(NONFINITE)}): {verdict}")
    RESULT["check"] = {"rows": rows, "worst": worst, "flags": flags, "pass": ok, "verdict": verdict}


def bench_report(st, shape, attrs, trials, finite):
    """--bench's line and RESULT["bench"]: kernelbench_time's stats st of one call at shape (B, T, H) as us a
    64-step chunk and SM; attrs, the kernel's attributes function (registers, local bytes first)."""
    B, T, H = shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunks_per_sm = B * H * math.ceil(T / 64) / sms
    us = st["median"] * 1e3 / chunks_per_sm
    regs, local = attrs()[:2]
    print(f"bench ({B}, {T}, {H}, 128): median {st['median']:.3f} ms over {trials} calls (L2 flushed), "
          f"{chunks_per_sm:.1f} chunks an SM ({sms} SMs): {us:.3f} us a 64-step chunk and SM "
          f"({regs} regs, {local} B local); finite {finite}", flush=True)
    RESULT["bench"] = {"shape": [B, T, H, 128], "ms": st, "sms": sms, "chunks_per_sm": chunks_per_sm,
                       "us_per_chunk_sm": us, "registers": regs, "local_bytes": local}


def save_result(json_name):
    """$OUT/json_name where OUT is set (the device call); nothing written into the tree otherwise."""
    if "OUT" in os.environ:
        save(json_name, RESULT)


def split_registers_guard(mod, regs=168):
    """main's check before a launch: each kernel's setmaxnreg split assumes `regs` registers a thread (with another
    count the unit's launch returns an error rather than hang in setmaxnreg.inc: said here before any launch)."""
    for which, kernel in KERNELS.items():
        got = mod.bwd32_attrs(which)[0]
        if got != regs:
            sys.exit(f"{kernel} has {got} registers, not {regs}: its setmaxnreg split would hang; not launched")


def main(doc, json_name, check_help, cpu_check, device_check, bench, split):
    """A harness's command line (its module docstring doc); split: the scheme the production kernel runs (--check's
    emulation beside the kernel is that scheme's; --cpu-check emulates any)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--cpu-check", action="store_true", help="the chunk model against naive; no GPU, no build")
    ap.add_argument("--build-only", action="store_true", help="compile, print the ptxas report; no GPU")
    ap.add_argument("--check", action="store_true", help=check_help)
    ap.add_argument("--bench", action="store_true", help="device: the kernel's time at (16, 4096, 32, 128)")
    ap.add_argument("--trials", type=int, default=20, help="timed calls in --bench")
    ap.add_argument("--split", choices=sorted(SPLITS), default=split,
                    help="the scheme (training-design 8.4, 8.6, 8.7): b, bf16 x3; d, fp16 x3 with power-of-two "
                         "scales a row of A and a column of B; t, one scale a tile; k / r, t with scales along the steps (a "
                         "16-step k-step / every step) and each product over the steps compensated on its own operand "
                         f"(StepScaled). --cpu-check emulates any; the kernel (solution.py's) runs {split}")
    args = ap.parse_args()
    if args.split != split and not args.cpu_check:  # --check's emulation beside the kernel is the kernel's
        ap.error(f"--split {args.split} is --cpu-check's only here (the kernel: {split})")
    if args.cpu_check:
        cpu_check(args.split)
        save_result(json_name)
        return
    RESULT["split"] = args.split
    mod = build_module()
    if args.build_only:
        return
    RESULT.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    split_registers_guard(mod)
    if args.check or not args.bench:
        device_check(mod, args.split)
        save_result(json_name)
    if args.bench:
        bench(mod, args.trials)
    save_result(json_name)
    print(f"results: {os.path.join(os.environ.get('OUT', '.'), json_name)}", flush=True)
