"""The emulated bf16 products (``bf16_matmul``) keep the native bf16 contract within its own rounding.

The measure: each path's error against a float64 reference computed from the same bf16 values. A GEMM:
every output of either path within one bf16 spacing of the correctly rounded product plus the fp32
summation bound, and >= 99.9% equal to it (measured: 512x128x256, native 5 and emulated 8 of 131072
outputs off by one spacing on a Sapphire Rapids; AMD EPYC AVX512-BF16 native 9, emulated 8, one native
output 3 spacings off by cancellation, within the fp32 bound). A training
step and evaluation log-probs: the tiny model run in float64 from the bf16 weights is the reference;
both paths round every product to bf16, so their errors are the same size and only the fp32 summation
order differs; the emulated error is at most ``FACTOR`` times the native one (measured: logits 0.006598
vs 0.006602 relative, gradients 0.007408 vs 0.007403, on this machine's AMX native path).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workflow_scripts.measures.kl import sequence_logprobs
from workflow_scripts.training.bf16_matmul import bf16_matmul, native_bf16_gemm, resolve
from workflow_scripts.training.optimizers import bf16_spacing

FACTOR = 1.1  # emulated error <= FACTOR x native error (both are bf16 rounding of every product)
BF16 = torch.bfloat16


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def tiny_llama(dropout: float = 0.0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=64, tie_word_embeddings=False,
                         attention_dropout=dropout)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_auto_is_emulated_exactly_where_torch_has_no_bf16_gemm_kernels():
    with torch.backends.mkldnn.flags(enabled=False):  # torch's scalar fallback: an AVX2-only CPU's path
        assert native_bf16_gemm("cpu") is False and resolve("auto", "cpu") == "emulated"
    assert resolve("auto", "cpu") == ("native" if native_bf16_gemm("cpu") else "emulated")
    assert resolve("native") == "native" and resolve("emulated") == "emulated"
    with pytest.raises(ValueError, match="unknown choice 'fast'"):
        resolve("fast")


def test_an_emulated_gemm_is_as_close_to_the_correctly_rounded_product_as_the_native_one():
    torch.manual_seed(1)
    a, b = torch.randn(512, 128).to(BF16), torch.randn(128, 256).to(BF16)
    exact = (a.double() @ b.double()).to(BF16).double()  # the correctly rounded bf16 product
    native = a @ b
    with bf16_matmul("emulated"):
        emulated = a @ b
        out = torch.empty(512, 256, dtype=BF16)
        torch.mm(a, b, out=out)  # TRL's fused log-prob head calls mm with out=
    assert emulated.dtype == native.dtype == out.dtype == BF16
    assert torch.equal(out, emulated)
    # An fp32 sum of K products is off the exact sum by at most gamma_K |a| |b| (Higham, Accuracy and
    # Stability, 3.1: gamma_K = K u / (1 - K u), u = 2^-24), whatever the kernel's order of summation;
    # rounding that sum to bf16 adds at most one spacing. Near zero (cancellation) the first term wins:
    # an AMD EPYC's native AVX512-BF16 kernel put 1 of 131072 outputs 3 spacings off (exact -2.009e-4,
    # sum |a||b| 77.6), inside this bound; the AMX path and the emulation stayed within one spacing.
    k, u = a.shape[1], 2.0**-24
    fp32_sum_bound = (k * u / (1 - k * u)) * (a.double().abs() @ b.double().abs())
    bound = bf16_spacing(exact.float()).double() + fp32_sum_bound
    for path, result in (("native", native), ("emulated", emulated)):
        off = (result.double() - exact).abs()
        assert bool((off <= bound).all()), path  # an fp32-accumulated product rounded to bf16, no worse
        assert float((off == 0).double().mean()) >= 0.999, path  # fp32 sums miss only near-ties


def test_a_training_step_on_the_emulated_path_matches_native_within_native_rounding():
    """Logits, loss gradients and the AdamW step of a bf16 model, each path against float64."""
    model = tiny_llama().to(BF16).train()
    ref = tiny_llama().double().train()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(2))

    def step(net, path):
        net.zero_grad()
        with bf16_matmul(path):
            out = net(ids, labels=ids)
            out.loss.backward()
        return out.logits.detach(), {n: p.grad.detach().clone() for n, p in net.named_parameters()}

    ref_logits, ref_grads = step(ref, "native")
    results = {path: step(model, path) for path in ("native", "emulated")}
    grads_ref = torch.cat([g.reshape(-1) for g in ref_grads.values()])
    err = {}
    for path, (logits, grads) in results.items():
        assert {g.dtype for g in grads.values()} == {BF16}  # gradients stay bf16
        flat = torch.cat([grads[n].reshape(-1) for n in ref_grads])
        err[path] = (rel(logits, ref_logits), rel(flat, grads_ref))
    assert err["emulated"][0] <= FACTOR * err["native"][0], err
    assert err["emulated"][1] <= FACTOR * err["native"][1], err
    # the weights an AdamW step writes from each path's gradients, against the step from the float64
    # gradients: each path misses it on about as many weights (sign flips of near-zero gradients)
    after = {}
    for path, grads in {"float64": ref_grads, **{p: r[1] for p, r in results.items()}}.items():
        net = tiny_llama().to(BF16)
        net.load_state_dict(model.state_dict())
        for n, p in net.named_parameters():
            p.grad = grads[n].to(BF16)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        optimizer.step()
        assert {t.dtype for s in optimizer.state.values() for k, t in s.items() if k != "step"} == {BF16}
        after[path] = torch.cat([p.detach().reshape(-1).float() for p in net.parameters()])
    missed = {p: float((after[p] != after["float64"]).double().mean()) for p in results}
    assert missed["emulated"] <= FACTOR * missed["native"], missed


def test_an_autocast_forward_is_emulated_with_operands_rounded_to_bf16_as_autocast_would():
    model = tiny_llama().float().eval()
    ids = torch.randint(0, 64, (4, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model.double()(ids).logits
        model.float()
        with torch.autocast("cpu", dtype=BF16):
            native = model(ids).logits
            with bf16_matmul("emulated"):
                emulated = model(ids).logits
    assert native.dtype == emulated.dtype == BF16
    assert rel(emulated, ref) <= FACTOR * rel(native, ref)


def test_evaluation_log_probs_and_samples_agree_between_paths(tiny_base):
    """What evaluate computes for a bf16 model (samples, teacher-forced log-probs) on either path."""
    from workflow_scripts.models.generation import sample_completions
    from workflow_scripts.models.modeling import load_model, load_tokenizer

    base = tiny_base["base_dir"]
    tokenizer = load_tokenizer(base)
    model = load_model(base, "bfloat16").eval()
    ref = load_model(base, "bfloat16").double().eval()  # float64 from the same bf16 weights
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(4)]
    samples = {}
    for path in ("native", "emulated"):
        with bf16_matmul(path):
            samples[path] = sample_completions(model, tokenizer, prompts, n_samples=4, temperature=1.0,
                                               max_new_tokens=4, seed=5)  # fmt: skip
    same = sum(
        a.token_ids == b.token_ids for a, b in zip(samples["native"], samples["emulated"], strict=True)
    )
    assert same / len(samples["native"]) >= 0.9  # the same draws but where rounding flips a token
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(4)]
    completions = [list(c.token_ids) for c in samples["native"]]
    pad = tokenizer.pad_token_id
    exact = sequence_logprobs(ref, ids, completions, pad)
    err = {}
    for path in ("native", "emulated"):
        with bf16_matmul(path):
            err[path] = float((sequence_logprobs(model, ids, completions, pad) - exact).abs().mean())
    assert err["emulated"] <= FACTOR * err["native"] + 1e-6, err


def test_an_evaluate_job_on_either_path_records_it_and_agrees(tiny_base, tmp_path):
    """The evaluate job of a bf16 run (the base cast to bf16) forced native and emulated."""
    from workflow_scripts.evaluate import run as evaluate

    config = tiny_base["config"]
    task = config["data"]["tasks"]["mul"]
    out = {}
    for path in ("native", "emulated"):
        summary, kl = evaluate(
            model=tiny_base["base_dir"], base=tiny_base["base_dir"],
            data=tiny_base["data_dir"] / "eval" / "mul.jsonl", samples_out=tmp_path / path / "s.parquet",
            summary_out=tmp_path / path / "s.json", kl_out=tmp_path / path / "kl.json",
            eval_cfg=dict(config["eval"], n_samples=4), task_cfg=task, run="base-bfloat16", task="mul",
            policy_dtype="bfloat16", reference_dtype="bfloat16", bf16_matmul=path,
        )  # fmt: skip
        assert summary["bf16_matmul"] == kl["bf16_matmul"] == path and summary["dtype"] == "bfloat16"
        out[path] = summary
    native, emulated = out["native"], out["emulated"]
    texts = {p: pd.read_parquet(tmp_path / p / "s.parquet")["completion"].tolist() for p in out}
    same = sum(a == b for a, b in zip(texts["native"], texts["emulated"], strict=True))
    assert same / len(texts["native"]) >= 0.9  # the same draws but where rounding flips a token
    se = (native["pass_at_1_se"] ** 2 + emulated["pass_at_1_se"] ** 2) ** 0.5
    assert abs(native["pass_at_1"] - emulated["pass_at_1"]) <= 2 * se


def test_emulated_attention_matches_native_sdpa_within_bf16_rounding():
    """Masks, causal, GQA and dropout-free SDPA: each path against a float64 reference."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 7, 16, generator=gen).to(BF16)
    k, v = (torch.randn(2, 2, 7, 16, generator=gen).to(BF16) for _ in range(2))
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    mask[0, :, :, :2] = False  # left padding of the first row's sequence
    mask[0, :, :2, :2] = True
    for kwargs in ({"attn_mask": mask, "enable_gqa": True}, {"is_causal": True, "enable_gqa": True}):
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)
        native = F.scaled_dot_product_attention(q, k, v, **kwargs)
        with bf16_matmul("emulated"):
            emulated = F.scaled_dot_product_attention(q, k, v, **kwargs)
        assert emulated.dtype == BF16 and torch.isfinite(emulated).all()
        assert rel(emulated, ref) <= 1.5 * rel(native, ref) + 1e-3, kwargs


def test_cached_weight_copies_follow_every_optimizer_step():
    layer = torch.nn.Linear(8, 8).to(BF16)
    x = torch.randn(4, 8).to(BF16)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    with bf16_matmul("emulated"):
        for _ in range(3):
            y = layer(x)
            expected = (x.float() @ layer.weight.float().T + layer.bias.float()).to(BF16)
            assert torch.equal(y, expected)  # the current weights, not a stale copy
            y.float().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
