"""Pass A of the float32 Hopper backward (docs/training-design.md 8.2 "Two passes", 8.4-8.7): dq, dk, dgate, dbeta,
the dev harness of solution.py's chunk_bwd_sm90_fp32_kernel (BACKWARD_SM90_FP32_SRC, namespace bwd32::pa, split t),
one standalone script run from the repository root: the chunk models and the emulation of every scheme (CPU), and
the production kernel's --check and --bench through a dev build of the unit (dev/bwd_fp32_common.py: the unit's text
read from solution.py, a dev entry and binding, the checkpoint rows; nothing of the kernel's text lives here).

What it computes, for float32 q, k, v, dy (B, T, H, 128), gate, beta (B, T, H), the forward's checkpoints ((B H,
ceil(T / 64), 128 x 128 + 8) float32 rows: S at each 64-step chunk start [dk][dv], then the forward's 8 consumer
warps' max |S|, warp w over the dv columns 16 w .. 16 w + 15; common.ckpt_rows makes them from the float64
recurrence) and an optional d_final_state (B, H, 128, 128): dq, dk (B, T, H, 128) and dgate, dbeta (B, T, H),
float32. Any T: the last chunk's rows past T are zero, their gates 1, betas 0. Non-finite inputs are flagged, not
handled (solution.py's non-finite rule: the host recomputes with chunk_bwd).

Design (per (b, h) one CTA of 384 threads, chunks of 64 steps backwards, chunk_bwd_sm90's math; the kernel's comments
in solution.py have the details):
  - WG0 (setmaxnreg 56): the tables (L packed, A, w, beta) and Lx's pair a chunk ahead, the checkpoint's exponent
    from its 8 maxima, the L2 prefetch of the next chunk's rows and checkpoint, dgate and dbeta a chunk behind from
    the consumers' double-buffered row-dot partials (chunk_bwd_sm90's dgate_dbeta: fixed-order sums, deterministic);
  - two consumer warpgroups (224 registers), consumer c holding G's rows i = 64 c .. (the state gradient after the
    chunk) in registers: k, v and dy's fp32 rows land by cp.async in their own pair's space during the chunk
    before, as soon as it has read that pair (v after Rk^T, k after dbeta's row dots, dy once dy A[t] is made), and
    the top splits them in place into fp16 pairs while q's rows load from global memory (q's pair is read until G's
    update); every product three f16 wgmma terms a k-step (hh + hl + lh): Dd and QK's columns s = 32 c .. -> MQ,
    MD (split, shared) and E; M_c = E[:, s half] Lx[:, s half]^T (dgate's C^3 term split over the contraction: WG0
    adds the two halves' column sums); R^T = S dY^T (S's fp32 rows from the checkpoint, split a k-step at a time;
    c0 = sum S o G from the same values), f's part, dq^T = R^T diag(A) + K^T MQ^T; Rk^T = G V^T (G split a k-step
    at a time), e's part, dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part, dk = beta dkt; G's update in two N = 64
    halves, each from zero, U = Q^T diag(A) dY (A = q's pair MN-major; B = dy A[t] as a pair in MQ / MD's space,
    from dy's pair times A[t], split), joined by G = fmaf(A_63, G, U) (wgmma's in-place accumulation truncates:
    perf-notes, thirtieth session). The row dots read the pairs' hi + lo times their tile's 2^e.
  - split t (training-design 8.6): every operand matrix of the chunk model's products split times one power of two
    2^-e that brings its max |x| near 2^15, and each product's accumulator times 2^e_A and 2^e_B (one multiply
    each: their product may leave the float range); where a product accumulates onto a result (dq^T onto
    R^T diag(A), dkt^T onto Rk^T diag(w)) the result is taken to the product's scale first and back after. The
    tiles: q, k, v, dy (each warp's maximum at the top's in-place split, through 8 slots across a barrier it
    already has); MQ and MD (both consumers' halves) and E (consumer c's 64 x 32) across one more barrier; Lx per
    column half (WG0's); S from the forward's 8 maxima (WG0's, a chunk ahead); G (across barrier (4)); dy A[t]
    (across (4b)). c0 sums the unscaled S o G.
  - The schemes b (bf16 x3: the thirty-first session's kernel), d, k and r stay here as models (--cpu-check) only.
  Shared memory 217,152 B: pairs q, k, v, dy (32 KB each), MQ, MD (16 KB each), Lx (16 KB), two table buffers, the
  gates, two partial buffers, 512 B of tile scales' slots and the checkpoint exponents.

    python3 dev/bwd_fp32_passA.py --cpu-check [--split b|d|t|k|r] (no GPU, no build: the float64 chunk model against
                                  naive.chunked_backward_naive, and the emulation's error in a scheme: t, the kernel's
                                  (default); b, bf16 x3; d, 8.4's fp16 x3 with power-of-two scales, every product and
                                  the row dots' pairs; k, r, scales along the steps)
    python3 dev/bwd_fp32_passA.py --build-only   (no GPU; CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a)
    python3 dev/bwd_fp32_passA.py --check        (device: dq, dk, dgate, dbeta of the unit's entry (both kernels)
                                  against float64, the 1e-5 bar, and its non-finite flag: 0 on every finite case, 1
                                  with an inf in k or a NaN in dy; contiguous and strided layouts)
    python3 dev/bwd_fp32_passA.py --bench [--trials N]   (device: the dq kernel alone at (16, 4096, 32, 128), us a
                                  chunk and SM)
  Results go to $OUT/bwd_fp32_passA.json where OUT is set.

History: --cpu-check: the float64 model (the kernel's tables and chunk formulas, the checkpoints from the float64
forward loop) against naive.chunked_backward_naive at every case of --check, worst rel-L2 1.9e-14; bf16 x3 (b) at
4-9e-6 for T >= 63 but dgate at (1, 63, 2) above1 (1.2-1.4e-5) and T = 1 (up to 6.0e-5: single dots); split t 2.2e-6
worst. A CPU emulation of the kernel's own t arithmetic (thirty-first session: its exponents from the tiles' maxima,
its order of multiplies, fp16 splits, three terms a k-step into float32 accumulators) equals pass_a_model(split="t")
bit for bit on every --check case, both roundings; tiles of max |x| <= 2^-111 differ from the model (the exponent's
clamp at -126: E, of the fourth order in the inputs, gets there when q, k, v and dy are all below about 1e-9). On the
device: the b kernel (thirty-first session) as its emulation; t in the thirty-third session (docs/fp32-passes-s33.txt:
--check worst 2.03e-6, 33.36 us a chunk, 168 registers, 20 B spilled), then moved into solution.py the same session
(its arithmetic's SASS as before; the checkpoint exponent from the 8 maxima instead of the harness's, strided rows,
the non-finite flag; 16 B spilled; not yet run there).
"""
import math
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
# schemes' wgmma sequences (fp32_split_emulation's mm, each k-step and term's exact partial added
# to an fp32 accumulator, rounded to nearest or, rz, truncated) and the row dots on the tiles' hi + lo, as the
# kernel's (bwd_fp32_common's model_mm and model_pair).
# ---------------------------------------------------------------------------------------------
STATE = ("B", "T", "H", "D", "nck", "G", "dq", "dk", "dgate", "dbeta", "low", "strict", "zero")


