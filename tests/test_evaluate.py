"""Evaluation: pass@k estimators, batched generation, scoring adversarial outputs, backends, the rules."""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from workflow_scripts.evaluate import derive_seed, generate, kl_prompt_indices
from workflow_scripts.evaluate import run as evaluate
from workflow_scripts.measures import passk
from workflow_scripts.measures.eval_summary import SAMPLE_COLUMNS, score, summarize
from workflow_scripts.models.generation import (
    NEUTRAL_GENERATION,
    Completion,
    bounded_batch_size,
    decode,
    generation_bytes_per_sequence,
    left_padded,
    sample_completions,
    sampling_warpers,
    stop_token_ids,
)
from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
from workflow_scripts.tasks.rows import make_row, write_rows

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": 64, "seed": 0}  # fmt: skip
EVAL_CFG = {"n_samples": 3, "temperature": 0.7, "top_p": 0.8, "batch_size": 256, "backend": "hf", "seed": 0,
            "verify_timeout": 1.5, "code_timeout": 1.5, "kl_prompts": 4, "kl_samples": 2,
            "memory_budget_gb": None}  # fmt: skip
PROMPTS = ["1+2=", "33+44=", "5-1=", "12+7=", "100-1="]


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), TINY, tok).eval()
    return model, tok


def _save(model, tok, path: Path, dtype=torch.float32) -> Path:
    copy.deepcopy(model).to(dtype).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _samples(counts: dict[str, int], n: int, order: list[str] | None = None) -> pd.DataFrame:
    """A samples table with counts[pid] of n samples correct per problem."""
    rows = []
    for idx, pid in enumerate(order or list(counts)):
        for s in range(n):
            rows.append({"run": "r", "task": "t", "prompt_id": pid, "prompt_index": idx, "sample_index": s,
                         "completion": "", "extracted": None, "correct": s < counts[pid], "status": "ok",
                         "length": 1, "truncated": False})  # fmt: skip
    return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))


# ------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_matches_closed_form():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert passk.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_subset_enumeration():
    """pass@k = the fraction of k-subsets of the n samples with at least one correct sample."""
    for n in range(1, 7):
        for correct in itertools.product([False, True], repeat=n):
            c = sum(correct)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(correct, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert passk.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    n, c, k = 2000, 3, 512
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # exact big-integer arithmetic
    assert passk.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-10)
    assert passk.pass_at_k(n, 0, k) == 0.0 and passk.pass_at_k(n, n - k + 1, k) == 1.0
    with pytest.raises(ValueError):
        passk.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        passk.pass_at_k(4, 1, 5)


def test_k_values_are_powers_of_two_and_n():
    assert passk.k_values(1) == [1]
    assert passk.k_values(6) == [1, 2, 4, 6]
    assert passk.k_values(8) == [1, 2, 4, 8]


def test_summary_pass_at_1_and_standard_error():
    counts = {"a": 0, "b": 1, "c": 3, "d": 4, "e": 2}
    summary = summarize(_samples(counts, 4), 4)
    p = np.array(list(counts.values())) / 4
    assert summary["N"] == 5 and summary["n"] == 4
    assert summary["pass_at_1"] == pytest.approx(p.mean())
    assert summary["pass_at_1_se"] == pytest.approx(p.std(ddof=1) / math.sqrt(5))
    assert summary["pass_at_k"]["1"]["mean"] == pytest.approx(p.mean())
    assert set(summary["pass_at_k"]) == {"1", "2", "4"}
    assert summary["pass_at_k"]["4"]["mean"] == pytest.approx(0.8)  # every problem with any success
    assert summary["problem_ids"] == list(counts) and summary["correct_counts"] == list(counts.values())
    assert summary["eval_noise_var"] == pytest.approx(np.mean(p * (1 - p) / 3) / 5)
    assert summary["dJ"] is None and summary["dJ_se"] is None


def test_eval_noise_variance_is_unbiased():
    """E[eval_noise_var] = Var(pass@1 | problems) under binomial sampling (Monte Carlo)."""
    rng = np.random.default_rng(0)
    p_true = rng.uniform(0, 1, size=30)
    n, sims = 4, 40_000
    c = rng.binomial(n, p_true, size=(sims, len(p_true)))
    pass1 = (c / n).mean(axis=1)
    true_var = float(np.mean(p_true * (1 - p_true) / n) / len(p_true))
    phat = c / n
    estimates = (phat * (1 - phat) / (n - 1)).mean(axis=1) / len(p_true)
    assert estimates.mean() == pytest.approx(true_var, rel=0.01)
    assert pass1.var() == pytest.approx(true_var, rel=0.03)
    assert passk.eval_noise_variance(1, [0, 1]) is None


