"""Pass B of the float32 Hopper backward (docs/training-design.md 8.2 "Two passes", 8.4-8.7): dv and the state
gradient's chain, the dev harness of solution.py's chunk_bwd_sm90_fp32_dv_kernel (BACKWARD_SM90_FP32_SRC, namespace
bwd32::pb, split r), one standalone script run from the repository root: the chunk models and the emulation of every
scheme (CPU), and the production kernel's --check and --bench through a dev build of the unit (dev/bwd_fp32_common.py:
the unit's text read from solution.py, a dev entry and binding; nothing of the kernel's text lives here).

What it computes, for float32 q, k, gate, beta, dy of (B, T, H, 128) / (B, T, H) (v is not needed) and an optional
d_final_state (B, H, 128, 128): dv (B, T, H, 128) float32 and, optionally, dS_0 (B, H, 128, 128), the gradient of the
initial state. No checkpoints. Any T: the last chunk's rows past T are zero, their gates 1, betas 0.

Design (per (b, h) one CTA of 384 threads, chunks of 64 steps backwards, chunk_bwd_sm90's conventions and math; the
kernel's comments in solution.py have the details):
  - tables (WG0, fp32 direct products, never a division: gates may be 0, negative or > 1): L[t][s] =
    prod_{r=s+1..t} g_r (packed lower triangle, chunk_bwd_sm90's lp), A[t] = prod_{r<=t} g_r, w_s = L[63][s], beta,
    beta w; built for chunk ch - 1 during chunk ch (two buffers), with an L2 prefetch of chunk ch - 1's rows;
  - the consumers (two warpgroups, setmaxnreg 232; WG0 40): q, k, dy fp32 rows land by cp.async in their own pair's
    space during the chunk before, as soon as it has read that pair (q after QK, k after KG, dy after U), and are
    split in place at the top into fp16 pairs (q also as q A[t]);
  - every product three f16 wgmma terms a k-step (hh + hl + lh): QK (consumer c its columns s = 32 c ..), MP[u][s]
    = L[u][s] beta_s QK[u][s] for s <= u (split, shared memory); KG = K G (B = G's pair, columns j = 64 c ..),
    dv = diag(beta w) KG + MP^T dY; U = (diag(A) Q)^T dY from zero (rows i = 64 c ..) and G = fmaf(A_63, G, U):
    wgmma's in-place accumulation truncates (perf-notes, thirtieth session), so G's chain never accumulates in
    place; G's pair rewritten for the next chunk's KG. G starts as d_final_state or zero.
  - split r (training-design 8.7; one exponent a step, the model's StepScaled option r): q, k, dy and q A[t] take an
    exponent a row (step) from the row's max |x| at its in-place split; QK's accumulator takes q's row factor and k's
    column factor, KG k's row factor and G's tile factor (G one exponent a tile); the two products over the steps read
    dy's pair as stored and compensate their other operand against it: MP split after (2a) with rows u times
    2^(e_y[u] - E), and qA's pair rescaled in place while KG runs, rows times 2^(e_qa + e_y - E) by two fp16
    multiplies; E (each product's largest e_comp + e_y) from 8 warp slots; zero rows of dy, MP or qA zeroed. MP^T dY
    is formed from zero at 2^E, then added to KG beta w by one add; U from zero as before. Exponents clamped at -126.
  - The schemes b (bf16 x3: the thirty-first session's kernel), d, t and k stay here as models (--cpu-check) only.
  Shared memory 232,448 B (the opt-in maximum): pairs q, qA, k, dy (32 KB each), G (64 KB), MP (16 KB), two table
  buffers, the gates, 512 B of exponents.

    python3 dev/bwd_fp32_passB.py --cpu-check [--split b|d|t|k|r] (no GPU, no build: the float64 chunk model against
                                  naive.chunked_backward_naive, and the emulation's error in a scheme: r, the kernel's
                                  (default); b, bf16 x3; d, 8.4's fp16 x3 with power-of-two scales, every product;
                                  t, d with one scale a tile; k, scales along 16-step k-steps)
    python3 dev/bwd_fp32_passB.py --build-only   (no GPU; CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a)
    python3 dev/bwd_fp32_passB.py --check        (device: dv and dS_0 of the unit's entry (both kernels) against
                                  float64, the 1e-5 bar, and its non-finite flag: 0 on every finite case, 1 with an
                                  inf in k or a NaN in dy; contiguous and strided layouts)
    python3 dev/bwd_fp32_passB.py --bench [--trials N]   (device: the dv kernel alone at (16, 4096, 32, 128), us a
                                  chunk and SM)
  Results go to $OUT/bwd_fp32_passB.json.

History: the thirty-first session's b kernel ran --check equal to its bf16 x3 emulation (perf-notes); split r was
written and emulated bit for bit (dev/bwd_fp32_passB_r_emu.py: its own arithmetic against pass_b_model(split="r") on
every case, both roundings), then measured on an H200 in the thirty-third session (docs/fp32-passes-s33.txt: --check
worst 1.63e-6, 9.13 us a chunk, 168 registers, no spill) and moved into solution.py the same session (its SASS
unchanged by the move but for the strided addressing and the non-finite flag; not yet run there). --cpu-check
--split r: worst rel-L2 1.83e-6 (dv), 1.25e-6 (dS_0).
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

# ---------------------------------------------------------------------------------------------
# The chunk model: the kernel's tables and chunk formulas, plainly; float64, or float32 with the products as the
# schemes' wgmma sequences (bwd_fp32_common's model_mm, StepScaled).
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


def measure(mod, cpu, dev, split="r", flag_only=False):
    """One case of --check: the unit's entry (both kernels, as the host launches them) on the case's device tensors;
    the row ({dv, ds0, finite, flag}) and a thunk of the RZ emulation's errors (flag_only: the flag alone)."""
    out = common.run_unit(mod, 0, *dev)
    torch.cuda.synchronize()
    if flag_only:
        return out[-1]
    q, k, v, gate, beta, dy, dsT = cpu
    rdv, rds0 = reference(*cpu)
    dv, ds0 = out[2].cpu(), out[5].cpu()
    row = {"dv": rel(dv, rdv), "ds0": rel(ds0, rds0), "finite": bool(dv.isfinite().all() and ds0.isfinite().all()),
           "flag": out[-1]}
    return row, lambda: [rel(e, r) for e, r in zip(pass_b_model(q, k, gate, beta, dy, dsT, emulate="rz", split=split),
                                                   (rdv, rds0))]