def model_state(q, k, v, gate, beta, dy, ckpt, dsT, f):
    """What both chunk models start from: the padded inputs (B, H, 64 nck, D) in dtype f, the checkpoints, G (from
    dS_T or zero), the zeroed results, the masks (s <= t, s < t) and zero."""
    B, T, H, D = q.shape
    (q, k, v, dy), gate, beta, nck = common.model_inputs((q, k, v, dy), gate, beta, f)
    st = dict(B=B, T=T, H=H, D=D, nck=nck, q=q, k=k, v=v, dy=dy, gate=gate, beta=beta, ckpt=ckpt.to(f))
    st["G"] = torch.zeros(B, H, D, D, dtype=f) if dsT is None else dsT.to(f).clone()
    st["dq"], st["dk"] = torch.zeros(B, H, nck * 64, D, dtype=f), torch.zeros(B, H, nck * 64, D, dtype=f)
    st["dgate"], st["dbeta"] = torch.zeros(B, H, nck * 64, dtype=f), torch.zeros(B, H, nck * 64, dtype=f)
    st["low"], st["strict"] = torch.ones(64, 64, dtype=torch.bool).tril(), torch.ones(64, 64, dtype=torch.bool).tril(-1)
    st["zero"] = torch.zeros((), dtype=f)
    return st


def chunk_inputs(st, ch):
    """Chunk ch's slice, rows, checkpoint and tables by running products (WG0's, chunk_bwd_sm90's): L[t][s] =
    L[t-1][s] g_t, A[t] = A[t-1] g_t, Ah = A[t - 1], w = L[63], Lx[t][s] = L[t-1][s] for s < t."""
    sl = slice(64 * ch, 64 * ch + 64)
    Q, K, V, dY = (st[n][:, :, sl] for n in ("q", "k", "v", "dy"))
    g, bt = st["gate"][:, :, sl], st["beta"][:, :, sl]
    L, A = common.chunk_tables(g)
    Ah = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1)
    Lx = torch.zeros_like(L)
    Lx[..., 1:, :] = L[..., :-1, :]
    Lx = torch.where(st["strict"], Lx, st["zero"])
    return sl, Q, K, V, dY, g, bt, st["ckpt"][:, :, ch], L, A, Ah, L[..., 63, :], Lx


