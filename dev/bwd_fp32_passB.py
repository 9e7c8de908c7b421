"""Pass B of the float32 Hopper backward (docs/training-design.md 8.2 "Two passes", 8.4 option (b)): dv and the state
gradient's chain, sm_90a, one standalone dev script run from the repository root. What it shares with pass A (the CUDA
preamble and kernel entry, the host helpers, the build, the chunk models' products, padding and tables, the cases,
the check loops, the command line) is dev/bwd_fp32_common.py's.

What it computes, for float32 q, k, gate, beta, dy of (B, T, H, 128) / (B, T, H) contiguous (v is not needed) and an
optional d_final_state (B, H, 128, 128): dv (B, T, H, 128) float32 and, optionally, dS_0 (B, H, 128, 128), the
gradient of the initial state. No checkpoints. Any T: the last chunk's rows past T are zero, their gates 1, betas 0.

Design (per (b, h) one CTA of 384 threads, chunks of 64 steps backwards, chunk_bwd_sm90's conventions and math):
  - tables (WG0, fp32 direct products, never a division: gates may be 0, negative or > 1): L[t][s] =
    prod_{r=s+1..t} g_r (packed lower triangle, chunk_bwd_sm90's lp), A[t] = prod_{r<=t} g_r, w_s = L[63][s], beta,
    beta w; built for chunk ch - 1 during chunk ch (two buffers), with an L2 prefetch of chunk ch - 1's rows;
  - the consumers (two warpgroups, setmaxnreg 232; WG0 40): q, k, dy fp32 rows land by cp.async in their own
    pair's space during the chunk before, as soon as it has read that pair (q after QK, k after KG, dy after U);
    the top splits q and k in place into bf16 pairs (hi = RN(x), lo = RN(x - hi)), and q scaled by A[t] (fp32) into
    a fourth pair qA, so that G's update is an SS product with no fragments built in registers; dy is split while
    KG runs (thirty-first session; before it, every chunk's rows were loaded from global memory at its top);
  - every product three bf16 wgmma terms a k-step (hh + hl + lh): QK (consumer c its columns s = 32 c ..), MP[u][s]
    = L[u][s] beta_s QK[u][s] for s <= u (split, shared memory); KG = K G (B = G's pair, columns j = 64 c ..),
    dv = diag(beta w) KG + MP^T dY; U = (diag(A) Q)^T dY from zero (rows i = 64 c ..) and G = fmaf(A_63, G, U):
    wgmma's in-place accumulation truncates (perf-notes, thirtieth session), so G's chain never accumulates in
    place; G's pair rewritten for the next chunk's KG. G starts as d_final_state or zero.
  - --split t builds the kernel with training-design 8.6's scheme instead: the pairs fp16 hi / lo, each tile's values
    times a power of two 2^-e that brings its max |x| near 2^15 (e from each warp's maximum, gathered through 8
    slots across a barrier the chunk already has, and one more for MP), and each product's accumulator times
    2^(e_A + e_B); the same products, on f16 wgmma forms. Its --check compares against that scheme's emulation.
  - --split r builds it with training-design 8.7's scales along the steps (one exponent a step; StepScaled, the
    model's option r): fp16 pairs and f16 forms as t, but q, k, dy and q A[t] take an exponent a row (step) from
    the row's max |x| at its in-place split (four lanes a row: two shuffles), q's, k's and dy's into int8 tables in
    the slots' space; QK's accumulator takes q's row factor and k's column factor, KG k's row factor and G's tile
    factor (G stays one exponent a tile, t's); the two products over the steps read dy's pair as stored and
    compensate their other operand against it: MP (row exponents over each consumer's columns, combined after
    barrier (2), so t's barrier (1c) goes) is split after (2a) with rows u times 2^(e_y[u] - E), and qA's pair (split
    at the top at its own row exponents) is rescaled in place while KG runs, rows times 2^(e_qa + e_y - E) by two
    fp16 multiplies; E (each product's largest e_comp + e_y) from 8 warp slots read after (2a); zero rows of dy,
    MP or qA zeroed. MP^T dY is formed from zero at 2^E (its own 32 registers) while KG is scaled, then added to KG
    beta w by one add; U from zero as before. Powers of two past a normal float's range as two multiplies
    (exp2_pair); exponents clamped at -126 as t's (the model has the clamp too). No new barrier; the MP split
    and qA's rescale run after KG's issue.
  Shared memory 232,192 B (r: 232,448, the opt-in maximum: 256 B more of slots): pairs q, qA, k, dy (32 KB each), G
  (64 KB), MP (16 KB), two table buffers, the gates, the tile scales' slots.

    python3 dev/bwd_fp32_passB.py --cpu-check [--split b|d|t|k|r] (no GPU, no build: the float64 chunk model against
                                  naive.chunked_backward_naive, and the emulation's error: b, the kernel's bf16 x3
                                  (default); d, 8.4's fallback, fp16 x3 with power-of-two scales, every product;
                                  t, d with one scale a tile; k, r: scales along the steps, r as the kernel
                                  forms it)
    python3 dev/bwd_fp32_passB.py --build-only [--split b|t|r]   (no GPU; CUDA_HOME=/usr/local/cuda
                                  TORCH_CUDA_ARCH_LIST=9.0a; --check and --bench take --split too)
    python3 dev/bwd_fp32_passB.py --check        (device: dv and dS_0 against float64, the 1e-5 bar)
    python3 dev/bwd_fp32_passB.py --bench [--trials N]   (device: (16, 4096, 32, 128), us a chunk and SM)
  Results go to $OUT/bwd_fp32_passB.json.

Verified locally (no GPU, CUDA 13.0): --cpu-check: the float64 model (the kernel's tables and chunk formulas) against
naive.chunked_backward_naive at every case of --check, worst rel-L2 1e-14 (dv and dS_0); the model in float32 with
bf16 x3 products (rounding to nearest or truncating) at 6.0-6.9e-6 (dv) and 4.2-4.7e-6 (dS_0), but T = 1, where dv
is a single q.k product and its relative error follows that dot's cancellation: up to 1.9e-5 (--check reports such
a case as OVER with the emulation beside it). --build-only: 168 registers, no stack, no spills, no ptxas wgmma
warning (the #177 lines are the probe's unused helpers). On the device (thirty-first session): --check equal to the
bf16 x3 emulation in every case; its timings, before and after the loads were overlapped, are in perf-notes.
--split t (written after that session's device time): compiled (168 registers, 40 / 48 B spilled), not run; a
helper's CPU emulation of the kernel's own arithmetic equals pass_b_model(split="t") bit for bit on every --check
case (its review found the two-exponent products' overflow, fixed by applying them one at a time).
--split r (thirty-third session, a helper; not run on a device): compiled, 168 registers, no stack, no spills (b's
SASS unchanged but for names, t's ptxas numbers unchanged); a CPU emulation of the kernel's own arithmetic
(scratch/h5_emu_passB.py: its exponents from the maxima's bits, its multiplies in order, fp16 splits and HMUL2s,
three terms a k-step into float32, G's join an exact fmaf) equals pass_b_model(split="r") bit for bit on every
--check case, rounding to nearest and truncating; --cpu-check --split r: worst rel-L2 1.83e-6 (dv), 1.25e-6 (dS_0).
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # dev/ (the shared part)
import bwd_fp32_common as common  # noqa: E402
import fp32_split_emulation as emu  # noqa: E402
import naive  # noqa: E402
from bwd_fp32_common import rel  # noqa: E402
from timing import kernelbench_time  # noqa: E402

torch.set_grad_enabled(False)

# The kernel's CUDA text after tools/sm90_build.probe_cuda's head and the probe's k-step helpers (namespace pb).
CUDA_SRC = r"""
// Shared memory (bytes). Pairs (hi at off, lo at off + kTile; [d / 8][t][8]): q, qA (q_t A[t]), k, dy; G's pair
// ([j / 8][i][8], hi then lo 32 KB each); MP's pair ([s / 8][u][8], lo at + kW); two table buffers; the gates.
constexpr int kTile = 16384, kW = 8192;
constexpr int kQ = 0, kQA = 32768, kK = 65536, kY = 98304, kGH = 131072, kGL = 163840, kMP = 196608, kTab = 212992;
// a table buffer (floats): L packed (lp) at 0, then A, w, beta, beta w (chunk_bwd_sm90's tables without Ah, gate)
constexpr int kA = 2080, kWt = kA + 64, kBeta = kA + 128, kBW = kA + 192, kTabBuf = (kA + 256) * 4;
// kScl: the tile scales' slots (split t): a float per consumer warp and tile (q, qA, k, dy, G, MP); split r
// (kR, set by the build, with SPLIT_T true): 512 B, G's slots as t's, the steps' exponent tables and E's slots (kEq).
constexpr bool kR = SPLIT_R;
constexpr int kGates = kTab + 2 * kTabBuf, kScl = kGates + 256, kSmem = kScl + (kR ? 512 : 256);
static_assert(kSmem <= 232448, "fits the opt-in shared memory of an H200");
constexpr int kAuxRegs = 40, kConsRegs = 232;
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");

