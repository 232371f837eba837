"""Update-sparsity diff on crafted safetensors pairs with known counts (workflow_scripts.sparsity)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from workflow_scripts import sparsity as sp
from workflow_scripts.measures import diff_setup
from workflow_scripts.measures import sparsity_kernel as kernel
from workflow_scripts.measures.checkpoint_io import TensorMismatchError as Mismatch

NAN, INF = math.nan, math.inf
E10 = 2.0**-10  # a dyadic eta: boundary values are exact in float32


def save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    return path


def diff_one(tmp_path: Path, base, final, etas=(E10,), **kw) -> pd.Series:
    """Diff a single tensor 'w' (lists or tensors) and return its row."""
    to_t = lambda x: x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)  # noqa: E731
    a = save(tmp_path / "a.safetensors", {"w": to_t(base)})
    b = save(tmp_path / "b.safetensors", {"w": to_t(final)})
    frame = sp.diff_checkpoints(a, b, etas, **kw)
    assert len(frame) == 1
    return frame.iloc[0]


def reference_changed(base: np.ndarray, final: np.ndarray, eta: float) -> int:
    """The documented float64 rule, written independently of the module (finite inputs)."""
    a, b = base.astype(np.float64), final.astype(np.float64)
    return int(np.count_nonzero(np.abs(b - a) > eta * np.maximum(np.abs(a), np.abs(b))))


@pytest.mark.parametrize(
    ("name", "module", "layer"),
    [
        ("model.layers.3.self_attn.q_proj.weight", "attn_q", 3),
        ("model.layers.3.self_attn.k_proj.bias", "attn_k", 3),
        ("model.layers.0.self_attn.v_proj.weight", "attn_v", 0),
        ("model.layers.12.self_attn.o_proj.weight", "attn_o", 12),
        ("model.layers.3.mlp.gate_proj.weight", "mlp_gate", 3),
        ("model.layers.3.mlp.up_proj.weight", "mlp_up", 3),
        ("model.layers.3.mlp.down_proj.weight", "mlp_down", 3),
        ("model.layers.3.input_layernorm.weight", "norm", 3),
        ("model.layers.3.post_attention_layernorm.weight", "norm", 3),
        ("model.layers.3.self_attn.q_norm.weight", "norm", 3),
        ("model.norm.weight", "norm", -1),
        ("model.embed_tokens.weight", "embedding", -1),
        ("lm_head.weight", "lm_head", -1),
        ("model.rotary_emb.inv_freq", "other", -1),
    ],
)
def test_module_type_and_layer(name, module, layer):
    assert diff_setup.module_type(name) == module
    assert diff_setup.layer_index(name) == layer
    assert module in diff_setup.MODULE_TYPES


def test_eta_labels_are_lossless():
    assert sp.eta_column(1e-3) == "changed_eta_1e-03"
    assert sp.eta_column(2.5e-4) == "changed_eta_2.5e-04"
    frame = pd.DataFrame(columns=[sp.eta_column(e) for e in (1e-3, 2.5e-4, 1e-5)])
    assert sp.etas_of(frame) == [1e-3, 2.5e-4, 1e-5]


def test_tolerance_boundary_is_not_changed(tmp_path):
    ulp = 2.0**-24  # spacing of float32 just below 1.0
    base = [1.0, 1.0, 1.0, 1.0 - E10, 1.0]
    final = [1.0 - E10, 1.0 - E10 - ulp, 1.0 - E10 + ulp, 1.0, 1.0]
    # d == eta*m (boundary, both directions), d > eta*m, d < eta*m, no change
    fast = diff_one(tmp_path, base, final, etas=(E10,))
    slow = diff_one(tmp_path, base, final, etas=(E10, 0.5))  # eta > 0.25: the float64 path
    assert fast[sp.eta_column(E10)] == 1
    assert slow[sp.eta_column(E10)] == 1
    # eta = 0.5: 2 -> 1 sits on the boundary; 2 -> 0.99 crosses it
    row = diff_one(tmp_path, [2.0, 2.0, 2.0], [1.0, 0.99, 1.5], etas=(0.5,))
    assert row[sp.eta_column(0.5)] == 1
    # float64 storage takes the generic path with the same rule
    row = diff_one(
        tmp_path, torch.tensor(base, dtype=torch.float64), torch.tensor(final, dtype=torch.float64)
    )
    assert row[sp.eta_column(E10)] == 1


@pytest.mark.parametrize("n_equal", [0, 400_000])  # mixed with many bitwise-equal elements
def test_fast_path_matches_float64_rule_near_boundary(tmp_path, n_equal):
    """Values within a few ulps of the boundary for non-dyadic etas: the float32 band is re-decided."""
    rng = np.random.default_rng(0)
    etas = (1e-3, 1e-4, 1e-5)
    base = rng.standard_normal(30_000).astype(np.float32)
    finals = []
    for eta in etas:
        edge = (base.astype(np.float64) * (1 - eta)).astype(np.float32)
        for k in range(-3, 4):  # step k ulps around the boundary
            step = edge.copy()
            for _ in range(abs(k)):
                step = np.nextafter(step, np.float32(np.inf) if k > 0 else np.float32(-np.inf))
            finals.append(step)
    same = rng.standard_normal(n_equal).astype(np.float32)
    base_all = np.concatenate([np.tile(base, len(finals)), same])
    final_all = np.concatenate([*finals, same])
    base_all, final_all = base_all[perm := rng.permutation(base_all.size)], final_all[perm]
    row = diff_one(tmp_path, torch.from_numpy(base_all), torch.from_numpy(final_all), etas=etas)
    for eta in etas:
        expected = reference_changed(base_all, final_all, eta)
        assert row[sp.eta_column(eta)] == expected
        assert 0 < expected < base_all.size
    # the per-element masks used by the overlap agree too
    plan, ws = kernel.EtaPlan.make(etas), kernel.Workspace(base_all.size)
    masks = kernel.changed_masks(torch.from_numpy(base_all), torch.from_numpy(final_all), plan, ws)
    for eta, mask in zip(etas, masks, strict=True):
        a, b = base_all.astype(np.float64), final_all.astype(np.float64)
        np.testing.assert_array_equal(mask, np.abs(b - a) > eta * np.maximum(np.abs(a), np.abs(b)))


def test_zeros_and_signed_zeros(tmp_path):
    base = [0.0, 0.0, -0.0, 0.0, 1.0, 1e-40]
    final = [0.0, -0.0, 0.0, 1e-3, 0.0, 2e-40]  # includes float32 subnormals
    row = diff_one(tmp_path, base, final, etas=(1e-3, 1e-5))
    # -0.0 vs 0.0 is numerically unchanged but not bitwise equal
    assert row[sp.eta_column(1e-3)] == row[sp.eta_column(1e-5)] == 3
    assert row["equal_stored"] == 1
    assert row["equal_bf16"] == 1  # bf16 keeps float32's exponent range: the subnormals stay distinct
    assert row["nonfinite_base"] == row["nonfinite_final"] == 0


@pytest.mark.parametrize("n_same", [0, 20_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_nan_and_inf(tmp_path, dtype, n_same):
    base = [NAN, 1.0, INF, INF, 1.0, NAN, -INF, 2.0]
    final = [NAN, NAN, INF, -INF, INF, 1.0, -INF, 2.0]
    pad = torch.linspace(-1, 1, 5000)  # finite values in the same chunk: the chunk leaves the fast path
    same = torch.linspace(-3, 3, n_same)
    a = torch.cat([torch.tensor(base), pad, same]).to(dtype)
    b = torch.cat([torch.tensor(final), pad * (1 + 1e-2), same]).to(dtype)
    row = diff_one(tmp_path, a, b, etas=(1e-3, 1e-5))
    pad_changed = int((pad != 0).sum())  # a 1% change survives every dtype here
    # changed: 1->NaN, inf->-inf, 1->inf, NaN->1; unchanged: NaN->NaN, inf->inf, -inf->-inf, 2->2
    assert row[sp.eta_column(1e-3)] == 4 + pad_changed
    assert row[sp.eta_column(1e-5)] == 4 + pad_changed
    assert row["nonfinite_base"] == 5
    assert row["nonfinite_final"] == 6
    # bitwise: NaN->NaN (same bits), inf, -inf, 2 and the unchanged pads
    assert row["equal_stored"] == row["equal_bf16"] == 4 + pad.numel() - pad_changed + n_same


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identical_tensors_with_nan(tmp_path, dtype):
    """A bitwise-identical chunk skips the arithmetic but still counts its NaN/inf."""
    x = torch.tensor([NAN, 1.0, -INF, 0.0, -0.0]).to(dtype)
    row = diff_one(tmp_path, x, x.clone(), etas=(1e-3,), chunk_elems=2)
    assert row["equal_stored"] == row["equal_bf16"] == 5
    assert row[sp.eta_column(1e-3)] == 0
    assert row["nonfinite_base"] == row["nonfinite_final"] == 2


def test_bf16_hides_small_updates_to_norm_weights(tmp_path):
    """RMSNorm weights at 1.0 with an update of 1e-4: visible in fp32, gone once stored in bf16."""
    ones = torch.ones(1000)
    fp32 = diff_one(tmp_path, ones, ones + 1e-4, etas=(1e-3, 1e-5))
    assert fp32["equal_stored"] == 0
    assert fp32[sp.eta_column(1e-5)] == 1000
    assert fp32[sp.eta_column(1e-3)] == 0
    assert fp32["equal_bf16"] == 1000  # bf16 spacing at 1.0 is 2^-7: the update is invisible in bf16
    bf = ones.to(torch.bfloat16)
    bf16 = diff_one(tmp_path, bf, bf + 1e-4, etas=(1e-3, 1e-5))
    assert bf16["equal_stored"] == bf16["equal_bf16"] == 1000
    assert bf16[sp.eta_column(1e-5)] == 0


def test_fp32_base_vs_bf16_final(tmp_path):
    gen = torch.Generator().manual_seed(1)
    base = torch.cat([torch.randn(4000, generator=gen), torch.tensor([1.0, 0.5, -2.0, 0.0])])
    final = (base + 1e-3 * torch.randn(base.shape, generator=gen)).to(torch.bfloat16)
    etas = (1e-2, 1e-3)
    row = diff_one(tmp_path, base, final, etas=etas)
    assert (row["base_dtype"], row["final_dtype"]) == ("float32", "bfloat16")
    f32 = final.float()
    assert row["equal_stored"] == int((base == f32).sum())  # compared in float32
    assert row["equal_bf16"] == int((base.to(torch.bfloat16) == final).sum())
    for eta in etas:
        assert row[sp.eta_column(eta)] == reference_changed(base.numpy(), f32.numpy(), eta)
    # a pure cast: every element is bf16-equal, only the bf16-representable ones stored-equal
    row = diff_one(tmp_path, base, base.to(torch.bfloat16), etas=etas)
    assert row["equal_bf16"] == base.numel()
    assert row["equal_stored"] == int((base.to(torch.bfloat16).float() == base).sum()) >= 4


def _model(seed: int, scale: float = 0.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {
        "model.embed_tokens.weight": torch.randn(50, 16, generator=gen),
        "model.norm.weight": torch.ones(16),
        "model.layers.0.input_layernorm.weight": torch.ones(16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=gen),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 40, generator=gen),
        "model.layers.1.mlp.up_proj.weight": torch.randn(40, 16, generator=gen),
        "model.scalar": torch.tensor(3.0),
        "model.empty": torch.zeros(0, 4),
        "model.buffer": torch.arange(10),
    }
    if scale:
        gen2 = torch.Generator().manual_seed(seed + 100)
        for k, v in out.items():
            if v.is_floating_point() and "norm" not in k:
                keep = torch.rand(v.shape, generator=gen2) < 0.5
                out[k] = v + scale * torch.randn(v.shape, generator=gen2) * keep
    return out


def test_sharded_index_matches_single_file(tmp_path):
    base, final = _model(0), _model(0, scale=1e-3)
    single = sp.diff_checkpoints(save(tmp_path / "b1" / "model.safetensors", base),
                                 save(tmp_path / "f1" / "model.safetensors", final))  # fmt: skip
    names = sorted(base)
    shards = {"model-00001-of-00002.safetensors": names[:4], "model-00002-of-00002.safetensors": names[4:]}
    for fname, keys in shards.items():
        save(tmp_path / "b2" / fname, {k: base[k] for k in keys})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "b2" / "model.safetensors.index.json").write_text(json.dumps(index))
    save(tmp_path / "f2" / "model.safetensors", final)
    sharded = sp.diff_checkpoints(tmp_path / "b2", tmp_path / "f2")
    key = ["tensor"]
    pd.testing.assert_frame_equal(
        single.sort_values(key).reset_index(drop=True), sharded.sort_values(key).reset_index(drop=True)
    )
    assert int(single.loc[single.tensor == "model.norm.weight", "equal_stored"].iloc[0]) == 16
    (tmp_path / "b2" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        sp.diff_checkpoints(tmp_path / "b2", tmp_path / "f2")


def test_chunking_does_not_change_counts(tmp_path):
    a = save(tmp_path / "a.safetensors", _model(0))
    b = save(tmp_path / "b.safetensors", _model(0, scale=1e-4))
    big = sp.diff_checkpoints(a, b)
    small = sp.diff_checkpoints(a, b, window_bytes=300, chunk_elems=7, threads=3)
    pd.testing.assert_frame_equal(big, small)
    row = big.set_index("tensor")
    assert row.loc["model.empty", "numel"] == 0
    assert row.loc["model.scalar", "equal_stored"] == 1
    assert row.loc["model.buffer", "base_dtype"] == "int64"
    assert row.loc["model.buffer", "equal_stored"] == 10


def test_tied_lm_head(tmp_path):
    base = {"model.embed_tokens.weight": torch.ones(8, 4), "model.norm.weight": torch.ones(4)}
    final = {k: v.clone() for k, v in base.items()}
    frame = sp.diff_checkpoints(
        save(tmp_path / "a.safetensors", base), save(tmp_path / "b.safetensors", final)
    )
    assert "lm_head.weight" not in set(frame.tensor)  # tied on both sides: only the stored embedding
    final["lm_head.weight"] = torch.ones(8, 4) * 2  # untied after training: compared to the base embedding
    frame = sp.diff_checkpoints(tmp_path / "a.safetensors", save(tmp_path / "c.safetensors", final))
    row = frame.set_index("tensor").loc["lm_head.weight"]
    assert bool(row["tied"]) and row["module"] == "lm_head"
    assert row["numel"] == 32 and row[sp.eta_column(1e-3)] == 32


def test_mismatched_names_and_shapes_raise(tmp_path):
    a = save(tmp_path / "a.safetensors", {"x": torch.zeros(3), "y": torch.zeros(2, 2)})
    b = save(tmp_path / "b.safetensors", {"x": torch.zeros(3), "z": torch.zeros(2, 2)})
    with pytest.raises(Mismatch, match=r"'y'.*a\.safetensors.*b\.safetensors") as err:
        sp.diff_checkpoints(a, b)
    assert isinstance(err.value, ValueError)
    c = save(tmp_path / "c.safetensors", {"x": torch.zeros(4), "y": torch.zeros(2, 2)})
    with pytest.raises(Mismatch, match=r"'x'.*\[3\].*a\.safetensors.*\[4\].*c\.safetensors"):
        sp.diff_checkpoints(a, c)


def test_main_writes_tensor_table_and_summary(tmp_path):
    base = save(tmp_path / "base" / "model.safetensors", _model(0))
    final = save(tmp_path / "final" / "model.safetensors", _model(0, scale=1e-3))
    out = tmp_path / "results" / "sparsity" / "bf16" / "seed0.parquet"
    argv = ["--base", str(base.parent), "--final", str(final.parent), "--out", str(out)]
    assert sp.main([*argv, "--etas", "1e-3", "1e-5", "--precision", "bf16", "--seed", "0"]) == 0
    frame = pd.read_parquet(out)
    assert list(frame.columns[:3]) == ["precision", "seed", "tensor"]
    assert {"changed_eta_1e-03", "changed_eta_1e-05", "equal_bf16", "equal_stored"} <= set(frame.columns)
    summary = json.loads(sp.summary_path(out).read_text())
    assert sp.summary_path(out).name == "seed0.summary.json"
    model = summary["model"]
    assert model["numel"] == int(frame.numel.sum())
    assert model["changed_fraction"]["1e-03"] == pytest.approx(
        frame["changed_eta_1e-03"].sum() / model["numel"]
    )
    assert summary["by_module"]["norm"]["tensors_zero_changed"]["1e-05"] == 2
    assert summary["by_module"]["norm"]["equal_bf16_fraction"] == 1.0
    assert set(summary["by_layer"]) == {"-1", "0", "1"}
    long = sp.to_long(frame)
    assert len(long) == 2 * len(frame) and set(long.eta) == {1e-3, 1e-5}
    assert not list(out.parent.glob(".*"))  # atomic writes leave no temp files behind


def test_cast_base_to_final_measures_from_the_runs_real_start(tmp_path):
    """A bf16 run starts from bf16(base): its rounding is not an update, an update on top of it is."""
    base = torch.tensor([1.0 + 2.0**-10, 3.14159, -2.71828, 0.1], dtype=torch.float32)
    start = base.to(torch.bfloat16)
    final = start.clone()
    final[3] = final[3] * 1.5  # one real update
    save_file({"w": base}, tmp_path / "base.safetensors")
    save_file({"w": final}, tmp_path / "final.safetensors")
    plain = sp.diff_checkpoints(tmp_path / "base.safetensors", tmp_path / "final.safetensors", [1e-5])
    cast = sp.diff_checkpoints(
        tmp_path / "base.safetensors", tmp_path / "final.safetensors", [1e-5], cast_base_to_final=True
    )
    assert int(plain["changed_eta_1e-05"].iloc[0]) == 4  # rounding counted as change
    assert int(cast["changed_eta_1e-05"].iloc[0]) == 1
    assert int(cast["equal_stored"].iloc[0]) == 3


def test_command_line_and_workflow_both_measure_from_the_runs_real_start(tmp_path):
    """The CLI default equals the workflow's (cast on); --no-cast-base-to-final turns it off."""
    base = torch.tensor([1.0 + 2.0**-10, 3.14159, -2.71828, 0.1], dtype=torch.float32)
    final = base.to(torch.bfloat16)
    save_file({"w": base}, tmp_path / "base.safetensors")
    save_file({"w": final}, tmp_path / "final.safetensors")
    argv = ["--base", str(tmp_path / "base.safetensors"), "--final", str(tmp_path / "final.safetensors")]
    assert sp.main([*argv, "--out", str(tmp_path / "on.parquet"), "--etas", "1e-5"]) == 0
    assert (
        sp.main([*argv, "--out", str(tmp_path / "off.parquet"), "--etas", "1e-5", "--no-cast-base-to-final"])
        == 0
    )
    assert int(pd.read_parquet(tmp_path / "on.parquet")["changed_eta_1e-05"].iloc[0]) == 0
    assert int(pd.read_parquet(tmp_path / "off.parquet")["changed_eta_1e-05"].iloc[0]) == 4
    assert json.loads(sp.summary_path(tmp_path / "on.parquet").read_text())["base_cast_to_final"] is True
    defaults = sp.run(tmp_path / "base.safetensors", tmp_path / "final.safetensors", tmp_path / "d.parquet")
    assert defaults["etas"] == [1e-3, 1e-4, 1e-5]  # the schema's sparsity.etas default
