"""Estimators over per-problem success counts: pass@k, its standard error, paired dJ, eval noise.

Problem i has n samples of which c_i are correct; p_i = c_i / n.

| quantity       | estimate                                             | why this form                      |
|----------------|------------------------------------------------------|------------------------------------|
| pass@k         | mean_i [1 - C(n - c_i, k) / C(n, k)]                 | unbiased for k <= n (Chen et al.   |
|                | = mean_i [1 - prod_{j=n-c_i+1}^{n} (1 - k / j)]      | 2021); no huge binomials formed    |
| pass@1         | mean_i p_i  (pass@k at k = 1)                        |                                    |
| SE             | sd_i(per-problem value, ddof 1) / sqrt(N)            | problems are the unit; includes    |
|                |                                                      | problem draw and finite-n noise    |
| dJ (paired)    | mean_i (p_i - p0_i), SE = sd_i(p_i - p0_i) / sqrt(N) | same problems in run and base:     |
|                |                                                      | removes between-problem variance   |
| eval_noise_var | mean_i [p_i (1 - p_i) / (n - 1)] / N                 | unbiased for Var(pass@1|problems)  |
|                |                                                      | from finite sampling, since        |
|                |                                                      | E[p^(1 - p^)] = p(1 - p)(n - 1)/n  |

``eval_noise_var`` is what a variance-across-seeds analysis subtracts from the observed variance of a
run's pass@1 to get the variance due to the model (runs are sampled with independent seeds, so the
sampling noise of different runs is independent and this is exactly its contribution). The same holds
for dJ = J - J0 across seeds: J0 (the base run) is common to every seed, so it shifts dJ but adds no
across-seed variance. Undefined (None) for n = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` of ``n`` samples correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def k_values(n: int) -> list[int]:
    """k = 1, 2, 4, ... (powers of two up to n) and n itself."""
    ks = [2**j for j in range(n.bit_length()) if 2**j <= n]
    return sorted(set(ks) | {n})


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and its standard error (sample sd with ddof 1 over sqrt(len)); SE None for fewer than 2."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("no values")
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
    return float(x.mean()), se


def pass_at_k_summary(n: int, counts: Sequence[int]) -> dict[str, dict[str, float | None]]:
    """{str(k): {"mean", "se"}} for every k in ``k_values(n)``, over problems with ``counts`` correct."""
    out = {}
    for k in k_values(n):
        mean, se = mean_se([pass_at_k(n, int(c), k) for c in counts])
        out[str(k)] = {"mean": mean, "se": se}
    return out


def eval_noise_variance(n: int, counts: Sequence[int]) -> float | None:
    """Unbiased estimate of the variance of mean_i p_i due to finite sampling (None when n = 1)."""
    if n < 2:
        return None
    p = np.asarray(counts, dtype=np.float64) / n
    return float(np.mean(p * (1.0 - p) / (n - 1)) / len(p))


def paired_difference(p_run: Sequence[float], p_base: Sequence[float]) -> tuple[float, float | None]:
    """Mean and SE of per-problem differences p_i - p0_i (sequences aligned by problem)."""
    if len(p_run) != len(p_base):
        raise ValueError(f"paired difference needs aligned problems: {len(p_run)} vs {len(p_base)}")
    return mean_se(np.asarray(p_run, dtype=np.float64) - np.asarray(p_base, dtype=np.float64))
