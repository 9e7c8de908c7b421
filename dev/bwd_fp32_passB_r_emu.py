"""CPU emulation of pass B's own split-r arithmetic (solution.py's chunk_bwd_sm90_fp32_dv_kernel's consumer), compared
bit for bit with pass_b_model(split="r") on every --check case, rounding to nearest and truncating. It follows the
kernel's operations, not the model's: exponents from a maximum's float bits (row_exp, clamped at -126; q's and k's
zero rows 0, dy's / MP's / qA's kNone), E from the int slots (kLow where no step has both sides), each power of two as
the kernel's float32 multiplies in the kernel's order (exp2_pair: two factors), the fp16 splits (psplit: hi = RN(x),
lo = RN(x - hi)), qA's in-place rescale as two HMUL2s with fp16 factors (h2pow), every wgmma k-step's three terms
(hh + hl + lh) each added to a float32 accumulator (fp32_split_emulation.add_round: RN, or truncating), and G's join
as an exactly emulated fmaf (the model forms it in float64, then float32: counted where those differ). Run from the
repository root:
    python3 dev/bwd_fp32_passB_r_emu.py
"""
import sys
sys.path.insert(0, "dev")
sys.path.insert(0, ".")
import torch
import bwd_fp32_common as common
import bwd_fp32_passB as passb
import fp32_split_emulation as emu

torch.set_grad_enabled(False)
KNONE, KLOW = -128, -1024
STATS = {}


def count(name, n):
    STATS[name] = STATS.get(name, 0) + int(n)


def exp2i(e):
    """float32 2^e of an integer tensor e in [-126, 127] (the kernel's exp2i: a normal float)."""
    assert int(e.min()) >= -126 and int(e.max()) <= 127, (int(e.min()), int(e.max()))
    return torch.exp2(e.double()).float()


def row_exp(m, none):
    """the kernel's row_exp: ceil(log2 m) - 15 from m's float bits, clamped at -126; `none` where m == 0."""
    bits = m.float().contiguous().view(torch.int32).long()
    e = ((bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).long() - 15).clamp(min=-126)
    count("exp_clamped", ((e == -126) & (m > 0)).sum())
    return torch.where(m > 0, e, torch.full_like(e, none))


def exp2_pair(d):
    d = d.clamp(-252, 252)
    h = torch.div(d, 2, rounding_mode="floor")
    return exp2i(h), exp2i(d - h)


def split16(x):
    hi = x.half().float()
    return hi, (x - hi).half().float()


def wg(a, b):
    """a b from zero over k-steps of 16, terms hh, hl, lh (each partial exact, added as add_round)."""
    ah, al = a
    bh, bl = b
    out = torch.zeros(*ah.shape[:-1], bh.shape[-1])
    for k0 in range(0, ah.shape[-1], 16):
        for x, y in ((ah, bh), (ah, bl), (al, bh)):
            out = emu.add_round(out, x[..., k0:k0 + 16].double() @ y[..., k0:k0 + 16, :].double())
    return out