struct Params {
  const float *q, *k, *dy, *gate, *beta, *dfinal;  // dfinal: nullptr for zero
  float *dv, *ds0;                                  // ds0: nullptr when not wanted
  int T, H, nck;
};

DECAY_TABLES
__device__ __forceinline__ float* ltab(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kTab + (ch & 1) * kTabBuf);
}
// Barriers: 1 the consumers (the probe's consumers_sync); 2 everyone, non-aligned (the roles reach it from different
// code); 5 WG0.
__device__ __forceinline__ void sync_all() { asm volatile("barrier.sync 2, 384;\n" ::: "memory"); }
__device__ __forceinline__ void wg0_sync() { asm volatile("barrier.sync 5, 128;\n" ::: "memory"); }
__device__ __forceinline__ const float* row_of(const float* x, const Params& p, int64_t b, int64_t h, int t) {
  return x + ((b * p.T + t) * p.H + h) * 128;
}
// The state gradient's rows ir, ir + 8 (m64n128 accumulator layout: columns 8 n + 2 q (+1)) at the start: (b, h) =
// bh's d_final_state, or zero where dfinal is nullptr.
__device__ __forceinline__ void load_g(float (&G)[64], const float* dfinal, int64_t bh, int ir, int q) {
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float2 x = make_float2(0.f, 0.f);
      if (dfinal) x = *reinterpret_cast<const float2*>(dfinal + bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q);
      G[4 * n + 2 * hh] = x.x;
      G[4 * n + 2 * hh + 1] = x.y;
    }
}

// WG0: chunk ch's tables into buffer ch & 1, as chunk_bwd_sm90's build_tables: lane l of warp 0 runs columns 2 l,
// 2 l + 1 of L by running products (L[t][s] = L[t-1][s] g_t), then w and beta w; warp 1 runs A[t] = A[t-1] g_t.
__device__ __forceinline__ void build_tables(const Params& p, unsigned char* sm, int64_t b, int64_t h, int ch) {
  const int tid = threadIdx.x, lane = tid & 31;
  float* L = ltab(sm, ch);
  float* gs = reinterpret_cast<float*>(sm + kGates);
  if (tid < 64) {
    const int t = ch * 64 + tid;
    const int64_t o = (b * p.T + t) * p.H + h;
    gs[tid] = t < p.T ? p.gate[o] : 1.f;  // past T: the identities
    L[kBeta + tid] = t < p.T ? p.beta[o] : 0.f;
  }
  wg0_sync();
  if (tid >= 64) return;
  const float ga = gs[lane], gb = gs[32 + lane];  // g_t = (t < 32 ? ga : gb) of lane t % 32
  if (tid < 32) {
    const int s = 2 * lane;
    float r0, r1;
    l_columns(L, ga, gb, s, r0, r1);  // (chunk_bwd_sm90's own, from solution.py)
    L[kWt + s] = r0;  // w_s = L[63][s]
    L[kWt + s + 1] = r1;
    L[kBW + s] = L[kBeta + s] * r0;
    L[kBW + s + 1] = L[kBeta + s + 1] * r1;
  } else {
    float run = 1.f;
#pragma unroll 8
    for (int t = 0; t < 64; ++t) {
      run *= __shfl_sync(0xffffffffu, t < 32 ? ga : gb, t & 31);
      if (lane == 0) L[kA + t] = run;
    }
  }
}
// WG0: chunk ch's q, k, dy rows into L2 a chunk ahead of the consumers' loads (6 lines of 128 B a thread; not
// unrolled: unrolled, it spilled at WG0's 40 registers).
__device__ __forceinline__ void prefetch_chunk(const Params& p, int64_t b, int64_t h, int ch) {
#pragma unroll 1
  for (int m = 0; m < 6; ++m) {
    const int x = threadIdx.x + 128 * m, tile = x >> 8, r = (x >> 2) & 63, t = ch * 64 + r;
    if (t >= p.T) continue;
    const float* src = row_of(tile == 0 ? p.q : tile == 1 ? p.k : p.dy, p, b, h, t) + 32 * (x & 3);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src));
  }
}

