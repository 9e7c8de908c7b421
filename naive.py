"""Naive float64 references for the fast paths, in torch (tests and design; never on a hot path).

recurrent_naive: the spec's loop, with an optional initial state and the final state.
recurrent_backward_naive, chunked_backward_naive: the backward (issue 15) by the reverse loop and by the
                 chunk equations of docs/training-design.md (section 1), gates in linear space, no
                 division: what a backward kernel will be checked against beside autograd.
chunked_naive:   the chunkwise-parallel form the chunked kernel (issue 4) will implement. Decays are
                 direct products of gates in linear space (never log(gate)), so gates of 0, negative
                 gates and gates above 1 give the reference's answer:

    within a chunk of steps c0..c0+C-1, with D[t, s] = prod_{r=s+1..t} gate_r (D[t, t] = 1, t >= s)
    and P[t] = prod_{r=c0..t} gate_r (decay from the chunk's start):

        y_t    = sum_{s<=t} D[t, s] beta_s (q_t . k_s) v_s  +  P[t] * (S_prev^T q_t)
        S_next = P[C-1] * S_prev + sum_s D[C-1, s] beta_s k_s v_s^T

    D is built by running products (D[t, s] = D[t-1, s] * gate_t), with no division, so a zero
    gate is exact. Across chunks the carried state follows S_c = P_c S_{c-1} + U_c, an associative
    scan over chunks (the sequence-parallel step).
"""
import torch


def recurrent_naive(q, k, v, gate, beta, initial_state=None):
    """(y, final_state) by the loop, in float64. initial_state: (B, H, Dk, Dv) or None."""
    q, k, v, gate, beta = (x.double() for x in (q, k, v, gate, beta))
    B, T, H, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64, device=q.device) if initial_state is None \
        else initial_state.double().clone()
    ys = []
    for t in range(T):
        S = gate[:, t, :, None, None] * S + beta[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        ys.append(torch.einsum("bhi,bhij->bhj", q[:, t], S))
    y = torch.stack(ys, 1) if ys else q.new_zeros(B, 0, H, v.shape[-1])
    return y, S


def decay_matrix(g):
    """D[..., t, s] = prod_{r=s+1..t} g[..., r] for t >= s, else 0, by running products."""
    C = g.shape[-1]
    D = torch.zeros(*g.shape, C, dtype=g.dtype, device=g.device)
    D[..., 0, 0] = 1
    for t in range(1, C):
        D[..., t, :t] = D[..., t - 1, :t] * g[..., t, None]
        D[..., t, t] = 1
    return D


def chunked_naive(q, k, v, gate, beta, chunk=64, initial_state=None):
    """(y, final_state) by the chunkwise form above, in float64."""
    q, k, v, gate, beta = (x.double().transpose(1, 2) for x in (q, k, v, gate, beta))  # (B, H, T, ...)
    B, H, T, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64, device=q.device) if initial_state is None \
        else initial_state.double().clone()
    ys = []
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        qc, kc, vc, gc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], gate[:, :, sl], beta[:, :, sl]
        D = decay_matrix(gc)                                   # (B, H, C, C)
        P = torch.cumprod(gc, dim=-1)                          # products from the chunk start: exact for 0
        A = (qc @ kc.transpose(-1, -2)) * D * bc[..., None, :]  # (B, H, C, C), lower triangular
        ys.append(A @ vc + P[..., None] * (qc @ S))
        S = P[..., -1, None, None] * S + (kc * (D[..., -1, :] * bc)[..., None]).transpose(-1, -2) @ vc
    y = torch.cat(ys, 2).transpose(1, 2) if ys else q.new_zeros(B, 0, H, v.shape[-1])
    return y, S