def pass_a_model(q, k, v, gate, beta, dy, ckpt, dsT=None, emulate=None, split="b"):
    """(dq, dk (B, T, H, D), dgate, dbeta (B, T, H)) from the checkpoints ckpt (B, H, nck, D, D); emulate None
    (float64), "rn" or "rz" (float32, the products and pairs in split's scheme: b bf16 x3, d scaled fp16 x3)."""
    f = torch.float64 if emulate is None else torch.float32
    if emulate is not None and split in common.STEP_GROUP:
        return pass_a_model_steps(q, k, v, gate, beta, dy, ckpt, dsT, emulate, split)
    mm = common.model_mm(emulate, split)
    pair = common.model_pair(emulate, split)  # a tile as the row dots read it
    st = model_state(q, k, v, gate, beta, dy, ckpt, dsT, f)
    B, T, H, D, nck, G, dq, dk, dgate, dbeta, low, strict, zero = (st[n] for n in STATE)
    for ch in range(nck - 1, -1, -1):
        sl, Q, K, V, dY, g, bt, S, L, A, Ah, w, Lx = chunk_inputs(st, ch)
        Dd = mm(dY, V.transpose(-1, -2))  # consumer c: columns s = 32 c ..
        QK = mm(Q, K.transpose(-1, -2))
        MQ = torch.where(low, Dd * L * bt[..., None, :], zero)  # MQ[t][s] = L[t][s] beta_s Dd[t][s]
        MD = torch.where(low, Dd * L, zero)  # MD[u][s] = L[u][s] Dd[u][s]
        E = torch.where(strict, bt[..., None, :] * QK * Dd, zero)
        Rt = mm(S, dY.transpose(-1, -2))  # R^T[i][t] = sum_j S[i][j] dY[t][j]
        c0 = (S * G).sum((-1, -2))
        f_ = (pair(Q) * Rt.transpose(-1, -2)).sum(-1)
        dqt = mm(K.transpose(-1, -2), MQ.transpose(-1, -2), acc=Rt * A[..., None, :])  # R^T diag(A) + K^T MQ^T
        dq[:, :, sl] = dqt.transpose(-1, -2)
        Rkt = mm(G, V.transpose(-1, -2))  # Rk^T[i][s] = sum_j G[i][j] V[s][j]
        e = (pair(K) * Rkt.transpose(-1, -2)).sum(-1)
        dkt = mm(Q.transpose(-1, -2), MD, acc=Rkt * w[..., None, :])  # Rk^T diag(w) + Q^T MD
        dk[:, :, sl] = (bt[..., None, :] * dkt).transpose(-1, -2)
        dbeta[:, :, sl] = (pair(K) * dkt.transpose(-1, -2)).sum(-1)
        # dgate's term (d): M = E Lx^T, each consumer the columns s = 32 c .. of the contraction (a partial M whose
        # column sums WG0 adds)
        td = sum((L * mm(E[..., 32 * c:32 * c + 32], Lx[..., 32 * c:32 * c + 32].transpose(-1, -2))).sum(-2)
                 for c in (0, 1))
        dgate[:, :, sl] = (td + w * (Ah * c0[..., None] + (Lx @ (bt * e)[..., None])[..., 0])
                           + Ah * (L.transpose(-1, -2) @ f_[..., None])[..., 0])
        U = mm(Q.transpose(-1, -2), pair(dY) * A[..., :, None])  # from zero (B: dy's pair times A[t]), one FMA
        a63 = A[..., 63, None, None]
        G = a63 * G + U if emulate is None else (a63.double() * G.double() + U.double()).float()
    return (dq[:, :, :T].transpose(1, 2), dk[:, :, :T].transpose(1, 2), dgate[:, :, :T].transpose(1, 2),
            dbeta[:, :, :T].transpose(1, 2))