// 8 fp32 values to a pair's hi and lo (16 bytes each, lo kTile after hi), each times scale.
// The pairs' scheme (training-design 8.4, 8.6; kT, set by the build): bf16 hi = RN(x), lo = RN(x - hi) (b), or
// the same in fp16 (t), x already times its tile's power of two (tile_exp) so that the tile's max |x| is near 2^15.
constexpr bool kT = SPLIT_T;
__device__ __forceinline__ void psplit(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kT) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const __half2 l = __floats2half2_rn(x0 - __low2float(h), x1 - __high2float(h));
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    split2<2>(x0, x1, hi, lo);
  }
}
__device__ __forceinline__ void put_pair(unsigned char* dst, const float4& a, const float4& b, float scale) {
  uint4 hi, lo;
  psplit(a.x * scale, a.y * scale, hi.x, lo.x);
  psplit(a.z * scale, a.w * scale, hi.y, lo.y);
  psplit(b.x * scale, b.y * scale, hi.z, lo.z);
  psplit(b.z * scale, b.w * scale, hi.w, lo.w);
  *reinterpret_cast<uint4*>(dst) = hi;
  *reinterpret_cast<uint4*>(dst + kTile) = lo;
}
// The loads overlap the chunk before: a tile's raw fp32 rows (64 x 512 B, the size of its pair) land by cp.async
// in its own pair's space once the chunk before has read that pair (q after QK, k after KG, dy after U), and the
// next top splits them in place. Row t's 16-byte piece c at t 512 + 16 (c ^ (t % 8)): the split's reads (8 rows, one
// piece, a quarter warp) hit every bank once. Rows past T: zero-filled (source size 0).
__device__ __forceinline__ uint32_t raw_off(int t, int c16) { return (uint32_t)(t * 512 + ((c16 ^ (t & 7)) << 4)); }
__device__ __forceinline__ void issue_raw(const Params& p, unsigned char* sm, int base, const float* x, int64_t b,
                                          int64_t h, int ch, int lt) {
  const int c16 = lt & 31;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int t = (lt >> 5) + 8 * i;
    const bool valid = ch * 64 + t < p.T;
    const float* src = row_of(x, p, b, h, valid ? ch * 64 + t : 0) + 4 * c16;
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sm + base + raw_off(t, c16));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void raw_wait() {  // this thread's groups but the newest N have landed
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Thread lt's share of a raw tile: row t = 8 (lt / 32) + lt % 8, 8-column pieces kc = (lt / 8) % 4 + 4 m.
__device__ __forceinline__ void read_raw(const unsigned char* sm, int base, int lt, float4 (&v)[4][2]) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      v[m][e] = *reinterpret_cast<const float4*>(sm + base + raw_off(t, 2 * (4 * m + kq) + e));
}
// ... and its pieces written back as the tile's pair ([d / 8][t][8]: a quarter warp's 8 rows x 16 B, no conflicts).
__device__ __forceinline__ void write_pair(unsigned char* sm, int base, int lt, const float4 (&v)[4][2], float scale) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
#pragma unroll
  for (int m = 0; m < 4; ++m) put_pair(sm + base + (4 * m + kq) * 1024 + t * 16, v[m][0], v[m][1], scale);
}
// The tile exponents of split t (pass A takes these from here with the pair helpers): each warp's max |x| of a
// tile into its slot (8 floats a tile at kScl), then, after a barrier, the tile's exponent e over N of its slots
// from `first` (fp32_split_emulation's pow2_scale: e = ceil(log2 max) - 15, 0 for a zero tile; clamped at -126 so
// that 2^-e stays a normal float, where the emulation has no clamp: tiles of max |x| <= 2^-111 differ from it);
// values are split times 2^-e and a product's accumulator takes 2^e_A and 2^e_B.
__device__ __forceinline__ void put_max(unsigned char* sm, int tile, int slot, float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) reinterpret_cast<float*>(sm + kScl)[8 * tile + slot] = m;
}
template <int N>
__device__ __forceinline__ int tile_exp(const unsigned char* sm, int tile, int first = 0) {
  const float* sl = reinterpret_cast<const float*>(sm + kScl) + 8 * tile + first;
  float m = sl[0];
#pragma unroll
  for (int w = 1; w < N; ++w) m = fmaxf(m, sl[w]);
  if (!(m > 0.f)) return 0;
  int ex;
  const float fr = frexpf(m, &ex);  // m = fr 2^ex, fr in [0.5, 1): ceil(log2 m) = ex, or ex - 1 at fr = 0.5
  return max((fr == 0.5f ? ex - 1 : ex) - 15, -126);
}
// 2^e for one tile's exponent or its negation (|e| <= 126: a normal float); two tiles' scale is applied as two
// multiplies, never as the product exp2i(a) exp2i(b), which may overflow or underflow where the values do not.
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((127 + e) << 23); }
__device__ __forceinline__ float max_abs(const float4 (&v)[4][2], float scale = 1.f) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v[i][e].x * scale), fabsf(v[i][e].y * scale)),
                         fmaxf(fabsf(v[i][e].z * scale), fabsf(v[i][e].w * scale))));
  return m;
}
template <int N>
__device__ __forceinline__ float max_abs(const float (&x)[N]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) m = fmaxf(m, fabsf(x[i]));
  return m;
}
// Split t's tile scales: pass B's tiles (pass A's splice of this text ends here)
enum { sQ, sQA, sK, sY, sG, sMP };
// Split r (training-design 8.7; StepScaled with one exponent a step): q, k, dy and q A[t] have an exponent a row
// (step), from the row's max |x| at its split (read_raw's layout: four lanes a row, two shuffles); int8 tables at
// kScl: e_q, e_k, e_y (kEq, kEk, kEy) and MP's row exponents over each consumer's 32 columns (kEmp, 64 c + u); E's
// slots (kEs: int, a warp's largest product exponent of dv's MP^T dY at 0 .., of U's at 8 ..); G's float slots stay
// t's (sG, bytes 128 ..). kNone: a zero row's exponent where it zeroes a product's step (dy, MP, qA); q's and k's
// zero rows take 0 (their factor 1, as StepScaled's scale of -inf).
constexpr int kEmp = kScl, kEs = kScl + 160, kEq = kScl + 256, kEk = kScl + 320, kEy = kScl + 384;
constexpr int kNone = -128, kLow = -1024;
__device__ __forceinline__ const signed char* etab(const unsigned char* sm, int off) {
  return reinterpret_cast<const signed char*>(sm + off);
}
// ceil(log2 m) - 15 of a maximum m (pow2_scale's, from m's bits), clamped at -126 as tile_exp; `none` for m = 0.
__device__ __forceinline__ int row_exp(float m, int none) {
  if (!(m > 0.f)) return none;
  const int bits = __float_as_int(m);
  return max((bits >> 23) - 127 + ((bits & 0x7fffff) != 0) - 15, -126);
}
// The max of m over the four lanes of a row in read_raw's layout (lanes l, l ^ 8, l ^ 16, l ^ 24).
__device__ __forceinline__ float row_max(float m) {
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
}
// 2^d as two normal floats f1 f2 (d clamped to +-252; d >> 1 and d - (d >> 1) share d's sign, so x f1 f2 is x 2^d
// rounded once wherever x 2^d is a normal float)
__device__ __forceinline__ void exp2_pair(int d, float& f1, float& f2) {
  d = min(max(d, -252), 252);
  f1 = exp2i(d >> 1);
  f2 = exp2i(d - (d >> 1));
}
// 2^e in both halves of an fp16 pair, e in [-24, 0] (subnormal below -14)
__device__ __forceinline__ uint32_t h2pow(int e) {
  const uint32_t x = e >= -14 ? (uint32_t)(e + 15) << 10 : 1u << (e + 24);
  return x | x << 16;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// q A[t]'s pair, split at its own row exponents at the top, rescaled in place once dy's are known: row t (read_raw's
// share: 4 pieces of hi and of lo) times 2^d, d = e_qa + e_y - E (none: zeroed), as two fp16 multiplies, 2^max(d,
// -24) then 2^max(d - max(d, -24), -24) (each product rounded to fp16, as contract_r_qa).
__device__ __forceinline__ void rescale_qa(unsigned char* sm, int lt, int d, bool none) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3, d1 = max(d, -24);
  const uint32_t f1 = none ? 0u : h2pow(d1), f2 = h2pow(max(d - d1, -24));
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int lo = 0; lo < 2; ++lo) {
      uint4* x = reinterpret_cast<uint4*>(sm + kQA + lo * kTile + (4 * m + kq) * 1024 + t * 16);
      uint4 v = *x;
      v.x = hmul2(hmul2(v.x, f1), f2);
      v.y = hmul2(hmul2(v.y, f1), f2);
      v.z = hmul2(hmul2(v.z, f1), f2);
      v.w = hmul2(hmul2(v.w, f1), f2);
      *x = v;
    }
}
// Split r's MP values (mp_values with QK's factors a row u, 2^e_q[u], and a column s, 2^e_k[s]) and their row
// exponents over this consumer's 32 columns into kEmp (for E, after barrier (2)).
__device__ __forceinline__ void mp_values_r(float (&X)[16], const float* L, unsigned char* sm, int c, int wl, int g,
                                            int q) {
  const signed char *eq = etab(sm, kEq), *ek = etab(sm, kEk);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int u = 16 * wl + g + 8 * hh;
    const float fu = exp2i(eq[u]);
    float m = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int s = 32 * c + 8 * n + 2 * q;
      float& x0 = X[4 * n + 2 * hh];
      float& x1 = X[4 * n + 2 * hh + 1];
      x0 = s <= u ? x0 * fu * exp2i(ek[s]) * L[lp(u, s)] * L[kBeta + s] : 0.f;
      x1 = s + 1 <= u ? x1 * fu * exp2i(ek[s + 1]) * L[lp(u, s + 1)] * L[kBeta + s + 1] : 0.f;
      m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    if (q == 0) reinterpret_cast<signed char*>(sm + kEmp)[64 * c + u] = (signed char)row_exp(m, kNone);
  }
}
// ... and taken to dv's product scale before their split: row u times 2^(e_y[u] - E) (zero where dy's row is zero).
__device__ __forceinline__ void mp_scale_r(float (&X)[16], const unsigned char* sm, int wl, int g, int ev) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int ey = etab(sm, kEy)[16 * wl + g + 8 * hh];
    float f1, f2;
    exp2_pair(ey - ev, f1, f2);
    if (ey == kNone) f1 = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      X[4 * n + 2 * hh] = X[4 * n + 2 * hh] * f1 * f2;
      X[4 * n + 2 * hh + 1] = X[4 * n + 2 * hh + 1] * f1 * f2;
    }
  }
}
// MP[u][s] = L[u][s] beta_s QK[u][s] (s <= u, else 0) from consumer c's 64 x 32 accumulator X (rows u = 16 wl + g
// (+8), columns s = 32 c + 8 n + 2 q (+1)); split, stored [s / 8][u][8] (chunk_bwd_sm90's put_weights, its order of
// the products).
// mp_values: X becomes MP's values (X first times QK's 2^e_q, 2^e_k, one at a time: their product may leave the
// float range where the values do not); put_mp stores them times scale.
__device__ __forceinline__ void mp_values(float (&X)[16], const float* L, int c, int wl, int g, int q, float s1,
                                          float s2) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int u = 16 * wl + g + 8 * hh, s = 32 * c + 8 * n + 2 * q;
      float& x0 = X[4 * n + 2 * hh];
      float& x1 = X[4 * n + 2 * hh + 1];
      x0 = s <= u ? x0 * s1 * s2 * L[lp(u, s)] * L[kBeta + s] : 0.f;  // (every lp(u, s < 64) is inside L)
      x1 = s + 1 <= u ? x1 * s1 * s2 * L[lp(u, s + 1)] * L[kBeta + s + 1] : 0.f;
    }
}
__device__ __forceinline__ void put_mp(unsigned char* sm, const float (&X)[16], int c, int wl, int g, int q,
                                       float scale) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int u = 16 * wl + g + 8 * hh, s = 32 * c + 8 * n + 2 * q;
      uint32_t hi, lo;
      psplit(X[4 * n + 2 * hh] * scale, X[4 * n + 2 * hh + 1] * scale, hi, lo);
      const int off = (s >> 3) * 1024 + u * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + kMP + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kMP + kW + off) = lo;
    }
}
// G's rows ir, ir + 8 (all columns) as its pair ([j / 8][i][8], MN-major for KG's B).
__device__ __forceinline__ void put_g(unsigned char* sm, const float (&G)[64], int ir, int q, float scale) {
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = ir + 8 * hh, j = 8 * n + 2 * q;
      uint32_t hi, lo;
      psplit(G[4 * n + 2 * hh] * scale, G[4 * n + 2 * hh + 1] * scale, hi, lo);
      const int off = (j >> 3) * 2048 + i * 16 + (j & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + kGH + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kGL + off) = lo;
    }
}

