"""AURA codebooks: the unit Lloyd-Max tables of N(0, 1) and their fp64 generator (aura-format.md §4).

The 1-4-bit tables are the spec's literals (shortest decimals that round-trip to the fp32 values).
The 8-bit table is produced by :func:`lloyd_max_gaussian` (about 25-30 s of fp64 work), so its fp32
output is committed below as a literal; ``tests/reference/test_aura.py`` has a slow test that
regenerates it and compares bit for bit.

Only the positive halves are stored: every table is symmetric, C[i] = -C[2**b - 1 - i].
No scipy: Phi, phi and the inverse of Phi are written here from ``math.erfc`` / ``torch.special.erfc``.
"""

from __future__ import annotations

import math

import torch

# Positive halves of the unit (sigma = 1) centroid tables, ascending (aura-format.md §4 table).
UNIT_POSITIVE: dict[int, tuple[float, ...]] = {
    1: (0.7978846,),
    2: (0.45278004, 1.5104176),
    3: (0.24509418, 0.7560053, 1.3439093, 2.1519456),
    4: (0.12839504, 0.3880483, 0.65675914, 0.94234043, 1.2562312, 1.6180464, 2.0690172, 2.7325895),
}

# 8 bits: positive half (C_8[128 ... 255]) of lloyd_max_gaussian(256) rounded to fp32, as shortest
# round-trip decimals. Regenerate with `python -m torch_aura.reference.aura_codebooks`.
# fmt: off
UNIT_POSITIVE_8BIT: tuple[float, ...] = (
    0.008446193, 0.025339384, 0.042234983, 0.059134603, 0.07603986, 0.092952356, 0.10987372, 0.12680559,
    0.14374956, 0.16070732, 0.17768049, 0.19467075, 0.21167976, 0.2287092, 0.24576078, 0.26283622,
    0.27993724, 0.2970656, 0.31422305, 0.3314114, 0.34863243, 0.365888, 0.38317996, 0.40051022,
    0.41788065, 0.4352932, 0.45274988, 0.47025266, 0.4878036, 0.5054048, 0.5230583, 0.5407663,
    0.55853105, 0.5763547, 0.5942396, 0.6121881, 0.6302026, 0.6482855, 0.6664394, 0.68466675,
    0.70297027, 0.72135264, 0.7398166, 0.75836504, 0.77700084, 0.795727, 0.8145467, 0.833463,
    0.8524793, 0.8715989, 0.8908253, 0.91016203, 0.92961293, 0.9491818, 0.9688726, 0.98868936,
    1.0086365, 1.0287182, 1.0489392, 1.0693042, 1.0898181, 1.110486, 1.1313132, 1.1523054,
    1.1734682, 1.1948076, 1.2163299, 1.2380418, 1.2599499, 1.2820615, 1.304384, 1.3269253,
    1.3496937, 1.3726976, 1.3959464, 1.4194493, 1.4432166, 1.4672587, 1.491587, 1.5162132,
    1.5411496, 1.5664098, 1.5920075, 1.6179578, 1.6442765, 1.6709803, 1.6980875, 1.7256169,
    1.7535894, 1.7820269, 1.8109531, 1.8403933, 1.8703752, 1.900928, 1.9320842, 1.9638784,
    1.9963485, 2.0295358, 2.0634851, 2.0982466, 2.1338742, 2.1704283, 2.2079754, 2.24659,
    2.2863545, 2.3273618, 2.3697171, 2.4135387, 2.4589622, 2.5061426, 2.5552595, 2.6065214,
    2.660174, 2.7165077, 2.7758706, 2.8386858, 2.905473, 2.9768822, 3.053742, 3.1371326,
    3.2285001, 3.3298485, 3.4440718, 3.575588, 3.7316663, 3.9256377, 4.1865954, 4.6035357,
)
# fmt: on
UNIT_POSITIVE[8] = UNIT_POSITIVE_8BIT


# --------------------------------------------------------------------------- Gaussian helpers (fp64)
def upper_tail(t):
    """Q(t) = Phi(-t) = P(X > t) for X ~ N(0, 1); tensor (fp64) or float.

    Written with erfc rather than 1 - Phi(t): the outer cells of the 8-bit quantizer hold ~1e-5 of
    the mass, and 1 - Phi would cancel most of its digits there.
    """
    if isinstance(t, torch.Tensor):
        return 0.5 * torch.special.erfc(t / math.sqrt(2.0))
    return 0.5 * math.erfc(t / math.sqrt(2.0))


def pdf(t):
    """phi(t), the standard normal density; tensor (fp64) or float."""
    if isinstance(t, torch.Tensor):
        return torch.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    return math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)