def pass_a_model_steps(q, k, v, gate, beta, dy, ckpt, dsT, emulate, split):
    """pass_a_model's float32 emulation in split k or r (bwd_fp32_common.StepScaled: scales along the steps). q, k, v,
    dy stored once each with an exponent a group of steps; S (the checkpoint) and G one a tile (t's). Products that do
    not sum over the steps (Dd, QK, R^T, Rk^T) take their operands' exponents as outer factors; those that do (dq^T =
    K^T MQ^T, dk^T = Q^T MD, M_c = E_c Lx_c^T, U = Q^T diag(A) dY) read the shared tile (k, q, q) or the table (Lx,
    its columns' exponents: WG0's) as their natural side, the product's own operand (MQ's columns, MD's rows, E_c's
    columns, dy A[t]'s rows) compensated. The row dots read q and k at their rows' exponents."""
    emu.RZ = emulate == "rz"
    try:
        ss = common.StepScaled(common.STEP_GROUP[split])
        f = torch.float32
        st = model_state(q, k, v, gate, beta, dy, ckpt, dsT, f)
        B, T, H, D, nck, G, dq, dk, dgate, dbeta, low, strict, zero = (st[n] for n in STATE)
        for ch in range(nck - 1, -1, -1):
            sl, Q, K, V, dY, g, bt, S, L, A, Ah, w, Lx = chunk_inputs(st, ch)
            qp, kp, vp, yp = ss.nat(Q), ss.nat(K), ss.nat(V), ss.nat(dY)
            sp, gp = ss.nat(S, tile=True), ss.nat(G, tile=True)
            Dd = ss.outer(yp, ss.T(vp))
            QK = ss.outer(qp, ss.T(kp))
            MQ = torch.where(low, Dd * L * bt[..., None, :], zero)
            MD = torch.where(low, Dd * L, zero)
            E = torch.where(strict, bt[..., None, :] * QK * Dd, zero)
            Rt = ss.outer(sp, ss.T(yp))
            c0 = (S * G).sum((-1, -2))
            f_ = (ss.value(qp) * Rt.transpose(-1, -2)).sum(-1)
            # dq^T = R^T diag(A) + K^T MQ^T: A = k (natural, rows s), B = MQ^T compensated along s (MQ's columns)
            dqt = ss.contract(MQ.transpose(-1, -2), ss.T(kp), comp_is_a=False, acc=Rt * A[..., None, :])
            dq[:, :, sl] = dqt.transpose(-1, -2)
            Rkt = ss.outer(gp, ss.T(vp))
            kv = ss.value(kp)
            e = (kv * Rkt.transpose(-1, -2)).sum(-1)
            # dk^T = Rk^T diag(w) + Q^T MD: A = q (natural, rows u), B = MD compensated along u (its rows)
            dkt = ss.contract(MD, ss.T(qp), comp_is_a=False, acc=Rkt * w[..., None, :])
            dk[:, :, sl] = (bt[..., None, :] * dkt).transpose(-1, -2)
            dbeta[:, :, sl] = (kv * dkt.transpose(-1, -2)).sum(-1)
            # M_c = E_c Lx_c^T over consumer c's columns s: Lx natural (WG0's pair, its columns' exponents), E_c
            # compensated (registers)
            td = 0
            for c in (0, 1):
                lxp = ss.nat(Lx[..., 32 * c:32 * c + 32].transpose(-1, -2).contiguous())  # rows s
                Mc = ss.contract(E[..., 32 * c:32 * c + 32], lxp, comp_is_a=True)
                td = td + (L * Mc).sum(-2)
            dgate[:, :, sl] = (td + w * (Ah * c0[..., None] + (Lx @ (bt * e)[..., None])[..., 0])
                               + Ah * (L.transpose(-1, -2) @ f_[..., None])[..., 0])
            # U = Q^T diag(A) dY: A = q (natural, rows t), B = dy A[t] from dy's pair, compensated along t
            U = ss.contract(ss.value(yp) * A[..., :, None], ss.T(qp), comp_is_a=False)
            G = (A[..., 63, None, None].double() * G.double() + U.double()).float()
        return (dq[:, :, :T].transpose(1, 2), dk[:, :, :T].transpose(1, 2), dgate[:, :, :T].transpose(1, 2),
                dbeta[:, :, :T].transpose(1, 2))
    finally:
        emu.RZ = False


NAMES = ("dq", "dk", "dgate", "dbeta")


def reference(q, k, v, gate, beta, dy, dsT):
    """(dq, dk, dgate, dbeta) by naive.chunked_backward_naive (float64, chunks of 32: other edges than the kernel's)."""
    out = naive.chunked_backward_naive(q, k, v, gate, beta, dy, d_final_state=dsT)
    return out[0], out[1], out[3], out[4]


