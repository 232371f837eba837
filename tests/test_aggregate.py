"""Tests of workflow_scripts.aggregate on synthetic upstream files shaped like the real stage outputs.

``write_fake_results`` writes eval/kl summaries (a base per arm dtype: ``base``, ``base-bfloat16``),
training metrics + run.json (with or without the health and representable-update records), sparsity
summaries and overlap tables with the keys those stages write; tests/test_report.py reuses it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workflow_scripts import aggregate, stats
from workflow_scripts.aggregate import AggregateError

TASKS = {"add_sub": "on_task", "mul": "off_task", "mcq": "off_task"}
ETAS = (1e-3, 1e-4, 1e-5)
MODULES = ("attn_q", "mlp_up", "norm")


def _eta_label(eta: float) -> str:
    return np.format_float_scientific(eta, trim="-", exp_digits=2)


def _sparsity_agg(rng: np.random.Generator, numel: int, bf16: bool, flat: bool = False) -> dict:
    changed = [0.0] * len(ETAS) if flat else sorted(rng.uniform(0.1, 0.3 if bf16 else 1.0, len(ETAS)))
    equal_bf16 = 0.8 if bf16 else rng.uniform(0.0, 0.2)
    return {
        "n_tensors": 3,
        "numel": numel,
        "equal_stored_fraction": equal_bf16 / 2,
        "equal_bf16_fraction": equal_bf16,
        "tensors_bf16_equal": 1 if bf16 else 0,
        "nonfinite_final": 0,
        "changed": {_eta_label(e): int(c * numel) for e, c in zip(ETAS, changed, strict=True)},
        "changed_fraction": {_eta_label(e): c for e, c in zip(ETAS, changed, strict=True)},
        "tensors_zero_changed": {_eta_label(e): 0 for e in ETAS},
    }


def write_fake_results(
    root: Path,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    seeds: tuple[int, ...] = (1, 2, 3),
    tasks: dict[str, str] | None = None,
    kl: bool = True,
    steps: int = 20,
    seed: int = 0,
    health: bool = True,
    diverged: tuple[str, ...] = (),
    flat: bool = False,
) -> dict:
    """A results/ tree for aggregate: {'evals', 'kls', 'train', 'sparsity', 'overlap'} path lists.

    ``flat``: what a few-step run of a tiny model gives: pass@1 0 everywhere (so dJ 0 and no eval noise),
    KL 0, no weight changed, constant training statistics."""
    tasks = tasks or TASKS
    rng = np.random.default_rng(seed)
    paths: dict[str, list] = {"evals": [], "kls": [], "train": [], "sparsity": [], "overlap": []}
    ref_of = {p: "base-bfloat16" if "bf16" in p else "base" for p in precisions}
    bases = sorted(set(ref_of.values()))
    runs = bases + [f"{p}-s{s}" for p in precisions for s in seeds]
    base_j = {
        b: {t: 0.0 if flat else 0.3 + 0.1 * i + (0.01 if b != "base" else 0.0) for i, t in enumerate(tasks)}
        for b in bases
    }
    for run in runs:
        ref = run if run in bases else ref_of[run.rsplit("-s", 1)[0]]
        for task, role in tasks.items():
            n_problems, n = 30, 4
            j0 = base_j[ref][task]
            j = j0 if run in bases or flat else float(np.clip(j0 + rng.normal(0.03, 0.03), 0, 1))
            counts = [int(c) for c in rng.binomial(n, j, n_problems)]
            summary = {
                "run": run,
                "task": task,
                "kind": "integer",
                "role": role,
                "dtype": "bfloat16" if "bf16" in run else "float32",
                **({} if run in bases else {"reference_run": ref}),
                "N": n_problems,
                "n": n,
                "pass_at_1": j,
                "pass_at_1_se": 0.05,
                "pass_at_k": {"1": {"mean": j, "se": 0.05}},
                "eval_noise_var": stats.sampling_noise_var(counts, n),
                "counts": {
                    "samples": n_problems * n,
                    "correct": sum(counts),
                    "ok": 100,
                    "no_answer": 12,
                    "timeout": 0,
                    "error": 0,
                    "truncated": 6,
                },
                "mean_length": 3.5,
                "problem_ids": [f"p{i}" for i in range(n_problems)],
                "correct_counts": counts,
                "dJ": None if run in bases else j - j0,
                "dJ_se": None if run in bases else 0.02,
                "base_pass_at_1": None if run in bases else j0,
                "paired_N": None if run in bases else n_problems,
            }
            path = root / "eval" / run / f"{task}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary))
            paths["evals"].append(path)
            if kl:
                k3 = 0.0 if run in bases or flat else abs(rng.normal(0.02, 0.01))
                kl_summary = {
                    "run": run,
                    "task": task,
                    "k1_mean": k3 * 1.1,
                    "k1_se": 0.002,
                    "k3_mean": k3,
                    "k3_se": 0.001,
                    "k1_mc_var": 3e-6,
                    "k3_mc_var": 4e-7,
                    "rb_mean": k3 * 1.05,
                    "rb_se": 0.0008,
                    "rb_mc_var": 1e-7,
                    "per_prompt_rb": [k3 * 1.05],
                    "n_prompts": 8,
                    "n_samples": 2,
                    "prompt_ids": ["p0"],
                    "per_prompt_k1": [k3],
                    "per_prompt_k3": [k3],
                }
                kl_path = root / "eval" / run / f"{task}.kl.json"
                kl_path.write_text(json.dumps(kl_summary))
                paths["kls"].append(kl_path)
    for p in precisions:
        for s in seeds:
            out = root / "train" / p / f"seed{s}"
            out.mkdir(parents=True, exist_ok=True)
            lines = []
            for step in range(1, steps + 1):
                fresh = step % 2 == 1
                kl_now = step % 5 == 0 or step == steps
                lines.append(
                    {
                        "step": step,
                        "generation_step": fresh,
                        "reward": 0.0 if flat else 0.2 + 0.01 * step,
                        "reward_std": 0.0 if flat else 0.1,
                        "accuracy": 0.0 if flat else 0.2 + 0.01 * step,
                        "overlong_reward": None,
                        "informative_frac": 0.0 if flat else 0.5,
                        "completion_length": 3.0,
                        "truncation_rate": 0.0,
                        "clip_low": 0.001,
                        "clip_high": 0.002,
                        "clip_region": 0.0 if flat else 0.003 + rng.normal(0, 1e-4),
                        "entropy": 2.0 - 0.01 * step,
                        "grad_norm": 1.0,
                        "learning_rate": 3e-5,
                        "loss": 0.0,
                        "step_time_s": 0.1,
                        "wall_time_s": 0.1 * step,
                        "epoch": step / 10,
                        "kl_k1": 1e-3 * step if kl_now else None,
                        "kl_k1_se": 1e-4 if kl_now else None,
                        "kl_k3": 1e-3 * step if kl_now else None,
                        "kl_k3_se": 1e-4 if kl_now else None,
                    }
                )
            (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            record = {"precision": p, "seed": s, "steps": steps, "train_wall_s": 0.1 * steps + 1}
            if health:
                bad = f"{p}-s{s}" in diverged
                record["health"] = {"diverged": bad, "reasons": ["entropy collapsed"] if bad else []}
                record["representable_update"] = {
                    "lr": 3e-5,
                    "param_dtype": "bfloat16" if p == "bf16" else "float32",
                    "whole_model": 0.25 if p == "bf16" else 1.0,
                    "by_module_type": {m: (0.2 if p == "bf16" else 1.0) for m in MODULES},
                }
            (out / "run.json").write_text(json.dumps(record))
            paths["train"].append((out / "metrics.jsonl", out / "run.json"))
            numel = 3000
            summary = {
                "etas": list(ETAS),
                "eta_labels": [_eta_label(e) for e in ETAS],
                "model": _sparsity_agg(rng, numel, p == "bf16", flat),
                "by_module": {m: _sparsity_agg(rng, 1000, p == "bf16", flat) for m in MODULES},
                "by_layer": {
                    "-1": _sparsity_agg(rng, 1000, p == "bf16", flat),
                    "0": _sparsity_agg(rng, 2000, p == "bf16", flat),
                },
                "precision": p,
                "seed": s,
            }
            sp = root / "sparsity" / p / f"seed{s}.summary.json"
            sp.parent.mkdir(parents=True, exist_ok=True)
            sp.write_text(json.dumps(summary))
            paths["sparsity"].append(sp)
        rows = [
            {
                "precision": p,
                "seed_a": a,
                "seed_b": b,
                "eta": e,
                "numel": 3000,
                "intersection": 100,
                "union": 900,
                "jaccard": 0.11 + (0.2 if p == "bf16" else 0.0),
                "density_a": 0.2,
                "density_b": 0.2,
                "jaccard_chance": 0.11,
                "ratio": 1.0 + (1.8 if p == "bf16" else 0.0),
            }
            for a in seeds
            for b in seeds
            if a < b
            for e in ETAS
        ]
        if flat:  # no weight changed: empty union, so Jaccard and its ratio are undefined (overlap.py: NaN)
            nan = float("nan")
            zero = {"intersection": 0, "union": 0, "jaccard": nan, "density_a": 0.0, "density_b": 0.0}
            rows = [{**r, **zero, "jaccard_chance": nan, "ratio": nan} for r in rows]
        ov = root / "sparsity" / p / "overlap.parquet"
        pd.DataFrame(rows).to_parquet(ov)
        paths["overlap"].append(ov)
    return paths


def run_aggregate(paths: dict, roles: dict | None = None, precisions=("fp32", "bf16")):
    return aggregate.aggregate(
        paths["evals"],
        paths["kls"],
        paths["train"],
        paths["sparsity"],
        roles or TASKS,
        precisions,
        paths.get("overlap", ()),
    )


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> dict:
    return write_fake_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def tables(fake):
    return run_aggregate(fake)


# ----------------------------------------------------------------------------- the join


def test_one_row_per_run_and_task_with_the_documented_columns(tables):
    metrics, _, _, warnings, _ = tables
    assert len(metrics) == 8 * 3
    assert not metrics.duplicated(["run", "task"]).any()
    changed = [f"changed_frac_eta_{_eta_label(e)}" for e in ETAS]
    assert list(metrics.columns) == aggregate.METRIC_COLUMNS + changed
    assert warnings == []
    # ordering: base first, then the reference arm, seeds ascending, tasks in config order
    assert metrics["run"].iloc[0] == "base"
    assert list(metrics["run"].drop_duplicates()) == ["base", "base-bfloat16"] + [
        f"{p}-s{s}" for p in ("fp32", "bf16") for s in (1, 2, 3)
    ]
    assert list(metrics["task"].iloc[:3]) == list(TASKS)


def test_values_come_from_the_right_files(fake, tables):
    metrics = tables[0].set_index(["run", "task"])
    ev = json.loads((fake["evals"][0].parents[1] / "bf16-s2" / "mul.json").read_text())
    kl = json.loads((fake["evals"][0].parents[1] / "bf16-s2" / "mul.kl.json").read_text())
    row = metrics.loc[("bf16-s2", "mul")]
    assert row["precision"] == "bf16" and row["seed"] == 2 and row["role"] == "off_task"
    assert row["J"] == pytest.approx(ev["pass_at_1"])
    assert row["dJ"] == pytest.approx(ev["dJ"])
    assert row["eval_noise_var"] == pytest.approx(ev["eval_noise_var"])
    assert row["n_problems"] == 30 and row["n_samples"] == 4
    assert row["no_answer_frac"] == pytest.approx(12 / 120)
    assert row["truncated_frac"] == pytest.approx(6 / 120)
    assert row["kl_k3"] == pytest.approx(kl["k3_mean"]) and row["kl_k1_se"] == pytest.approx(0.002)
    assert row["kl_k3_mc_var"] == pytest.approx(4e-7) and row["kl_k1_mc_var"] == pytest.approx(3e-6)
    summary = json.loads((fake["sparsity"][0].parents[1] / "bf16" / "seed2.summary.json").read_text())
    assert row["changed_frac_eta_1e-04"] == pytest.approx(summary["model"]["changed_fraction"]["1e-04"])
    assert row["equal_bf16_frac"] == pytest.approx(0.8)
    assert row["train_steps"] == 20 and row["train_wall_s"] == pytest.approx(3.0)


def test_base_row_is_kept_with_null_identity_and_zero_dJ(tables):
    metrics = tables[0]
    base = metrics[metrics["run"].isin(["base", "base-bfloat16"])]
    assert len(base) == 6
    assert base["precision"].isna().all() and base["seed"].isna().all()
    assert (base["dJ"] == 0).all()
    assert (base["J"] == base["base_J"]).all()
    assert base["train_steps"].isna().all() and base["equal_bf16_frac"].isna().all()
    assert str(metrics["seed"].dtype) == "Int64"


def test_training_summaries_use_generation_steps_and_windows():
    steps = [
        {
            "step": i,
            "generation_step": i % 2 == 1,
            "reward": float(i),
            "clip_region": 0.1 * (i > 18),
            "informative_frac": 0.5,
            "entropy": 1.0,
            "kl_k3": 0.5 if i == 20 else None,
            "kl_k1": 0.6 if i == 20 else None,
            "reward_std": 0.1,
        }
        for i in range(1, 21)
    ]
    s = aggregate.train_summary(steps, {"steps": 20})
    # generation steps 1, 3, ..., 19: 10 rollouts, windows of 1
    assert s["train_rollouts"] == 10
    assert s["reward_first10"] == 1.0 and s["reward_last10"] == 19.0 and s["reward_gain"] == 18.0
    assert s["clip_region_last10"] == pytest.approx(0.1)  # steps 19, 20
    assert s["train_kl_k3_final"] == 0.5
    assert math.isnan(s["train_wall_s"])  # neither run.json nor wall_time_s say it
    assert math.isnan(s["accuracy_first10"])


def test_training_curves_table(tables):
    curves = tables[1]
    assert list(curves.columns) == aggregate.CURVE_COLUMNS
    assert len(curves) == 6 * 20
    one = curves[curves["run"] == "bf16-s3"]
    assert list(one["step"]) == list(range(1, 21))
    assert one["kl_k3"].notna().sum() == 4
    assert one["generation_step"].dtype == bool


def test_sparsity_table_has_every_scope_and_eta(tables):
    sp = tables[2]
    assert list(sp.columns) == aggregate.SPARSITY_TABLE_COLUMNS
    one = sp[sp["run"] == "fp32-s1"]
    assert set(one["scope"]) == {"model", "module", "layer", "representable"}
    assert len(one) == (1 + len(MODULES) + 2) * len(ETAS) + len(MODULES)
    assert sorted(one.loc[one["scope"] == "module", "group"].unique()) == sorted(MODULES)


def test_stats_analyze_accepts_the_table(tables):
    metrics = tables[0]
    out = stats.analyze(
        metrics,
        {"bootstrap": 100, "power_simulations": 10, "max_seeds": 8},
        precisions=["fp32", "bf16"],
    )
    assert out["n"]["rows"] == 6 * 3  # base rows ignored
    assert out["eval_noise_source"] == "column"
    assert set(out["verdicts"]) == {"H1", "H2", "H3"}
    assert out["by_task_type"]["off_task"]["tasks"] == ["mcq", "mul"]


# ----------------------------------------------------------------------------- roles, gaps, errors


def test_roles_come_from_the_config_not_the_eval_file(fake):
    roles = {**TASKS, "mcq": "on_task"}
    metrics = run_aggregate(fake, roles=roles)[0]
    assert set(metrics.loc[metrics["task"] == "mcq", "role"]) == {"on_task"}
    with pytest.raises(AggregateError, match=r"\['mcq'\].*no role"):
        run_aggregate(fake, roles={"add_sub": "on_task", "mul": "off_task"})


def test_missing_kl_and_null_fields_become_nan_with_a_warning(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1, 2), kl=True)
    paths["kls"] = [p for p in paths["kls"] if "bf16-s1" not in str(p)]
    target = tmp_path / "eval" / "fp32-s2" / "mcq.json"
    d = json.loads(target.read_text())
    d.update(pass_at_1_se=None, dJ_se=None, eval_noise_var=None)
    target.write_text(json.dumps(d))
    one_sample = tmp_path / "eval" / "fp32-s2" / "mcq.kl.json"  # kl_samples 1: null mc vars
    kl = json.loads(one_sample.read_text())
    one_sample.write_text(json.dumps({**kl, "k3_mc_var": None, "k1_mc_var": None}))
    paths["sparsity"] = paths["sparsity"][:-1]  # bf16-s2 has no sparsity summary
    metrics, _, _, warnings, _ = run_aggregate(paths)
    row = metrics.set_index(["run", "task"]).loc[("fp32-s2", "mcq")]
    assert math.isnan(row["J_se"]) and math.isnan(row["dJ_se"]) and math.isnan(row["eval_noise_var"])
    assert math.isnan(row["kl_k3_mc_var"]) and math.isnan(row["kl_k1_mc_var"]) and row["kl_k3_se"] == 0.001
    assert metrics.loc[metrics["run"] == "bf16-s1", "kl_k3"].isna().all()
    assert metrics.loc[metrics["run"] == "fp32-s1", "kl_k3"].notna().all()
    assert metrics.loc[metrics["run"] == "bf16-s2", "equal_bf16_frac"].isna().all()
    assert any("KL (k3) missing for 3" in w for w in warnings)
    assert any("sparsity summaries missing" in w and "bf16-s2" in w for w in warnings)


def test_no_kl_files_at_all_gives_null_kl_columns(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1,), kl=False)
    metrics = run_aggregate(paths)[0]
    assert metrics["kl_k3"].isna().all()


def test_malformed_json_names_the_file(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1,))
    bad = paths["evals"][4]
    bad.write_text('{"run": "fp32-s1", "task": ')
    with pytest.raises(AggregateError, match=re.escape(str(bad)) + r": not valid JSON"):
        run_aggregate(paths)
    bad.write_text(json.dumps({"run": "fp32-s1", "task": "mul", "N": 3}))
    with pytest.raises(
        AggregateError, match=re.escape(str(bad)) + r": missing key\(s\) \['pass_at_1', 'n'\]"
    ):
        run_aggregate(paths)
    bad.write_text("[1, 2]")
    with pytest.raises(AggregateError, match=re.escape(str(bad)) + r": expected a JSON object"):
        run_aggregate(paths)


def test_malformed_metrics_line_names_file_and_line(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1,))
    metrics_path = paths["train"][0][0]
    lines = metrics_path.read_text().splitlines()
    lines[2] = lines[2][:-5]
    metrics_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AggregateError, match=re.escape(str(metrics_path)) + r":3: not a JSON line"):
        run_aggregate(paths)


def test_duplicate_run_task_and_bad_run_name_raise(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1,))
    copy = tmp_path / "copy.json"
    copy.write_text(paths["evals"][0].read_text())
    with pytest.raises(AggregateError, match="duplicate run x task"):
        aggregate.aggregate([*paths["evals"], copy], [], [], [], TASKS)
    d = json.loads(copy.read_text())
    d["run"] = "weird"
    copy.write_text(json.dumps(d))
    with pytest.raises(AggregateError, match=re.escape(str(copy)) + r": not a run name: 'weird'"):
        aggregate.aggregate([copy], [], [], [], TASKS)


# ----------------------------------------------------------------------------- CLI


def test_cli_writes_the_four_tables(fake, tmp_path):
    out = tmp_path / "analysis"
    argv = [
        "--eval",
        *map(str, fake["evals"]),
        "--kl",
        *map(str, fake["kls"]),
        "--train-metrics",
        *(str(m) for m, _ in fake["train"]),
        "--train-runs",
        *(str(r) for _, r in fake["train"]),
        "--sparsity",
        *map(str, fake["sparsity"]),
        "--overlap",
        *map(str, fake["overlap"]),
        "--roles",
        *(f"{t}={r}" for t, r in TASKS.items()),
        "--precisions",
        "fp32",
        "bf16",
        "--out",
        str(out / "metrics.parquet"),
        "--curves",
        str(out / "curves.parquet"),
        "--sparsity-out",
        str(out / "sparsity.parquet"),
        "--overlap-out",
        str(out / "overlap.parquet"),
    ]
    assert aggregate.main(argv) == 0
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == 24 and str(metrics["seed"].dtype) == "Int64"
    assert len(pd.read_parquet(out / "overlap.parquet")) == 2 * 3 * len(ETAS)
    assert metrics.loc[metrics["run"] == "base", "precision"].isna().all()
    assert len(pd.read_parquet(out / "curves.parquet")) == 120
    assert len(pd.read_parquet(out / "sparsity.parquet")) > 0
    with pytest.raises(SystemExit):
        aggregate.main(
            [*argv[:2], "--roles", "add_sub", "--out", "x", "--curves", "y", "--sparsity-out", "z"]
        )


# ----------------------------------------------------------------------------- per-arm base, health, overlap


def test_each_run_is_paired_with_the_base_of_its_arms_dtype(tables):
    metrics = tables[0].set_index(["run", "task"])
    assert metrics.loc[("bf16-s1", "mul"), "reference_run"] == "base-bfloat16"
    assert metrics.loc[("fp32-s1", "mul"), "reference_run"] == "base"
    assert metrics.loc[("bf16-s1", "mul"), "base_J"] == pytest.approx(
        metrics.loc[("base-bfloat16", "mul"), "J"]
    )
    assert metrics.loc[("base-bfloat16", "mul"), "reference_run"] == "base-bfloat16"


def test_health_and_representable_update_are_carried_per_run(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1, 2), diverged=("bf16-s2",))
    metrics, _, sparsity, warnings, _ = run_aggregate(paths)
    runs = metrics.drop_duplicates("run").set_index("run")
    assert bool(runs.loc["bf16-s2", "diverged"]) and not bool(runs.loc["fp32-s1", "diverged"])
    assert runs.loc["bf16-s2", "health_reasons"] == "entropy collapsed"
    assert runs.loc["bf16-s1", "representable_update_frac"] == 0.25
    assert runs.loc["fp32-s1", "representable_update_lr"] == 3e-5
    rep = sparsity[sparsity["scope"] == "representable"]
    assert (
        set(rep["group"]) == set(MODULES)
        and (rep.loc[rep["precision"] == "bf16", "representable_fraction"] == 0.2).all()
    )
    assert any("diverged" in w and "bf16-s2" in w for w in warnings)


def test_results_without_health_or_representable_records_still_aggregate_with_a_warning(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1,), health=False)
    metrics, _, _, warnings, _ = run_aggregate(paths)
    trained = metrics[metrics["precision"].notna()]
    assert trained["diverged"].isna().all() and trained["representable_update_frac"].isna().all()
    assert any("no 'health' record" in w for w in warnings)
    assert any("no 'representable_update'" in w for w in warnings)


def test_overlap_tables_of_every_precision_are_concatenated(tables):
    overlap = tables[4]
    assert set(overlap["precision"]) == {"fp32", "bf16"}
    assert len(overlap) == 2 * 3 * len(ETAS)


def test_the_aggregate_stage_imports_neither_torch_nor_transformers():
    """It only reads JSON and parquet: torch + transformers would add seconds to every aggregate job."""
    import subprocess
    import sys

    code = (
        "import sys, workflow_scripts.aggregate, workflow_scripts.training.metrics_log as m; "
        "assert m.read_metrics and m.rollout_rows and m.reward_summary; "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'torch', 'transformers', 'trl'}))"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- gap, loss scale, repeats


def test_sampler_gap_and_loss_scale_summaries_count_each_round_once():
    steps = [
        {
            "step": i,
            "generation_step": i in (1, 3),
            **{"reward": 0.5, "reward_std": 0.1, "clip_region": 0.0},
            "sampler_gap_mean": {1: 0.5, 2: 0.5, 3: 0.1, 4: 0.1}[i],  # carried forward on steps 2 and 4
            "sampler_gap_max": {1: 4.0, 2: 4.0, 3: 1.0, 4: 1.0}[i],
            "sampler_gap_outside_clip": {1: 0.3, 2: 0.3, 3: 0.1, 4: 0.1}[i],
            "sampler_gap_clipped": {1: 0.2, 2: 0.2, 3: 0.0, 4: 0.0}[i],
            "loss_scale": {1: 65536.0, 2: 32768.0, 3: 32768.0, 4: 32768.0}[i],
            "step_skipped": i == 2,
        }
        for i in range(1, 5)
    ]
    s = aggregate.train_summary(steps, {"steps": 4})
    assert s["sampler_gap_mean"] == pytest.approx(0.3) and s["sampler_gap_max"] == 4.0
    assert s["sampler_gap_outside_clip"] == pytest.approx(0.2)
    assert s["sampler_gap_clipped"] == pytest.approx(0.1)
    assert s["loss_scale_final"] == 32768.0 and s["skipped_steps"] == 1
    assert math.isnan(s["vllm_logp_diff_mean"])  # no vLLM: not measured
    bare_step = {"step": 1, "generation_step": True, "reward": 0.5, "reward_std": 0.1, "clip_region": 0.0}
    bare = aggregate.train_summary([bare_step], {"steps": 1})
    assert math.isnan(bare["sampler_gap_mean"]) and math.isnan(bare["loss_scale_final"])


def _add_repeat(paths: dict, root: Path, run: str, repeat: int, shift: float = 0.0) -> str:
    """A repeat of ``run`` as the train and evaluate stages would write it: the same values, or with
    ``shift`` added to pass@1, dJ, KL k3 and the training reward (what GPU numerics could change)."""
    precision, seed = run.rsplit("-s", 1)
    name = f"{run}-r{repeat}"
    for kind in ("evals", "kls"):
        for path in [p for p in paths[kind] if p.parent.name == run]:
            d = json.loads(path.read_text())
            d["run"] = name
            for key in ("pass_at_1", "dJ", "k3_mean"):
                if d.get(key) is not None:
                    d[key] += shift
            target = root / "eval" / name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(d))
            paths[kind].append(target)
    metrics, record = next(pair for pair in paths["train"] if pair[0].parent.name == f"seed{seed}"
                           and pair[0].parent.parent.name == precision)  # fmt: skip
    out = root / "train" / precision / f"seed{seed}-r{repeat}"
    out.mkdir(parents=True)
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    shifted = [{**r, "reward": r["reward"] + shift} for r in steps]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shifted))
    (out / "run.json").write_text(json.dumps({**json.loads(record.read_text()), "repeat": repeat}))
    paths["train"].append((out / "metrics.jsonl", out / "run.json"))
    return name


def test_a_repeat_run_gets_its_own_rows_with_its_repeat_and_needs_no_sparsity(tmp_path):
    paths = write_fake_results(tmp_path, seeds=(1, 2))
    name = _add_repeat(paths, tmp_path, "bf16-s1", 2)
    metrics, curves, _, warnings, _ = run_aggregate(paths)
    runs = metrics.drop_duplicates("run").set_index("run")
    assert runs.loc[name, ["precision", "seed", "repeat"]].tolist() == ["bf16", 1, 2]
    assert runs.loc["bf16-s1", "repeat"] == 1 and pd.isna(runs.loc["base", "repeat"])
    assert runs.loc[name, "train_steps"] == runs.loc["bf16-s1", "train_steps"]
    assert set(curves["run"]) >= {name, "bf16-s1"}
    assert not any("missing" in w and name in w for w in warnings), warnings
    out = stats.analyze(metrics, {"bootstrap": 50, "power_simulations": 5, "max_seeds": 8},
                        precisions=["fp32", "bf16"])  # fmt: skip
    assert out["n"]["seeds"] == {"fp32": 2, "bf16": 2}  # the repeat is not a third bf16 seed
    floor = out["noise_floor"]
    assert floor["status"] == "ok" and floor["pairs"]["bf16-s1"]["runs"] == ["bf16-s1", name]
    assert floor["pairs"]["bf16-s1"]["identical"] is True
    assert floor["arms"]["bf16"]["dJ"]["by_role"]["on_task"] == {"var": 0.0, "df": 1}