// Consumer c (0, 1): G's rows i = 64 c .. 64 c + 63 in its accumulator G (m64n128 layout: rows ir (+8), columns
// 8 n + 2 q (+1)); dv's columns j = 64 c ..
__device__ __forceinline__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh) {
  const int lt = threadIdx.x - 128, wl = (lt >> 5) & 3, lane = lt & 31, g = lane >> 2, q = lane & 3;
  const int ir = 64 * c + 16 * wl + g;
  const int64_t b = bh / p.H, h = bh - b * p.H;
  float G[64];
  {  // the last chunk's raw rows (later chunks': issued during the chunk before)
    const int cl = p.nck - 1;
    issue_raw(p, sm, kQ, p.q, b, h, cl, lt);
    issue_raw(p, sm, kK, p.k, b, h, cl, lt);
    issue_raw(p, sm, kY, p.dy, b, h, cl, lt);
  }
  load_g(G, p.dfinal, bh, ir, q);
  int eg = 0;  // (split t) the exponent of G's pair: its tile's max |G| near 2^15
  if constexpr (kT) {
    put_max(sm, sG, lt >> 5, max_abs(G));
    consumers_sync();
    eg = tile_exp<8>(sm, sG);
  }
  put_g(sm, G, ir, q, exp2i(-eg));
  fence_async_smem();
  sync_all();  // (0) G's pair; the last chunk's tables
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    const float* L = ltab(sm, ch);
    int eq = 0, eqa = 0, ek = 0, ey = 0, emp = 0;  // (split t) this chunk's tile exponents; (r) this thread's rows'
    int ev = 0, eu = 0;  // (split r) the product exponents E of dv's MP^T dY and of U
    {  // q and k: raw rows to pairs (qA = q A[t] in fp32, then split: one rounding); dy's may still be in flight
      raw_wait<1>();
      consumers_sync();  // (1a) every thread's q and k rows landed
      float4 vq[4][2], vk[4][2];
      read_raw(sm, kQ, lt, vq);
      read_raw(sm, kK, lt, vk);
      const float a = L[kA + 8 * (lt >> 5) + (lt & 7)];
      if constexpr (kR) {  // this thread's row t's exponents; q's and k's into their tables
        const int t = 8 * (lt >> 5) + (lt & 7);
        eq = row_exp(row_max(max_abs(vq)), 0);
        eqa = row_exp(row_max(max_abs(vq, a)), kNone);
        ek = row_exp(row_max(max_abs(vk)), 0);
        if ((lt & 24) == 0) {
          reinterpret_cast<signed char*>(sm + kEq)[t] = (signed char)eq;
          reinterpret_cast<signed char*>(sm + kEk)[t] = (signed char)ek;
        }
      } else if constexpr (kT) {
        put_max(sm, sQ, lt >> 5, max_abs(vq));
        put_max(sm, sQA, lt >> 5, max_abs(vq, a));  // (q A[t] in fp32, as it is split)
        put_max(sm, sK, lt >> 5, max_abs(vk));
      }
      consumers_sync();  // (1b) the raw tiles read: their space becomes the pairs; the tiles' maxima
      if constexpr (kT && !kR) {
        eq = tile_exp<8>(sm, sQ);
        eqa = tile_exp<8>(sm, sQA);
        ek = tile_exp<8>(sm, sK);
      }
      write_pair(sm, kQ, lt, vq, exp2i(-eq));
      write_pair(sm, kQA, lt, vq, a * exp2i(kR && eqa == kNone ? 0 : -eqa));  // (q (A[t] 2^-e) rounds as (q A[t]) 2^-e)
      write_pair(sm, kK, lt, vk, exp2i(-ek));
    }
    fence_async_smem();
    consumers_sync();  // (1) q, qA and k's pairs
    float X[16];  // QK[:, 32 c ..]: B = k's rows s = 32 c .. (K-major: LBO stays the tile's 1024)
    {
      ss_product<3, 0, 0, 8, true>(X, sm, kmaj(kQ, kTile, 64), Op{kK + 512 * c, kK + 512 * c + kTile, 1024, 128, 2048});
      wg_wait<0>();
      acc_fence(X);
      if constexpr (kR) {
        mp_values_r(X, L, sm, c, wl, g, q);  // (split after (2a), dy's exponents known)
      } else {
        mp_values(X, L, c, wl, g, q, exp2i(eq), exp2i(ek));
        if constexpr (kT) {
          put_max(sm, sMP, lt >> 5, max_abs(X));
          consumers_sync();  // (1c) MP's maximum
          emp = tile_exp<8>(sm, sMP);
        }
        put_mp(sm, X, c, wl, g, q, exp2i(-emp));
      }
    }
    raw_wait<0>();
    fence_async_smem();
    consumers_sync();  // (2) MP whole; every thread's dy rows landed; both QKs have read q's pair
    float4 vy[4][2];
    read_raw(sm, kY, lt, vy);
    if constexpr (kR) {  // dy's row exponent; the row's product exponents of dv (MP's row, both consumers') and U
      const int t = 8 * (lt >> 5) + (lt & 7);
      ey = row_exp(row_max(max_abs(vy)), kNone);
      const int em = max(etab(sm, kEmp)[t], etab(sm, kEmp)[64 + t]);
      int pv = ey == kNone || em == kNone ? kLow : ey + em, pu = ey == kNone || eqa == kNone ? kLow : ey + eqa;
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) {  // the warp's 8 rows (a row's four lanes agree)
        pv = max(pv, __shfl_xor_sync(0xffffffffu, pv, o));
        pu = max(pu, __shfl_xor_sync(0xffffffffu, pu, o));
      }
      if ((lt & 31) == 0) {
        reinterpret_cast<int*>(sm + kEs)[lt >> 5] = pv;
        reinterpret_cast<int*>(sm + kEs)[8 + (lt >> 5)] = pu;
      }
      if ((lt & 24) == 0) reinterpret_cast<signed char*>(sm + kEy)[t] = (signed char)ey;
    } else if constexpr (kT) {
      put_max(sm, sY, lt >> 5, max_abs(vy));
    }
    consumers_sync();  // (2a) dy's raw tile read; its maximum (r: its row exponents, E's slots)
    if constexpr (kR) {
      const int* es = reinterpret_cast<const int*>(sm + kEs);
      ev = es[0];
      eu = es[8];
#pragma unroll
      for (int w = 1; w < 8; ++w) {
        ev = max(ev, es[w]);
        eu = max(eu, es[8 + w]);
      }
    } else if constexpr (kT) {
      ey = tile_exp<8>(sm, sY);
    }
    if (ch > 0) issue_raw(p, sm, kQ, p.q, b, h, ch - 1, lt);
    float R[32];  // KG, then dv: rows s = 16 wl + g (+8), columns j = 64 c + 8 n + 2 q (+1)
    ss_product<3, 0, 1, 8, true>(R, sm, kmaj(kK, kTile, 64), mnmaj(kGH + 16384 * c, kGL - kGH, 128));
    write_pair(sm, kY, lt, vy, exp2i(kR && ey == kNone ? 0 : -ey));  // (while KG runs)
    if constexpr (kR) {  // (while KG runs) qA's pair rescaled, MP taken to dv's scale and split
      rescale_qa(sm, lt, eqa + ey - eu, eqa == kNone || ey == kNone);  // (the row's own exponents: none, d unused)
      if (ev == kLow) ev = 0;  // (no step where both sides are nonzero: every product zero)
      if (eu == kLow) eu = 0;
      mp_scale_r(X, sm, wl, g, ev);
      put_mp(sm, X, c, wl, g, q, 1.f);
    }
    fence_async_smem();
    wg_wait<0>();
    acc_fence(R);
    consumers_sync();  // (2b) dy's pair whole; both KGs have read k's pair (r: MP's pair, qA's rescaled)
    if (ch > 0) issue_raw(p, sm, kK, p.k, b, h, ch - 1, lt);
    if constexpr (kR) {  // MP^T dY from zero at 2^E while KG takes 2^e_k[s] 2^e_G and beta w; then one add
      float D[32];
      ss_product<3, 1, 1, 4, true>(D, sm, mnmaj(kMP, kW, 64), mnmaj(kY + 8192 * c, kTile, 64));
      const float k2 = exp2i(eg);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int s = 16 * wl + g + 8 * ((i >> 1) & 1);
        R[i] = R[i] * exp2i(etab(sm, kEk)[s]) * k2 * L[kBW + s];
      }
      wg_wait<0>();
      acc_fence(D);
      float v1, v2;
      exp2_pair(ev, v1, v2);