def recurrent_backward_naive(q, k, v, gate, beta, dy, initial_state=None, d_final_state=None):
    """(dq, dk, dv, dgate, dbeta, d_initial_state) of L with dL/dy = dy and dL/dS_T = d_final_state, by the
    reverse loop in float64 (training-design.md 1.1): Sh_t = dL/dS_t obeys Sh_T = dS_T + q_T dy_T^T,
    Sh_{t-1} = g_t Sh_t + q_{t-1} dy_{t-1}^T; dq_t = S_t dy_t, dk_t = beta_t Sh_t v_t, dv_t = beta_t Sh_t^T k_t,
    dbeta_t = <Sh_t, k_t v_t^T>, dgate_t = <Sh_t, S_{t-1}>, dS_0 = g_1 Sh_1. Nothing divides by a gate."""
    q, k, v, gate, beta, dy = (x.double() for x in (q, k, v, gate, beta, dy))
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    S = torch.zeros(B, H, Dk, Dv, dtype=torch.float64) if initial_state is None else initial_state.double().clone()
    states = [S]  # S_0 .. S_T
    for t in range(T):
        S = gate[:, t, :, None, None] * S + beta[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        states.append(S)
    Sh = torch.zeros(B, H, Dk, Dv, dtype=torch.float64) if d_final_state is None else d_final_state.double().clone()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dgate, dbeta = torch.zeros_like(gate), torch.zeros_like(beta)
    for t in range(T - 1, -1, -1):
        Sh = Sh + q[:, t, :, :, None] * dy[:, t, :, None, :]                       # Sh_t
        dq[:, t] = torch.einsum("bhij,bhj->bhi", states[t + 1], dy[:, t])
        u = torch.einsum("bhij,bhj->bhi", Sh, v[:, t])                              # Sh_t v_t
        dk[:, t] = beta[:, t, :, None] * u
        dv[:, t] = beta[:, t, :, None] * torch.einsum("bhij,bhi->bhj", Sh, k[:, t])
        dbeta[:, t] = (k[:, t] * u).sum(-1)
        dgate[:, t] = (Sh * states[t]).sum((-1, -2))
        Sh = gate[:, t, :, None, None] * Sh                                         # towards Sh_{t-1}
    return dq, dk, dv, dgate, dbeta, Sh


def chunked_backward_naive(q, k, v, gate, beta, dy, initial_state=None, d_final_state=None, chunk=32):
    """recurrent_backward_naive's result by training-design.md 1.2-1.3, a chunk at a time: the states at chunk
    starts forward, the end gradients Gp backward (Gamma = A[C-1] Gp + sum_u A[u] q_u dy_u^T), and within a
    chunk only C x C products and the gate tables L, A, w (running products; the gate gradient's pairs are a
    prefix from row t-1 times a suffix from column t, never L / g_t, so gate 0 is exact)."""
    q, k, v, gate, beta, dy = (x.double().transpose(1, 2) for x in (q, k, v, gate, beta, dy))  # (B, H, T, ...)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    S = torch.zeros(B, H, Dk, Dv, dtype=torch.float64) if initial_state is None else initial_state.double().clone()
    starts, tables = [], []
    for c0 in range(0, T, chunk):  # forward: each chunk's start state and tables
        sl = slice(c0, min(T, c0 + chunk))
        kc, vc, gc, bc = k[:, :, sl], v[:, :, sl], gate[:, :, sl], beta[:, :, sl]
        L = decay_matrix(gc)                      # L[t][s] = prod_{r=s+1..t} g_r, s <= t
        A = torch.cumprod(gc, dim=-1)             # A[t] = prod_{r=0..t} g_r
        w = L[..., -1, :]                         # w[s] = prod_{r=s+1..C-1} g_r
        starts.append(S)
        tables.append((sl, L, A, w))
        S = A[..., -1, None, None] * S + (kc * (w * bc)[..., None]).transpose(-1, -2) @ vc
    Gp = torch.zeros(B, H, Dk, Dv, dtype=torch.float64) if d_final_state is None else d_final_state.double().clone()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dgate, dbeta = torch.zeros_like(gate), torch.zeros_like(beta)
    for S, (sl, L, A, w) in zip(reversed(starts), reversed(tables)):
        Q, K, V, dY, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], dy[:, :, sl], beta[:, :, sl]
        C = Q.shape[2]
        Ah = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1)              # A[t - 1], A[-1] = 1
        Lx = torch.zeros_like(L)
        Lx[..., 1:, :] = L[..., :-1, :]                                             # L[t - 1][s]
        Lx = Lx * torch.ones(C, C, dtype=torch.float64).tril(-1)                    # s < t only
        QK, Dd = Q @ K.transpose(-1, -2), dY @ V.transpose(-1, -2)
        P = L * bc[..., None, :] * QK
        Mq, Md = L * bc[..., None, :] * Dd, L * Dd
        E = (bc[..., None, :] * QK * Dd) * torch.ones(C, C, dtype=torch.float64).tril(-1)
        R = dY @ S.transpose(-1, -2)                                                # rows S dy_t
        Rk = V @ Gp.transpose(-1, -2)                                               # rows Gp v_s
        f, e, c0 = (Q * R).sum(-1), (K * Rk).sum(-1), (Gp * S).sum((-1, -2))
        dq[:, :, sl] = A[..., None] * R + Mq @ K
        dKt = w[..., None] * Rk + Md.transpose(-1, -2) @ Q
        dk[:, :, sl] = bc[..., None] * dKt
        dbeta[:, :, sl] = (K * dKt).sum(-1)
        dv[:, :, sl] = (bc * w)[..., None] * (K @ Gp) + P.transpose(-1, -2) @ dY
        X = E @ Lx.transpose(-1, -2)                                                # X[u][t] = sum_s E[u][s] Lx[t][s]
        dgate[:, :, sl] = (w * Ah * c0[..., None]                                   # (a) start state x end gradient
                           + w * (Lx @ (bc * e)[..., None])[..., 0]                 # (b) keys before t x end gradient
                           + Ah * (L.transpose(-1, -2) @ f[..., None])[..., 0]      # (c) start state x queries from t
                           + (L * X).sum(-2))                                       # (d) pairs s < t <= u
        Gp = A[..., -1, None, None] * Gp + (Q * A[..., None]).transpose(-1, -2) @ dY  # Gamma: to the chunk before
    back = (x.transpose(1, 2) for x in (dq, dk, dv, dgate, dbeta))
    return (*back, Gp)