def cpu_row(row):
    return (f"{str(row['shape']) + ' ' + row['gate']:34s} {'yes' if row['dsT'] else 'no':4s} "
            + " ".join(f"{row[f'model_{x}']:.1e}" for x in NAMES) + "    "
            + " ".join(f"{row[f'emu_rn_{x}']:.1e}" for x in NAMES) + " | "
            + " ".join(f"{row[f'emu_rz_{x}']:.1e}" for x in NAMES))


def emulated_worst(rows, label):
    worst = {x: max(max(r[f"emu_rn_{x}"], r[f"emu_rz_{x}"]) for r in rows) for x in NAMES}
    return worst, (f"{label} emulation against naive, worst rel-L2 per gradient (the device's expected error; bar "
                   "1e-5): " + ", ".join(f"{x} {worst[x]:.2e}" for x in NAMES))


def models(q, k, v, gate, beta, dy, dsT):
    """A case's chunk model as model(emulate, split), from the float64 checkpoints (float64) or those rounded once to
    float32 (emulated: the device's checkpoints)."""
    ck = common.checkpoints(k, v, gate, beta)
    ck32 = ck.float()
    return lambda emulate, split: pass_a_model(q, k, v, gate, beta, dy, ck if emulate is None else ck32, dsT,
                                               emulate=emulate, split=split)


def cpu_check(split):
    label = common.SPLITS[split][1]
    header = f"{'case':34s} {'dS_T':4s} model dq / dk / dgate / dbeta          {label} emulated, RN | RZ (worst of 4)"
    common.cpu_check(NAMES, header, reference, models, cpu_row, emulated_worst, split)


def measure(mod, cpu, dev, split="t", flag_only=False):
    """One case of --check: the unit's entry (both kernels, as the host launches them) on the case's device tensors
    and its checkpoint rows (float64 recurrence on the GPU, rounded once); the row ({finite, flag, dq, dk, dgate,
    dbeta}) and a thunk of the RZ emulation's errors (flag_only: the flag alone)."""
    ck = common.checkpoints(*dev[1:5])  # (k, v, gate, beta)
    out = common.run_unit(mod, 0, *dev, ckpt=common.ckpt_rows(ck))
    torch.cuda.synchronize()
    if flag_only:
        return out[-1]
    q, k, v, gate, beta, dy, dsT = cpu
    ref = reference(*cpu)
    got = [out[i].cpu() for i in (0, 1, 3, 4)]
    row = {"finite": all(bool(x.isfinite().all()) for x in got), "flag": out[-1]}
    row.update({x: rel(o, r) for x, o, r in zip(NAMES, got, ref)})

    def emulated():  # (the same checkpoints, rounded once on the host)
        em = pass_a_model(q, k, v, gate, beta, dy, ck.cpu().float(), dsT, emulate="rz", split=split)
        return [rel(m, r) for m, r in zip(em, ref)]
    return row, emulated


def device_check(mod, split="t"):
    common.device_check(mod, NAMES, NAMES, measure, lambda row: " ".join(f"{row[f'emu_rz_{x}']:.1e}" for x in NAMES),
                        split)


def bench(mod, trials):
    """The dq kernel alone (which 1) at S4, on random checkpoint rows (any finite states, their slots made from
    them)."""
    B, T, H = 16, 4096, 32
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, dy = (torch.randn(B, T, H, 128, device="cuda", generator=gen) for _ in range(4))
    gate = 0.98 + 0.02 * torch.rand(B, T, H, device="cuda", generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    nck = math.ceil(T / 64)
    ckpt = common.ckpt_rows(torch.randn(B, H, nck, 128, 128, device="cuda", generator=gen))
    dsT = torch.randn(B, H, 128, 128, device="cuda", generator=gen)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    dgate, dbeta = torch.empty_like(gate), torch.empty_like(gate)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = (1, q, k, v, dy, gate, beta, ckpt, dsT, dq, dk, dv, dgate, dbeta, q.new_empty(0), flag)
    st = kernelbench_time(mod.bwd32, args, trials=trials, warmup=3, flush=True)
    finite = all(bool(x.isfinite().all()) for x in (dq, dk, dgate, dbeta))
    common.bench_report(st, (B, T, H), lambda: mod.bwd32_attrs(1), trials, finite)
    common.RESULT["bench"].update(finite=finite, flag=int(flag.item()))
    print(f"bench: the non-finite flag {int(flag.item())} (0 expected)", flush=True)


if __name__ == "__main__":
    common.main(__doc__, "bwd_fp32_passA.json", "device: dq, dk, dgate, dbeta against float64 naive, and the "
                "non-finite flag", cpu_check, device_check, bench, split="t")