#pragma unroll
      for (int i = 0; i < 32; ++i) R[i] = R[i] + __fmul_rn(D[i] * v1, v2);
    } else {
      {  // KG's scale, diag(beta w) on rows s (one rounding, as KG beta w), then MP^T dY's accumulation scale (each
         // power of two on its own: a product of two may leave the float range where the values do not)
        const float k1 = exp2i(ek), k2 = exp2i(eg), d1 = exp2i(-emp), d2 = exp2i(-ey);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * k1 * k2 * L[kBW + 16 * wl + g + 8 * ((i >> 1) & 1)] * d1 * d2;
      }
      ss_product<3, 1, 1, 4, false>(R, sm, mnmaj(kMP, kW, 64), mnmaj(kY + 8192 * c, kTile, 64));  // += MP^T dY
      wg_wait<0>();
      acc_fence(R);
      if constexpr (kT) {
        const float s1 = exp2i(emp), s2 = exp2i(ey);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * s1 * s2;
      }
    }
    // G's update from zero (its wgmmas run while dv is stored): U = (diag(A) Q)^T dY, A = qA^T, B = dy, MN-major
    float U[64];
    ss_product<3, 1, 1, 4, true>(U, sm, mnmaj(kQA + 8192 * c, kTile, 64), mnmaj(kY, kTile, 64));
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int s = 16 * wl + g + 8 * hh, t = ch * 64 + s;
        if (t < p.T)
          *reinterpret_cast<float2*>(p.dv + ((b * p.T + t) * p.H + h) * 128 + 64 * c + 8 * n + 2 * q) =
              make_float2(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);
      }
    wg_wait<0>();
    acc_fence(U);
    const float a63 = L[kA + 63];
    float u1, u2;
    if constexpr (kR) {
      exp2_pair(eu, u1, u2);
    } else {
      u1 = exp2i(eqa);
      u2 = exp2i(ey);
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) G[i] = fmaf(a63, G[i], U[i] * u1 * u2);  // one rounding: the join of 8.3
    if constexpr (kT) {
      put_max(sm, sG, lt >> 5, max_abs(G));
    }
    consumers_sync();  // (3) both consumers' KG have read G's pair, both Us dy's and qA's; G's maximum
    if (ch > 0) issue_raw(p, sm, kY, p.dy, b, h, ch - 1, lt);
    if constexpr (kT) eg = tile_exp<8>(sm, sG);
    put_g(sm, G, ir, q, exp2i(-eg));
    fence_async_smem();
    sync_all();  // (4) the chunk is done; WG0's tables of ch - 1
  }
  if (p.ds0 == nullptr) return;
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(p.ds0 + bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q) =
          make_float2(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1]);
}