def test_paired_dj_pairs_by_problem_id():
    run = {"a": 4, "b": 2, "c": 0, "d": 3}
    base = {"a": 2, "b": 2, "c": 1, "d": 0}
    base_table = _samples(base, 4, order=["d", "c", "b", "a"])  # another order: pairing is by id
    summary = summarize(_samples(run, 4), 4, base_table)
    d = np.array([run[k] - base[k] for k in run]) / 4
    assert summary["dJ"] == pytest.approx(d.mean())
    assert summary["dJ_se"] == pytest.approx(d.std(ddof=1) / 2)
    assert summary["base_pass_at_1"] == pytest.approx(np.mean(list(base.values())) / 4)
    assert summary["paired_N"] == 4
    with pytest.raises(ValueError, match="other problems"):
        summarize(_samples(run, 4), 4, _samples({"a": 1, "b": 1, "c": 1, "x": 1}, 4))


def test_summary_rejects_wrong_sample_count():
    with pytest.raises(ValueError, match="expected 3 samples"):
        summarize(_samples({"a": 1}, 2), 3)


# --------------------------------------------------------------------------------------- generation


def test_batched_greedy_equals_per_prompt_generation(tiny):
    """Left padding + position ids: a mixed-length batch decodes exactly like each prompt alone."""
    model, tok = tiny
    batched = sample_completions(model, tok, PROMPTS, max_new_tokens=5)
    single = [sample_completions(model, tok, [p], max_new_tokens=5)[0] for p in PROMPTS]
    assert [c.token_ids for c in batched] == [c.token_ids for c in single]
    tiny_budget = sample_completions(model, tok, PROMPTS, max_new_tokens=5, memory_budget_gb=1e-12)
    assert [c.token_ids for c in tiny_budget] == [c.token_ids for c in single]


