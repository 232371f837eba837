"""Cross-seed Jaccard overlap of changed masks (workflow_scripts.overlap)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from workflow_scripts import overlap as ov
from workflow_scripts import sparsity as sp
from workflow_scripts.measures import checkpoint_io


def save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "model.safetensors")
    return path


def changed_at(base: torch.Tensor, idx: list[int]) -> torch.Tensor:
    out = base.clone()
    out[idx] += 1.0
    return out


@pytest.fixture
def known(tmp_path) -> dict:
    """10 weights: seed 1 changes 0-5, seed 2 changes 3-8, seed 3 equals seed 1."""
    base = torch.ones(10)
    norm = torch.ones(4)
    save(tmp_path / "base", {"model.layers.0.mlp.up_proj.weight": base, "model.norm.weight": norm})
    finals = {}
    for seed, idx in ((1, [0, 1, 2, 3, 4, 5]), (2, [3, 4, 5, 6, 7, 8]), (3, [0, 1, 2, 3, 4, 5])):
        tensors = {"model.layers.0.mlp.up_proj.weight": changed_at(base, idx), "model.norm.weight": norm}
        finals[seed] = save(tmp_path / f"seed{seed}", tensors)
    return {"base": tmp_path / "base", "finals": finals}


def test_jaccard_chance():
    assert ov.jaccard_chance(0.5, 0.5) == pytest.approx(1 / 3)
    assert ov.jaccard_chance(1.0, 1.0) == 1.0
    assert ov.jaccard_chance(0.1, 0.0) == 0.0
    assert math.isnan(ov.jaccard_chance(0.0, 0.0))


def test_known_jaccard(known):
    whole, by_module = ov.compute_overlap(known["base"], known["finals"], etas=(1e-3, 1e-5), precision="bf16")
    assert list(whole.columns) == ov.COLUMNS
    assert len(whole) == 3 * 2  # 3 seed pairs x 2 etas
    row = whole[(whole.seed_a == 1) & (whole.seed_b == 2) & (whole.eta == 1e-3)].iloc[0]
    n = 14  # 10 mlp weights + 4 norm weights
    assert (row.intersection, row.union, row.numel) == (3, 9, n)
    assert row.jaccard == pytest.approx(1 / 3)
    p = 6 / n
    assert row.density_a == row.density_b == pytest.approx(p)
    assert row.jaccard_chance == pytest.approx(p * p / (2 * p - p * p))
    assert row.ratio == pytest.approx(row.jaccard / row.jaccard_chance)
    same = whole[(whole.seed_a == 1) & (whole.seed_b == 3)]
    assert (same.jaccard == 1.0).all()
    assert set(whole.precision) == {"bf16"}
    # per module: the norm never changes (empty union -> NaN), the mlp carries everything
    norm = by_module[(by_module.module == "norm") & (by_module.seed_a == 1) & (by_module.seed_b == 2)]
    assert (norm.union == 0).all() and norm.jaccard.isna().all() and norm.ratio.isna().all()
    mlp = by_module[(by_module.module == "mlp_up") & (by_module.seed_a == 1) & (by_module.seed_b == 2)]
    np.testing.assert_allclose(mlp.jaccard, 1 / 3)
    assert (mlp.numel == 10).all()


def test_streaming_and_modules_add_up(tmp_path):
    gen = torch.Generator().manual_seed(0)
    base = {
        "model.embed_tokens.weight": torch.randn(64, 8, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=gen),
        "model.layers.0.input_layernorm.weight": torch.ones(8),
    }
    save(tmp_path / "base", base)
    finals = {}
    for seed in (0, 1, 2):
        g = torch.Generator().manual_seed(seed + 10)
        tensors = {k: (v + 1e-4 * torch.randn(v.shape, generator=g) * (v.abs() < 1)).to(torch.bfloat16)
                   for k, v in base.items()}  # fmt: skip
        finals[seed] = save(tmp_path / f"s{seed}", tensors)
    etas = (1e-3, 1e-4)
    whole, by_module = ov.compute_overlap(tmp_path / "base", finals, etas, "bf16")
    small, _ = ov.compute_overlap(
        tmp_path / "base", finals, etas, "bf16", window_bytes=64, chunk_elems=5, threads=2
    )
    pd.testing.assert_frame_equal(whole, small)
    key = ["seed_a", "seed_b", "eta"]
    summed = by_module.groupby(key)[["intersection", "union", "numel"]].sum()
    pd.testing.assert_frame_equal(summed, whole.set_index(key)[summed.columns].sort_index())
    # densities agree with the per-seed sparsity counts
    for seed, path in finals.items():
        frame = sp.diff_checkpoints(tmp_path / "base", path, etas)
        for eta in etas:
            changed = frame[sp.eta_column(eta)].sum()
            rows = pd.concat(
                [whole[(whole.seed_a == seed) & (whole.eta == eta)].density_a,
                 whole[(whole.seed_b == seed) & (whole.eta == eta)].density_b]
            )  # fmt: skip
            np.testing.assert_allclose(rows * frame.numel.sum(), changed)


def test_main_writes_both_tables(known, tmp_path):
    out = tmp_path / "results" / "sparsity" / "bf16" / "overlap.parquet"
    finals = known["finals"]
    argv = ["--base", str(known["base"]), "--precision", "bf16", "--out", str(out), "--etas", "1e-3"]
    argv += ["--seeds", *map(str, finals), "--finals", *map(str, finals.values())]
    assert ov.main(argv) == 0
    whole = pd.read_parquet(out)
    assert list(whole.columns) == ov.COLUMNS and len(whole) == 3
    by_module = pd.read_parquet(ov.by_module_path(out))
    assert ov.by_module_path(out).name == "overlap.by_module.parquet"
    assert set(by_module.module) == {"mlp_up", "norm"}
    with pytest.raises(SystemExit):
        ov.main([*argv[:-1]])  # one final fewer than seeds


def test_seeds_must_share_tensor_names(known, tmp_path):
    odd = save(tmp_path / "odd", {"model.layers.0.mlp.up_proj.weight": torch.ones(10)})
    with pytest.raises(checkpoint_io.TensorMismatchError, match=r"model\.norm\.weight"):
        ov.compute_overlap(known["base"], {1: known["finals"][1], 9: odd})