// WG0: the tables a chunk ahead, and the L2 prefetch of the next chunk's rows; the block barriers (0) and (4).
__device__ __forceinline__ void aux(const Params& p, unsigned char* sm, int64_t bh) {
  const int64_t b = bh / p.H, h = bh - b * p.H;
  build_tables(p, sm, b, h, p.nck - 1);
  sync_all();  // (0)
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    if (ch > 0) {
      prefetch_chunk(p, b, h, ch - 1);
      build_tables(p, sm, b, h, ch - 1);
    }
    sync_all();  // (4)
  }
}

// The kernel (its roles and setmaxnreg split), launch_kernel and func_attrs: bwd_fp32_common's, spliced here.
KERNEL_ENTRY

int pb_run(const float* q, const float* k, const float* dy, const float* gate, const float* beta, const float* dfinal,
           float* dv, float* ds0, int B, int T, int H, cudaStream_t s) {
  return launch_kernel(Params{q, k, dy, gate, beta, dfinal, dv, ds0, T, H, (T + 63) / 64}, B * H, s);
}
int pb_attrs(int* res) { return func_attrs((const void*)passb_kernel, res); }
}  // namespace pb
"""

# The host text after bwd_fp32_common's HOST_PREAMBLE (check, f32, kernel_attrs).
HOST_SRC = r"""
namespace pb {
int pb_run(const float* q, const float* k, const float* dy, const float* gate, const float* beta, const float* dfinal,
           float* dv, float* ds0, int B, int T, int H, cudaStream_t s);
int pb_attrs(int* res);
}
// q, k, dy (B, T, H, 128); gate, beta (B, T, H); dfinal, ds0 (B, H, 128, 128) or empty (zero / not wanted).
void passb(const at::Tensor& q, const at::Tensor& k, const at::Tensor& dy, const at::Tensor& gate,
           const at::Tensor& beta, const at::Tensor& dfinal, const at::Tensor& dv, const at::Tensor& ds0) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) == 128 && k.sizes() == q.sizes() && dy.sizes() == q.sizes() &&
              dv.sizes() == q.sizes(), "q, k, dy, dv (B, T, H, 128)");
  const int B = (int)q.size(0), T = (int)q.size(1), H = (int)q.size(2);
  TORCH_CHECK(gate.dim() == 3 && gate.size(0) == B && gate.size(1) == T && gate.size(2) == H &&
              beta.sizes() == gate.sizes(), "gate, beta (B, T, H)");
  const std::vector<int64_t> st{B, H, 128, 128};
  TORCH_CHECK(dfinal.numel() == 0 || dfinal.sizes() == at::IntArrayRef(st), "dfinal (B, H, 128, 128)");
  TORCH_CHECK(ds0.numel() == 0 || ds0.sizes() == at::IntArrayRef(st), "ds0 (B, H, 128, 128)");
  for (const at::Tensor* t : {&k, &dy, &gate, &beta, &dfinal, &dv, &ds0})
    TORCH_CHECK(t->numel() == 0 || t->device() == q.device(), "every tensor on q's device");
  const c10::cuda::OptionalCUDAGuard guard(q.device());  // (the opt-in and the launch on q's device)
  TORCH_CHECK(T > 0, "T > 0 (T = 0: dS_0 = d_final_state, no launch)");
  check(pb::pb_run(f32(q), f32(k), f32(dy), f32(gate), f32(beta), dfinal.numel() ? f32(dfinal) : nullptr,
                   const_cast<float*>(f32(dv)), ds0.numel() ? const_cast<float*>(f32(ds0)) : nullptr, B, T, H,
                   c10::cuda::getCurrentCUDAStream()), "pass B launch");
}
std::vector<int64_t> passb_attrs() { return kernel_attrs(pb::pb_attrs, "pass B attributes"); }
"""
FUNCTIONS = ["passb", "passb_attrs"]


def build_module(split="b"):
    return common.build_module("bwd_fp32_passB", "pb", "passb_kernel", CUDA_SRC, HOST_SRC, FUNCTIONS, split=split)


def run_kernel(mod, q, k, gate, beta, dy, dsT=None, want_ds0=True):
    """(dv, dS_0 or None) by the kernel; both outputs NaN-poisoned first (a row it misses stays NaN)."""
    B, T, H, _ = q.shape
    dv = torch.full_like(q, float("nan"))
    ds0 = torch.full((B, H, 128, 128), float("nan"), device=q.device) if want_ds0 else q.new_empty(0)
    mod.passb(q, k, dy, gate, beta, dsT if dsT is not None else q.new_empty(0), dv, ds0)
    return dv, ds0 if want_ds0 else None


# ---------------------------------------------------------------------------------------------
# The chunk model: the kernel's tables and chunk formulas, plainly; float64, or float32 with the products as the
# kernel's bf16 x3 wgmma sequences, or (d)'s (bwd_fp32_common's model_mm).
# ---------------------------------------------------------------------------------------------
def model_state(q, k, gate, beta, dy, dsT, f):
    """What pass B's chunk models start from (and dev/bwd_fp32_passB_r_emu.py's): the shape, the padded inputs (B, H,
    64 nck, D) in dtype f, the chunk count, G (dS_T or zero), dv zeroed and the mask s <= u."""
    B, T, H, D = q.shape
    (q, k, dy), gate, beta, nck = common.model_inputs((q, k, dy), gate, beta, f)
    G = torch.zeros(B, H, D, D, dtype=f) if dsT is None else dsT.to(f).clone()
    return (B, T, H, D), (q, k, dy, gate, beta), nck, G, torch.zeros(B, H, nck * 64, D, dtype=f), \
        torch.ones(64, 64, dtype=torch.bool).tril()


def pass_b_model(q, k, gate, beta, dy, dsT=None, emulate=None, split="b"):
    """(dv (B, T, H, D), dS_0 (B, H, D, D)); emulate None (float64), "rn" or "rz" (float32, the products in split's
    scheme: b bf16 x3, d scaled fp16 x3)."""
    f = torch.float64 if emulate is None else torch.float32
    if emulate is not None and split in common.STEP_GROUP:
        return pass_b_model_steps(q, k, gate, beta, dy, dsT, emulate, split)
    mm = common.model_mm(emulate, split)
    (B, T, H, D), (q, k, dy, gate, beta), nck, G, dv, mask = model_state(q, k, gate, beta, dy, dsT, f)
    for ch in range(nck - 1, -1, -1):
        sl = slice(64 * ch, 64 * ch + 64)
        Q, K, dY, g, bt = q[:, :, sl], k[:, :, sl], dy[:, :, sl], gate[:, :, sl], beta[:, :, sl]
        L, A = common.chunk_tables(g)  # L[t][s] = L[t-1][s] g_t, A[t] = A[t-1] g_t, running products in f
        w = L[..., 63, :]
        bw = bt * w
        QK = mm(Q, K.transpose(-1, -2))
        MP = torch.where(mask, QK * L * bt[..., None, :], torch.zeros((), dtype=f))  # MP[u][s] = L[u][s] beta_s QK
        KG = mm(K, G) * bw[..., :, None]
        dv[:, :, sl] = mm(MP.transpose(-1, -2), dY, acc=KG)
        U = mm((Q * A[..., :, None]).transpose(-1, -2), dY)  # from zero
        a63 = A[..., 63, None, None]
        G = a63 * G + U if emulate is None else (a63.double() * G.double() + U.double()).float()  # one rounding
    return dv[:, :, :T].transpose(1, 2), G


def pass_b_model_steps(q, k, gate, beta, dy, dsT, emulate, split, inplace=True):
    """pass_b_model's float32 emulation in split k or r (bwd_fp32_common.StepScaled: scales along the steps). q, k, dy
    stored once each with an exponent a group of steps; G one a tile (t's). QK, KG: outer factors. dv = KG beta w +
    MP^T dY and U = (diag(A) Q)^T dY sum over the steps: dy is their natural side (ONE pair read by both), MP and qA
    are compensated against dy's exponents (qA, inplace: its pair as stored at the top, at its own exponents, then
    rescaled in place once dy's are known; MP: split once from its fp32 values). Split r as the kernel forms it
    (StepScaledR's clamped exponents; MP^T dY from zero, then added to KG beta w; qA's rescale by contract_r_qa's
    two fp16 multiplies); split k as StepScaled's contract (MP^T dY onto KG beta w at its scale)."""
    emu.RZ = emulate == "rz"
    try:
        ss = StepScaledR() if split == "r" else common.StepScaled(common.STEP_GROUP[split])
        f = torch.float32
        (B, T, H, D), (q, k, dy, gate, beta), nck, G, dv, mask = model_state(q, k, gate, beta, dy, dsT, f)
        for ch in range(nck - 1, -1, -1):
            sl = slice(64 * ch, 64 * ch + 64)
            Q, K, dY, g, bt = q[:, :, sl], k[:, :, sl], dy[:, :, sl], gate[:, :, sl], beta[:, :, sl]
            L, A = common.chunk_tables(g)
            w = L[..., 63, :]
            bw = bt * w
            qp, kp, yp, gp = ss.nat(Q), ss.nat(K), ss.nat(dY), ss.nat(G, tile=True)
            QK = ss.outer(qp, ss.T(kp))
            MP = torch.where(mask, QK * L * bt[..., None, :], torch.zeros((), dtype=f))
            KG = ss.outer(kp, gp) * bw[..., :, None]
            if split == "r":  # the kernel's: MP^T dY from zero, then onto KG beta w by one add; qA's pair rescaled
                dv[:, :, sl] = KG + ss.contract(MP.transpose(-1, -2), yp, comp_is_a=True)
                U = contract_r_qa(ss, Q * A[..., :, None], yp)
            else:
                dv[:, :, sl] = ss.contract(MP.transpose(-1, -2), yp, comp_is_a=True, acc=KG)  # onto KG beta w
                U = ss.contract((Q * A[..., :, None]).transpose(-1, -2), yp, comp_is_a=True, inplace=inplace)
            G = (A[..., 63, None, None].double() * G.double() + U.double()).float()
        return dv[:, :, :T].transpose(1, 2), G
    finally:
        emu.RZ = False


class StepScaledR(common.StepScaled):
    """Split r as the kernel runs it: StepScaled with one exponent a step, each clamped at -126 as the kernel's
    (2^-e a normal float: groups of max |x| <= 2^-111 are split at 2^126)."""

    def __init__(self):
        super().__init__(1)

    @staticmethod
    def exps(m):
        e = common.StepScaled.exps(m)
        return torch.where(torch.isfinite(e), e.clamp(min=-126), e)


def contract_r_qa(ss, qa, yp):
    """U = (diag(A) Q)^T dY in split r as the kernel forms it: qA (float32 q_t A[t], (..., 64, D)) split at its own
    row exponents e_qa at the top; under KG, once dy's row exponents e_y are known, its hi and lo are each taken
    times 2^d, d = e_qa + e_y - E (E the largest, zero rows of either side zeroed), by two fp16 multiplies (HMUL2):
    2^max(d, -24), then 2^max(d - max(d, -24), -24) (fp16's least power of two is 2^-24); U from zero, times 2^E."""
    ec = ss.group_exp(qa)
    P = ec + yp["e"]
    E = P.amax(-2, keepdim=True)
    ok = torch.isfinite(P)
    Ef = torch.where(torch.isfinite(E), E, torch.zeros_like(E))
    hi, lo = ss.halves((qa.double() / ss.scale(ec)).float())
    d = torch.where(ok, P - Ef, torch.zeros_like(P))
    d1 = d.clamp(min=-24)
    f1 = torch.where(ok, torch.exp2(d1), torch.zeros_like(d1))
    f2 = torch.exp2((d - d1).clamp(min=-24))
    hi, lo = (((x.double() * f1).half().double() * f2).half().float() for x in (hi, lo))
    return ss._run(hi.transpose(-1, -2), lo.transpose(-1, -2), yp["hi"], yp["lo"], torch.exp2(Ef), None)


# ---------------------------------------------------------------------------------------------
# --cpu-check, --check and --bench on bwd_fp32_common's cases, loops and report.
# ---------------------------------------------------------------------------------------------
NAMES = ("dv", "ds0")


def reference(q, k, v, gate, beta, dy, dsT):
    """(dv, dS_0) by naive.chunked_backward_naive (float64, chunks of 32: other chunk edges than the kernel's)."""
    out = naive.chunked_backward_naive(q, k, v, gate, beta, dy, d_final_state=dsT)
    return out[2], out[5]


def cpu_row(row):
    return (f"{str(row['shape']) + ' ' + row['gate']:34s} {'yes' if row['dsT'] else 'no':5s} "
            f"{row['model_dv']:9.2e} {row['model_ds0']:9.2e}   {row['emu_rn_dv']:.2e} / {row['emu_rz_dv']:.2e}, "
            f"{row['emu_rn_ds0']:.2e} / {row['emu_rz_ds0']:.2e}")


def emulated_worst(rows, label):
    worst = max(max(r["emu_rn_dv"], r["emu_rn_ds0"], r["emu_rz_dv"], r["emu_rz_ds0"]) for r in rows)
    return worst, f"{label} emulation against naive: worst rel-L2 {worst:.2e} (the device's expected error; bar 1e-5)"


def models(q, k, v, gate, beta, dy, dsT):
    """A case's chunk model as model(emulate, split) (pass B needs no v)."""
    return lambda emulate, split: pass_b_model(q, k, gate, beta, dy, dsT, emulate=emulate, split=split)


def cpu_check(split):
    label = common.SPLITS[split][1]
    header = f"{'case':34s} {'dS_T':5s} {'model dv':>9s} {'model dS0':>9s}   {label} emulated (RN / RZ): dv, dS0"
    common.cpu_check(NAMES, header, reference, models, cpu_row, emulated_worst, split)


def measure(mod, q, k, v, gate, beta, dy, dsT, split="b"):
    """One case of --check: the kernel's row ({dv, ds0, finite}) and a thunk of the RZ emulation's errors."""
    rdv, rds0 = reference(q, k, v, gate, beta, dy, dsT)
    dev = [x.cuda().contiguous() for x in (q, k, gate, beta, dy)]
    dv, ds0 = run_kernel(mod, *dev, dsT.cuda() if dsT is not None else None)
    torch.cuda.synchronize()
    dv, ds0 = dv.cpu(), ds0.cpu()
    row = {"dv": rel(dv, rdv), "ds0": rel(ds0, rds0), "finite": bool(dv.isfinite().all() and ds0.isfinite().all())}
    return row, lambda: [rel(e, r) for e, r in zip(pass_b_model(q, k, gate, beta, dy, dsT, emulate="rz", split=split),
                                                   (rdv, rds0))]


def device_check(mod, split="b"):
    common.device_check(mod, NAMES, ("dv", "dS0"), measure,
                        lambda row: f"dv {row['emu_rz_dv']:.2e}, dS0 {row['emu_rz_ds0']:.2e}", split)


def bench(mod, trials):
    B, T, H = 16, 4096, 32
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, dy = (torch.randn(B, T, H, 128, device="cuda", generator=gen) for _ in range(3))
    gate = 0.98 + 0.02 * torch.rand(B, T, H, device="cuda", generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    dsT = torch.randn(B, H, 128, 128, device="cuda", generator=gen)
    dv = torch.empty_like(q)
    ds0 = torch.empty(B, H, 128, 128, device="cuda")
    st = kernelbench_time(mod.passb, (q, k, dy, gate, beta, dsT, dv, ds0), trials=trials, warmup=3, flush=True)
    common.bench_report(st, (B, T, H), mod.passb_attrs, trials, bool(dv.isfinite().all()))


if __name__ == "__main__":
    common.main(__doc__, "bwd_fp32_passB.json", "device: dv and dS_0 against float64 naive", cpu_check, build_module,
                device_check, bench, before_launch=common.split_registers_guard("passb_attrs", "passb_kernel"),
                splits=("b", "t", "r"))
