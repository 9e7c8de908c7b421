"""Naive float64 references for the fast paths, in torch (tests and design; never on a hot path).

recurrent_naive: the spec's loop, with an optional initial state and the final state.
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
