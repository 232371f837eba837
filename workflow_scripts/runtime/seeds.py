"""Seeds derived from names, and seeded subsets: every stage that samples draws its stream from here.

A stream is named by (config seed, run, task, purpose): the evaluate stage's sampling and KL, and the
training stage's held-out curves, each get their own reproducible stream, independent of which job or
process computes it (Python's ``hash()`` is salted per process, so it cannot serve).
"""

from __future__ import annotations

import hashlib


def derive_seed(base_seed: int, *parts: str) -> int:
    """A stable 31-bit seed from the config seed and names."""
    digest = hashlib.sha256("/".join([str(base_seed), *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def seeded_subset(n_rows: int, k: int, seed: int) -> list[int]:
    """``k`` of ``n_rows`` row indices, a seeded sample in file order (all of them when k >= n_rows)."""
    if k >= n_rows:
        return list(range(n_rows))
    import torch

    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n_rows, generator=gen)[:k].tolist())