def inverse_upper_tail(q: float) -> float:
    """The t >= 0 with Q(t) = q, for 0 < q <= 1/2, to the last bit of fp64.

    Bisection on the monotone Q: 200 halvings of [0, 40] reach adjacent doubles, with no
    approximation formula to trust. Used only to build starting points, so speed is irrelevant.
    """
    if not 0.0 < q <= 0.5:
        raise ValueError(f"q: expected 0 < q <= 0.5, got {q}")
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if upper_tail(mid) > q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def inverse_cdf(p: float) -> float:
    """Phi^-1(p) for 0 < p < 1 (symmetric: the lower half mirrors the upper tail)."""
    if p >= 0.5:
        return inverse_upper_tail(1.0 - p) if p > 0.5 else 0.0
    return -inverse_upper_tail(p)


# ------------------------------------------------------------------------------ Lloyd-Max generator
def lloyd_max_gaussian(levels: int = 256, max_steps: int = 300_000, tol: float = 1e-13) -> torch.Tensor:
    """Lloyd-Max quantizer of N(0, 1) with ``levels`` (even) levels, fp64, ascending, all levels.

    Exactly the procedure of aura-format.md §4:

    * start at the high-resolution optimum c_i = sqrt(3) * Phi^-1((i + 1/2) / levels);
    * each step sets the edges to the midpoints of neighbouring centroids and moves every centroid
      to its cell's conditional mean, (phi(a) - phi(b)) / (Phi(b) - Phi(a)) for the cell [a, b];
    * stop after ``max_steps`` steps or as soon as no centroid moved by more than ``tol``.

    The iteration runs on the positive half only, with upper-tail probabilities Q(a) - Q(b) in the
    denominator (no cancellation in the thin outer cells). That is the spec's re-symmetrised
    full-table iteration exactly: once c = -reverse(c), the middle edge is 0 and both halves see
    mirror-image cells, so iterating one half and mirroring is the same computation.
    """
    if levels % 2 or levels < 2:
        raise ValueError(f"levels: expected an even number >= 2, got {levels}")
    half = levels // 2
    # Upper half i = half ... levels-1 of the start: Phi^-1((i + 1/2)/levels) = Q^-1((levels-1-i + 1/2)/levels).
    start = [math.sqrt(3.0) * inverse_upper_tail((half - 1 - k + 0.5) / levels) for k in range(half)]
    c = torch.tensor(start, dtype=torch.float64)
    zero = torch.zeros(1, dtype=torch.float64)
    inf = torch.full((1,), math.inf, dtype=torch.float64)
    for _ in range(max_steps):
        edges = torch.cat([zero, 0.5 * (c[:-1] + c[1:]), inf])  # cell k is [edges[k], edges[k+1])
        a, b = edges[:-1], edges[1:]
        new = (pdf(a) - pdf(b)) / (upper_tail(a) - upper_tail(b))
        moved = (new - c).abs().max().item()
        c = new
        if moved < tol:
            break
    return torch.cat([-c.flip(0), c])


def gaussian_mse(centroids: torch.Tensor) -> float:
    """Closed-form mean squared error of nearest-centroid quantization of N(0, 1), fp64.

    With cells [a, b] between the midpoints: E[(X - c)^2; cell] = M2 - 2 c M1 + c^2 P, where
    P = Phi(b) - Phi(a), M1 = phi(a) - phi(b), M2 = P + a phi(a) - b phi(b) (the infinite ends
    contribute t phi(t) = 0). Valid for any ascending table, not only the optimal one, so it can
    reject a wrong table.
    """
    c = centroids.to(torch.float64).flatten()
    mid = 0.5 * (c[:-1] + c[1:])
    a = torch.cat([torch.full((1,), -math.inf, dtype=torch.float64), mid])
    b = torch.cat([mid, torch.full((1,), math.inf, dtype=torch.float64)])
    p = upper_tail(a) - upper_tail(b)
    m1 = pdf(a) - pdf(b)
    a_phi = torch.where(torch.isinf(a), torch.zeros_like(a), a * pdf(a))
    b_phi = torch.where(torch.isinf(b), torch.zeros_like(b), b * pdf(b))
    m2 = p + a_phi - b_phi
    return float((m2 - 2.0 * c * m1 + c * c * p).sum())


def _fp32_literal(x: float) -> str:
    """Shortest decimal that round-trips to the fp32 value of ``x``."""
    import numpy as np

    return np.format_float_positional(np.float32(x), unique=True, trim="-")


def main() -> None:  # pragma: no cover - regeneration tool
    full = lloyd_max_gaussian(256)
    pos = full[128:].to(torch.float32).tolist()
    lits = [_fp32_literal(v) for v in pos]
    for i in range(0, 128, 8):
        print("    " + ", ".join(lits[i:i + 8]) + ",")
    print("MSE", gaussian_mse(full.to(torch.float32)))


if __name__ == "__main__":  # pragma: no cover
    main()