def test_sampling_is_prompt_major_reproducible_and_leaves_global_rng(tiny):
    model, tok = tiny
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = sample_completions(model, tok, PROMPTS, n_samples=3, temperature=1.0, max_new_tokens=6, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    b = sample_completions(model, tok, PROMPTS, n_samples=3, temperature=1.0, max_new_tokens=6, seed=5)
    c = sample_completions(model, tok, PROMPTS, n_samples=3, temperature=1.0, max_new_tokens=6, seed=6)
    assert a == b and a != c
    assert [(x.prompt_index, x.sample_index) for x in a] == [(i, s) for i in range(5) for s in range(3)]
    for x in a:
        assert x.num_tokens == len(x.token_ids) + (x.stop_token_id is not None)
        assert x.truncated == (x.stop_token_id is None) and x.num_tokens <= 6


def test_a_shared_prefill_draws_what_prefilling_every_sample_draws(tiny):
    """A prompt's samples decoded together (one prefill, one model row per distinct prefix): the same
    logits, so with the same seed and batches the same draws (greedy identical; sampled: at most a rare
    flip from rounding)."""
    model, tok = tiny
    for temperature in (0.0, 1.0):
        kw = {"n_samples": 4, "temperature": temperature, "max_new_tokens": 6, "seed": 3, "batch_size": 8}
        shared = sample_completions(model, tok, PROMPTS, **kw)
        alone = sample_completions(model, tok, PROMPTS, share_prefill=False, **kw)
        assert [(c.prompt_index, c.sample_index) for c in shared] == [
            (c.prompt_index, c.sample_index) for c in alone
        ]
        same = sum(a.token_ids == b.token_ids for a, b in zip(shared, alone, strict=True))
        assert same == len(alone) if temperature == 0 else same >= 0.9 * len(alone)
        if temperature:
            assert len({c.token_ids for c in shared}) > len(PROMPTS)  # real samples, not one per prompt


def test_the_decoding_loop_is_generates_sampling_step_and_ends_rows_at_their_stop(tiny):
    """Greedy: the same tokens as ``generate``. Sampled: for one step, the same draws as ``generate``
    with the same seed (same warpers, same multinomial); longer, a row keeps its tokens up to its end
    token and only pads after it, while other rows go on."""
    model, tok = tiny
    stops, pad = stop_token_ids(model, tok), tok.pad_token_id
    ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"][-3:] for p in PROMPTS])
    mask = torch.ones_like(ids)
    kw = {**NEUTRAL_GENERATION, "pad_token_id": pad, "eos_token_id": stops, "attention_mask": mask}
    greedy = model.generate(ids, do_sample=False, max_new_tokens=6, **kw)[:, ids.shape[1] :]
    ours = decode(model, ids, mask, 6, None, stops, pad)
    for theirs, mine in zip(greedy.tolist(), ours.tolist(), strict=True):
        end = next((j for j, t in enumerate(theirs) if t in stops), len(theirs) - 1)
        assert mine[: end + 1] == theirs[: end + 1]
    rows = ids.repeat_interleave(40, 0)
    torch.manual_seed(7)
    theirs = model.generate(rows, do_sample=True, temperature=0.7, top_p=0.8, max_new_tokens=1,
                            **{**kw, "attention_mask": torch.ones_like(rows)})[:, -1]  # fmt: skip
    torch.manual_seed(7)
    mine = decode(model, ids, mask, 1, sampling_warpers(0.7, 0.8), stops, pad, repeat=40)[:, 0]
    assert torch.equal(mine, theirs) and len(set(mine.tolist())) > 1
    torch.manual_seed(1)
    long = decode(model, ids, mask, 6, sampling_warpers(1.0, 1.0), stops, pad, repeat=40).tolist()
    ended = [next((j for j, t in enumerate(row) if t in stops), None) for row in long]
    assert any(e is not None and e < 5 for e in ended) and any(e is None or e == 5 for e in ended)
    for row, end in zip(long, ended, strict=True):
        if end is not None:
            assert set(row[end + 1 :]) <= {pad}


def padded_prompts(tok) -> tuple[torch.Tensor, torch.Tensor]:
    """PROMPTS as one left-padded batch (ids, attention mask), as sample_completions builds it."""
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return left_padded(prompts, max(map(len, prompts)), tok.pad_token_id, "cpu")


def test_decoding_in_place_draws_what_concatenating_the_cache_draws(tiny):
    """GrowingLayer (a token written into a buffer) against transformers' DynamicLayer (the cache
    concatenated every step): the same keys and values, so the same tokens, greedy and sampled, with
    repeated prompts and rows dropped as they end."""
    model, tok = tiny
    stops, pad = stop_token_ids(model, tok), tok.pad_token_id
    ids, mask = padded_prompts(tok)
    for warpers in (None, sampling_warpers(1.0, 0.9)):
        out = {}
        for grow in (True, False):
            torch.manual_seed(3)
            out[grow] = decode(model, ids, mask, 6, warpers, stops, pad, repeat=7, grow=grow)
        assert torch.equal(out[True], out[False])
    assert len({tuple(r) for r in out[True].tolist()}) > len(PROMPTS)  # sampled rows differ


def test_one_state_per_distinct_prefix_draws_what_one_state_per_row_draws(tiny):
    """Rows that share a prompt and their tokens so far run the model once (a state): the same tokens,
    greedy and sampled, as running every row (the prompt cache copied to each), with far fewer rows
    through the model; rows end at different steps."""
    model, tok = tiny
    stops, pad = stop_token_ids(model, tok), tok.pad_token_id
    ids, mask = padded_prompts(tok)
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(len(kw["input_ids"])), with_kwargs=True
    )
    try:
        for warpers in (None, sampling_warpers(0.7, 0.8), sampling_warpers(1.0, 1.0)):
            out, rows = {}, {}
            for merge in (True, False):
                seen.clear()
                torch.manual_seed(3)
                out[merge] = decode(model, ids, mask, 6, warpers, stops, pad, repeat=40, merge=merge)
                rows[merge] = sum(seen)
            assert torch.equal(out[True], out[False])
            assert rows[True] <= rows[False]
            if warpers is None:  # greedy: one state per prompt at every step
                assert rows[True] <= 6 * len(PROMPTS) < 40 * len(PROMPTS) <= rows[False]
    finally:
        hook.remove()
    ended = {next((j for j, t in enumerate(r) if t in stops), 6) for r in out[True].tolist()}
    assert len(ended) > 1 and len({tuple(r) for r in out[True].tolist()}) > 3 * len(PROMPTS)