def device_check(mod, split="r"):
    common.device_check(mod, NAMES, ("dv", "dS0"), measure,
                        lambda row: f"dv {row['emu_rz_dv']:.2e}, dS0 {row['emu_rz_ds0']:.2e}", split)


def bench(mod, trials):
    """The dv kernel alone (which 2) at S4."""
    B, T, H = 16, 4096, 32
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, dy = (torch.randn(B, T, H, 128, device="cuda", generator=gen) for _ in range(4))
    gate = 0.98 + 0.02 * torch.rand(B, T, H, device="cuda", generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    dsT = torch.randn(B, H, 128, 128, device="cuda", generator=gen)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    dgate, dbeta = torch.empty_like(gate), torch.empty_like(gate)
    ds0 = torch.empty(B, H, 128, 128, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = (2, q, k, v, dy, gate, beta, q.new_empty(0), dsT, dq, dk, dv, dgate, dbeta, ds0, flag)
    st = kernelbench_time(mod.bwd32, args, trials=trials, warmup=3, flush=True)
    finite = bool(dv.isfinite().all() and ds0.isfinite().all())
    common.bench_report(st, (B, T, H), lambda: mod.bwd32_attrs(2), trials, finite)
    common.RESULT["bench"].update(finite=finite, flag=int(flag.item()))
    print(f"bench: the non-finite flag {int(flag.item())} (0 expected)", flush=True)


if __name__ == "__main__":
    common.main(__doc__, "bwd_fp32_passB.json", "device: dv and dS_0 against float64 naive, and the non-finite flag",
                cpu_check, device_check, bench, split="r")