def fmaf(a, b, c):
    """float32 fma(a, b, c) rounded once (to nearest): a b exact in float64, TwoSum, then the float rounding of the
    exact sum (it differs from RN(s) only where s is a midpoint of two floats and the error is nonzero)."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)
    f = s.float()
    up, dn = torch.nextafter(f, torch.full_like(f, float("inf"))), torch.nextafter(f, torch.full_like(f, -float("inf")))
    mid_up = s == (f.double() + up.double()) / 2  # s halfway between f and the float above it
    mid_dn = s == (f.double() + dn.double()) / 2
    f = torch.where(mid_up & (err > 0), up, torch.where(mid_dn & (err < 0), dn, f))
    model = (p + cd).float()
    count("fma_vs_float64_join", (f != model).sum())
    return f


def kernel_r(q, k, gate, beta, dy, dsT, rz):
    emu.RZ = rz
    f = torch.float32
    (B, T, H, D), (q, k, dy, gate, beta), nck, G, dv, mask = passb.model_state(q, k, gate, beta, dy, dsT, f)
    eg = row_exp(G.abs().amax((-1, -2), keepdim=True), 0)  # tile_exp (the same formula and clamp)
    Gp = split16(G * exp2i(-eg))
    for ch in range(nck - 1, -1, -1):
        sl = slice(64 * ch, 64 * ch + 64)
        Q, K, dY, g, bt = q[:, :, sl], k[:, :, sl], dy[:, :, sl], gate[:, :, sl], beta[:, :, sl]
        L, A = common.chunk_tables(g)
        bw = bt * L[..., 63, :]  # WG0: L[kBW + s] = L[kBeta + s] * w_s
        # the top: row exponents, the pairs (q, qA at its own exponents, k)
        a = A[..., :, None]
        eq = row_exp(Q.abs().amax(-1, keepdim=True), 0)
        eqa = row_exp((Q * a).abs().amax(-1, keepdim=True), KNONE)
        ek = row_exp(K.abs().amax(-1, keepdim=True), 0)
        Qp = split16(Q * exp2i(-eq))
        QAp = split16(Q * (a * exp2i(torch.where(eqa == KNONE, 0, -eqa))))
        Kp = split16(K * exp2i(-ek))
        # QK -> MP values (mp_values_r: x fu fk L beta), MP's row exponents over each consumer's 32 columns
        X = wg(Qp, tuple(x.transpose(-1, -2) for x in Kp))
        fu, fk = exp2i(eq), exp2i(ek).transpose(-1, -2)
        X = torch.where(mask, X * fu * fk * L * bt[..., None, :], torch.zeros((), dtype=f))
        em = torch.maximum(row_exp(X[..., :32].abs().amax(-1, keepdim=True), KNONE),
                           row_exp(X[..., 32:].abs().amax(-1, keepdim=True), KNONE))
        # dy's row exponents; E of dv and of U (the warps' slots: the max over the rows)
        ey = row_exp(dY.abs().amax(-1, keepdim=True), KNONE)
        pv = torch.where((ey == KNONE) | (em == KNONE), KLOW, ey + em)
        pu = torch.where((ey == KNONE) | (eqa == KNONE), KLOW, ey + eqa)
        ev, eu = pv.amax(-2, keepdim=True), pu.amax(-2, keepdim=True)
        # qA rescaled in place (before eu's kLow fix, as the kernel)
        d = eqa + ey - eu
        none = (eqa == KNONE) | (ey == KNONE)
        d1 = d.clamp(min=-24)
        f1 = torch.where(none, 0.0, torch.exp2(d1.double()))
        f2 = torch.exp2((d - d1).clamp(min=-24).double())
        count("qa_two_step_rows", ((d < -24) & ~none).sum())
        QAp = tuple(((x.double() * f1).half().double() * f2).half().float() for x in QAp)
        ev = torch.where(ev == KLOW, 0, ev)
        eu = torch.where(eu == KLOW, 0, eu)
        # MP taken to dv's scale a row (mp_scale_r), split
        m1, m2 = exp2_pair(ey - ev)
        m1 = torch.where(ey == KNONE, torch.zeros((), dtype=f), m1)
        MPp = split16(X * m1 * m2)
        Yp = split16(dY * exp2i(torch.where(ey == KNONE, 0, -ey)))
        # KG, then dv = KG 2^e_k 2^e_G beta w + (D v1) v2
        R = wg(Kp, Gp)
        R = R * exp2i(ek) * exp2i(eg) * bw[..., :, None]
        Dm = wg(tuple(x.transpose(-1, -2) for x in MPp), Yp)
        v1, v2 = exp2_pair(ev)
        dv[:, :, sl] = R + (Dm * v1) * v2
        # U and G's join
        U = wg(tuple(x.transpose(-1, -2) for x in QAp), Yp)
        u1, u2 = exp2_pair(eu)
        G = fmaf(A[..., 63, None, None].expand_as(G), G, (U * u1) * u2)
        eg = row_exp(G.abs().amax((-1, -2), keepdim=True), 0)
        Gp = split16(G * exp2i(-eg))
    emu.RZ = False
    return dv[:, :, :T].transpose(1, 2), G


def main():
    worst = 0
    for n, (shape, gname, with_dsT) in enumerate(common.cases()):
        q, k, v, gate, beta, dy, dsT = common.make_case(shape, gname, with_dsT, seed=100 + n)
        line = []
        for mode in ("rn", "rz"):
            a = kernel_r(q, k, gate, beta, dy, dsT, mode == "rz")
            b = passb.pass_b_model(q, k, gate, beta, dy, dsT, emulate=mode, split="r")
            same = [bool(torch.equal(x, y)) for x, y in zip(a, b)]
            diff = [(x.double() - y.double()).abs().max().item() for x, y in zip(a, b)]
            line.append(f"{mode}: dv {'equal' if same[0] else diff[0]}, dS0 {'equal' if same[1] else diff[1]}")
            worst = max(worst, *[0 if s else 1 for s in same])
        print(f"{str(shape) + ' ' + gname:34s} " + "; ".join(line), flush=True)
    print("counts over both modes:", STATS)
    print("ALL BIT-EQUAL" if worst == 0 else "DIFFERENCES")


if __name__ == "__main__":
    main()