def test_saved_generation_defaults_do_not_change_sampling(tiny):
    """A model's generation_config (top_k, repetition penalty, ...) must not leak into the sampler."""
    model, tok = tiny
    clean = sample_completions(model, tok, PROMPTS, n_samples=2, temperature=1.0, max_new_tokens=6, seed=1)
    dirty = copy.deepcopy(model)
    dirty.generation_config.top_k = 1
    dirty.generation_config.repetition_penalty = 5.0
    dirty.generation_config.min_new_tokens = 6
    dirty.generation_config.no_repeat_ngram_size = 1
    again = sample_completions(dirty, tok, PROMPTS, n_samples=2, temperature=1.0, max_new_tokens=6, seed=1)
    assert [c.token_ids for c in again] == [c.token_ids for c in clean]


def test_generation_stops_at_any_configured_end_token(tiny):
    model, tok = tiny
    free = sample_completions(model, tok, PROMPTS, n_samples=4, temperature=1.0, max_new_tokens=6, seed=2)
    first = next(c.token_ids[0] for c in free if c.token_ids)
    stopper = copy.deepcopy(model)
    stopper.generation_config.eos_token_id = [tok.eos_token_id, first]
    out = sample_completions(stopper, tok, PROMPTS, n_samples=4, temperature=1.0, max_new_tokens=6, seed=2)
    assert any(c.stop_token_id == first for c in out)
    assert all(first not in c.token_ids for c in out)


def test_memory_bound_caps_batch_size(tiny):
    model, _ = tiny
    per_seq = generation_bytes_per_sequence(model, prompt_tokens=100, new_tokens=50)
    assert per_seq > 0
    assert bounded_batch_size(256, per_seq, 10 * per_seq) == 10
    assert bounded_batch_size(256, per_seq, 0) == 1
    assert bounded_batch_size(4, per_seq, 10**15) == 4


# ------------------------------------------------------------------------------- adversarial scoring

ADD_META = {"entry_point": "add", "prompt": 'def add(a, b):\n    """Return a + b."""\n',
            "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}  # fmt: skip
HUGE_LATEX = "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}"


def test_score_and_summarize_survive_adversarial_outputs():
    code_rows = [make_row("c0", "code", "code", ADD_META["prompt"], "", ADD_META),
                 make_row("c1", "code", "code", ADD_META["prompt"], "", ADD_META)]  # fmt: skip
    code = [Completion(0, 0, "    return a + b\n", 5, False),
            Completion(0, 1, "    while True:\n        pass\n", 8, True),
            Completion(1, 0, "", 1, False),
            Completion(1, 1, "    return a - b\n", 5, False)]  # fmt: skip
    frame = score(code_rows, code, "code", EVAL_CFG, run="r", task="code")
    assert list(frame.columns) == list(SAMPLE_COLUMNS)
    assert frame["correct"].tolist() == [True, False, False, False]
    assert frame["status"].tolist() == ["ok", "timeout", "no_answer", "ok"]
    summary = summarize(frame, 2)
    assert summary["counts"] == {"samples": 4, "correct": 1, "ok": 2, "no_answer": 1, "timeout": 1,
                                 "error": 0, "truncated": 1}  # fmt: skip
    assert summary["correct_counts"] == [1, 0] and summary["pass_at_1"] == pytest.approx(0.25)

    math_rows = [make_row("m0", "math", "math", "half?", "\\frac{1}{2}")]
    texts = ["\\boxed{\\frac{1}{2}}", HUGE_LATEX, "no answer at all"]
    comps = [Completion(0, s, t, 4, False) for s, t in enumerate(texts)]
    frame = score(math_rows, comps, "math", EVAL_CFG)
    assert frame["correct"].tolist() == [True, False, False]
    assert frame["status"][1] in ("timeout", "error")
    summary = summarize(frame, 3)
    assert summary["counts"]["timeout"] + summary["counts"]["error"] >= 1
    assert summary["pass_at_1"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------ backends


def test_hf_path_never_imports_vllm(tiny, tmp_path, monkeypatch):
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise AssertionError('vllm was imported')\n")
    monkeypatch.syspath_prepend(str(fake.parent))
    monkeypatch.setitem(sys.modules, "vllm", None)  # recorded, so teardown drops the module imported here
    monkeypatch.delitem(sys.modules, "vllm")
    model, tok = tiny
    model_dir = _save(model, tok, tmp_path / "model")
    completions, info = generate(model_dir, PROMPTS, EVAL_CFG, max_new_tokens=4, seed=0)
    assert len(completions) == 15 and info["backend"] == "hf" and info["dtype"] == "float32"
    assert "vllm" not in sys.modules


def test_vllm_backend_without_vllm_names_the_config_key(tiny, tmp_path, monkeypatch):
    from workflow_scripts.models.vllm_backend import BackendError

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    model, tok = tiny
    model_dir = _save(model, tok, tmp_path / "model")
    with pytest.raises(BackendError, match=r"eval\.backend"):
        generate(model_dir, PROMPTS, {**EVAL_CFG, "backend": "vllm"}, max_new_tokens=4, seed=0)
    with pytest.raises(ValueError, match=r"eval\.backend"):
        generate(model_dir, PROMPTS, {**EVAL_CFG, "backend": "tpu"}, max_new_tokens=4, seed=0)


# ------------------------------------------------------------------------------------------ the run


def _data(tmp_path: Path) -> Path:
    rows = [make_row(f"q{i}", "t", "integer", p, eval(p[:-1])) for i, p in enumerate(PROMPTS)]
    path = tmp_path / "t.jsonl"
    write_rows(path, rows)
    return path


def _evaluate(model_dir, base_dir, data, out: Path, run: str, **kw) -> dict:
    summary, _ = evaluate(
        model=model_dir,
        base=base_dir,
        data=data,
        samples_out=out / f"{run}/t.samples.parquet",
        summary_out=out / f"{run}/t.json",
        kl_out=out / f"{run}/t.kl.json",
        eval_cfg=EVAL_CFG,
        task_cfg={"kind": "integer", "role": "on_task", "max_new_tokens": 4},
        run=run,
        task="t",
        **kw,
    )
    return summary


def test_evaluate_writes_samples_summary_and_kl_in_the_saved_dtype(tiny, tmp_path):
    model, tok = tiny
    base_dir = _save(model, tok, tmp_path / "base")
    run_dir = _save(model, tok, tmp_path / "run", torch.bfloat16)
    data = _data(tmp_path)
    out = tmp_path / "eval"
    base = _evaluate(base_dir, base_dir, data, out, "base")
    run = _evaluate(run_dir, base_dir, data, out, "bf16-s1", reference_run="base-bfloat16",
                    reference_dtype="bfloat16", base_samples=out / "base/t.samples.parquet")  # fmt: skip
    samples = pd.read_parquet(out / "bf16-s1/t.samples.parquet")
    assert list(samples.columns) == list(SAMPLE_COLUMNS) and len(samples) == 5 * 3
    assert samples["length"].between(1, 4).all()
    on_disk = json.loads((out / "bf16-s1/t.json").read_text())
    assert on_disk == json.loads(json.dumps(run))
    assert base["dtype"] == "float32" and run["dtype"] == "bfloat16"
    assert base["dJ"] is None and run["dJ"] == pytest.approx(run["pass_at_1"] - base["pass_at_1"])
    assert run["N"] == 5 and run["n"] == 3 and run["role"] == "on_task" and run["seed"] != base["seed"]
    assert run["sampling"] == {"temperature": 0.7, "top_p": 0.8, "max_new_tokens": 4, "n_samples": 3}
    assert run["reference_run"] == "base-bfloat16" and base["reference_run"] == "base"
    assert run["timing"]["startup_s"] > 0 and run["timing"]["load_s"] > 0
    kl = json.loads((out / "bf16-s1/t.kl.json").read_text())
    assert (kl["policy_dtype"], kl["reference_dtype"], kl["reference_run"]) == (
        "bfloat16",
        "bfloat16",
        "base-bfloat16",
    )
    # an untrained bf16 run is its arm's start exactly
    assert kl["k1_mean"] == kl["k3_mean"] == kl["rb_mean"] == 0.0
    again = _evaluate(base_dir, base_dir, data, tmp_path / "again", "base")
    assert again["correct_counts"] == base["correct_counts"]
    assert pd.read_parquet(tmp_path / "again/base/t.samples.parquet").equals(
        pd.read_parquet(out / "base/t.samples.parquet")
    )


def test_seeds_and_kl_prompts_are_stable():
    assert derive_seed(0, "base", "add_sub", "eval") == derive_seed(0, "base", "add_sub", "eval")
    seeds = {derive_seed(s, r, t, "eval") for s in (0, 1) for r in ("base", "fp32-s1") for t in ("a", "b")}
    assert len(seeds) == 8 and all(0 <= s < 2**31 for s in seeds)
    assert derive_seed(0, "base", "add_sub", "eval") == 557882688  # never changes silently
    picked = kl_prompt_indices(100, 10, 3)
    assert picked == sorted(picked) and len(set(picked)) == 10 and picked == kl_prompt_indices(100, 10, 3)
    assert kl_prompt_indices(5, 10, 3) == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------------- snakemake level


@pytest.mark.slow
def test_evaluate_rule_for_base_writes_pass_at_1_and_kl_in_one_job(tmp_path, tmp_path_factory):
    from conftest import base_evaluated, copy_workflow, load_test_config, planned_jobs, run_snakemake, set_key

    config = load_test_config()
    tasks = list(config["data"]["tasks"])
    # the targets' run (exit 0 asserted there) is the session's, shared with test_workflow_foundation.py;
    # this test edits the config and reruns the evaluation per run, so it works in a copy
    wf = copy_workflow(base_evaluated(tmp_path_factory), tmp_path / "wf")
    targets = [f"results/eval/base/{t}{suffix}" for t in tasks for suffix in (".json", ".kl.json")]
    n = config["eval"]["n_samples"]
    for task in tasks:
        summary = json.loads((wf / f"results/eval/base/{task}.json").read_text())
        samples = pd.read_parquet(wf / f"results/eval/base/{task}.samples.parquet")
        assert len(samples) == summary["N"] * n == config["data"]["tasks"][task]["n"] * n
        assert 0.0 <= summary["pass_at_1"] <= 1.0 and summary["dtype"] == "float32"
        kl = json.loads((wf / f"results/eval/base/{task}.kl.json").read_text())
        assert kl["k1_mean"] == kl["k3_mean"] == kl["rb_mean"] == 0.0  # base vs base: exactly
        ev = config["eval"]
        assert (kl["n_prompts"], kl["n_samples"]) == (ev["kl_prompts"], ev["kl_samples"])
        assert (wf / f"logs/evaluate/base/{task}.log").exists()
        assert (wf / f"benchmarks/evaluate/base/{task}.tsv").exists()
        assert "STARTUP {" in (wf / f"logs/evaluate/base/{task}.log").read_text()
    assert not (wf / "benchmarks/kl").exists()  # one job per (run, task)
    cfg = wf / "config.yaml"
    original = cfg.read_text()
    set_key(cfg, "analysis.alpha", 0.01)
    set_key(cfg, "train.learning_rate", 1e-5)
    assert planned_jobs(wf, *targets) == {}
    set_key(cfg, "eval.kl_samples", 3)
    assert planned_jobs(wf, *targets) == {"evaluate": len(tasks)}
    cfg.write_text(original)
    set_key(cfg, "eval.n_samples", 3)
    assert planned_jobs(wf, *targets) == {"evaluate": len(tasks)}
    cfg.write_text(original)
    jobs = planned_jobs(wf, f"results/eval/fp32-s1/{tasks[0]}.json")
    assert jobs == {"train": 1, "evaluate": 1}  # the base samples exist; the run's model does not
    jobs = planned_jobs(wf, f"results/eval/bf16-s1/{tasks[0]}.json")
    assert jobs == {"train": 1, "evaluate": 2}  # + base-bfloat16, the bf16 arm's reference

    # eval.jobs per_run: one job evaluates every task of the run, with the same numbers
    per_task = {f: (wf / "results/eval/base" / f).read_bytes() for f in os.listdir(wf / "results/eval/base")}
    set_key(cfg, "eval.jobs", "per_run")
    assert planned_jobs(wf, *targets) == {"evaluate": 1}
    proc = run_snakemake(wf, *targets, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (wf / "logs/evaluate/base.log").read_text()
    assert log.count("STARTUP {") == 1 and log.count("models loaded in") == 1  # loaded once for all tasks
    for name, before in per_task.items():
        after = (wf / "results/eval/base" / name).read_bytes()
        if name.endswith(".parquet"):
            assert after == before, name
        else:
            old, new = json.loads(before), json.loads(after)
            if not name.endswith(".kl.json"):  # the summary records how many tasks its job evaluated
                assert (old["timing"]["tasks_in_job"], new["timing"]["tasks_in_job"]) == (1, len(tasks))
            assert {**new, "timing": None} == {**old, "timing": None}, name
    set_key(cfg, "eval.kl_samples", 3)  # the rerun unit is the run's evaluation: one job, every task
    assert planned_jobs(wf, *targets) == {"evaluate": 1}
    jobs = planned_jobs(wf, f"results/eval/bf16-s1/{tasks[0]}.json")
    assert jobs == {"train": 1, "evaluate": 2}  # base-bfloat16 (every task) and the run


# ------------------------------------------------------------------- bf16_matmul: the training path


class _Named(dict):
    """A Snakemake namedlist stand-in: keys as attributes, ``get`` as on the real one."""

    __getattr__ = dict.__getitem__


def test_the_rule_passes_the_arms_bf16_matmul_and_the_evaluation_records_that_path(
    tiny, tmp_path, monkeypatch
):
    from workflow_scripts.evaluate import from_snakemake

    monkeypatch.chdir(tmp_path)  # the job's resume store lies under the working directory's results/
    from workflow_scripts.runtime import eval_matmul, paths
    from workflow_scripts.training.bf16_matmul import resolve

    other = "native" if resolve("auto") == "emulated" else "emulated"  # not what the default gives here
    arms = {"fp32": {"param_dtype": "float32"}, "bf16": {"param_dtype": "bfloat16", "bf16_matmul": other}}
    config = {"model": {"dtype": "float32"}, "precisions": arms}
    model, tok = tiny
    base_dir = _save(model, tok, tmp_path / "base")
    run_dir = _save(model, tok, tmp_path / "run", torch.bfloat16)
    out = tmp_path / "eval"
    smk = _Named(
        input=_Named(model=str(run_dir), base=str(base_dir), data=str(_data(tmp_path))),
        output=_Named(samples=str(out / "s.parquet"), summary=str(out / "s.json"), kl=str(out / "kl.json")),
        params=_Named(eval=EVAL_CFG, tasks={"t": {"kind": "integer", "role": "on_task", "max_new_tokens": 4}},
                      reference=paths.reference_spec(config, "bf16-s1"), trust_remote_code=False,
                      bf16_matmul=eval_matmul.bf16_matmul(config, "bf16-s1"), code="test"),
        wildcards=_Named(run="bf16-s1", task="t"),
        threads=1,
    )  # fmt: skip
    from_snakemake(smk)
    summary, kl = (json.loads((out / name).read_text()) for name in ("s.json", "kl.json"))
    assert summary["bf16_matmul"] == kl["bf16_matmul"] == other and summary["dtype"] == "bfloat16"


def _metadata_params(wf: Path) -> dict[str, str]:
    """Output path -> the params Snakemake recorded for the job that made it (.snakemake/metadata)."""
    import base64

    recorded = {}
    for f in (wf / ".snakemake" / "metadata").iterdir():
        path = base64.b64decode(f.name.replace("@", "/")).decode()
        recorded[path] = str(json.loads(f.read_text()).get("params"))
    return recorded


@pytest.mark.slow
def test_evaluate_jobs_carry_the_bf16_matmul_of_their_runs_training(tmp_path):
    from conftest import load_test_config, make_workflow_dir, mark_done, placeholder_outputs

    config = load_test_config()
    config["precisions"]["bf16"]["bf16_matmul"] = "emulated"
    config["repeats"] = [{"precision": "bf16", "seed": 1}]
    wf = make_workflow_dir(tmp_path / "wf", config)
    placeholder_outputs(wf)
    mark_done(wf)  # records every job's params without running it
    recorded = _metadata_params(wf)
    evals = {p: v for p, v in recorded.items() if p.startswith("results/eval/") and p.endswith(".kl.json")}
    assert len(evals) == 7 * len(config["data"]["tasks"])  # base, base-bfloat16, 2 x 2 runs, the repeat
    for path, params in evals.items():
        run = path.split("/")[2]
        bf16 = run.startswith("bf16-") or run == "base-bfloat16"
        assert ("'emulated'" in params) == bf16 and ("'auto'" in params) != bf16, (path, params)


@pytest.mark.slow
def test_bf16_arms_with_different_bf16_matmul_stop_the_workflow_naming_each_key(tmp_path):
    from conftest import load_test_config, make_workflow_dir, run_snakemake

    config = load_test_config()
    config["precisions"]["bf16_emulated"] = {**config["precisions"]["bf16"], "bf16_matmul": "emulated"}
    wf = make_workflow_dir(tmp_path / "wf", config)
    proc = run_snakemake(wf, "--dry-run", timeout=300)
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    for arm in ("bf16", "bf16_emulated"):
        assert f"config.yaml: precisions.{arm}.bf16_matmul: the arms with param_dtype bfloat16" in message


# ------------------------------------------------------------------------- resume after a retry


def test_a_per_run_job_killed_after_its_first_task_resumes_without_recomputing_it(tiny, tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    """eval.jobs per_run: attempt 1 dies while generating the second task; Snakemake deletes the outputs;
    attempt 2 copies the first task from the store (no generation, no model load for it) and computes
    the second. Every file equals an uninterrupted run's (byte for byte; the json up to timing)."""
    from workflow_scripts import evaluate as ev

    model, tok = tiny
    base_dir = _save(model, tok, tmp_path / "base")
    data = _data(tmp_path)
    task_cfg = {"kind": "integer", "role": "on_task", "max_new_tokens": 4}

    def jobs(out: Path) -> list:
        return [ev.TaskJob(t, task_cfg, data, out / f"{t}.samples.parquet", out / f"{t}.json",
                           out / f"{t}.kl.json") for t in ("t", "u")]  # fmt: skip

    def job(out: Path, store: Path, eval_cfg=EVAL_CFG) -> list:
        return ev.run_tasks(model=base_dir, base=base_dir, tasks=jobs(out), eval_cfg=eval_cfg, run="base",
                            resume={"dir": store, "code": "v1"})  # fmt: skip

    calls = []
    real = ev.generate

    def counted(model_dir, prompts, eval_cfg, max_new_tokens, seed, *args, **kw):
        calls.append(seed)
        if kill_at is not None and len(calls) == kill_at:
            raise KeyboardInterrupt("killed")
        return real(model_dir, prompts, eval_cfg, max_new_tokens, seed, *args, **kw)

    monkeypatch.setattr(ev, "generate", counted)
    kill_at = None
    whole = job(tmp_path / "whole", tmp_path / "store_whole")
    assert len(calls) == 2 and not any((tmp_path / "store_whole").iterdir())  # cleared when the job is done
    first_seed, second_seed = calls
    calls.clear()
    out, store = tmp_path / "eval/base", tmp_path / "store"
    kill_at = 2
    with pytest.raises(KeyboardInterrupt):
        job(out, store)
    assert calls == [first_seed, second_seed] and [p.name[:2] for p in store.iterdir()] == ["t-"]
    kept = {f.name: f.read_bytes() for f in out.iterdir() if f.name.startswith("t.")}
    assert len(kept) == 3
    for f in out.iterdir():  # Snakemake deletes a failed job's outputs before the retry
        f.unlink()
    calls.clear()
    kill_at = None
    again = job(out, store)
    assert calls == [second_seed]  # the first task is not generated again
    assert not any(store.iterdir())
    assert [s["pass_at_1"] for s, _ in again] == [s["pass_at_1"] for s, _ in whole]
    for name, data_bytes in kept.items():
        assert (out / name).read_bytes() == data_bytes  # the first attempt's files, copied
    for t in ("t", "u"):
        assert (out / f"{t}.samples.parquet").read_bytes() == (
            tmp_path / f"whole/{t}.samples.parquet"
        ).read_bytes()
        for suffix in ("json", "kl.json"):
            mine, theirs = (
                json.loads(p.read_text()) for p in (out / f"{t}.{suffix}", tmp_path / f"whole/{t}.{suffix}")
            )
            assert {k: v for k, v in mine.items() if k != "timing"} == {
                k: v for k, v in theirs.items() if k != "timing"
            }
    # another setting is another key: nothing is restored
    calls.clear()
    kill_at = 2
    with pytest.raises(KeyboardInterrupt):
        job(out, store)
    calls.clear()
    kill_at = None
    job(out, store, {**EVAL_CFG, "kl_samples": 3})
    assert calls == [first_seed, second_seed]
