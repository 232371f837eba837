"""The train start's check that TRL computes log-probs through its chunked head (the memory plan's
``logprob_head`` term), on a tiny model: passes once TRL has patched the forward, stops otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workflow_scripts.training.grpo_trainer import check_chunked_logprob_head


def tiny_model():
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    dims = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 48,
            "max_position_embeddings": 32, "seed": 0}  # fmt: skip
    return build_tiny_llama(len(tok), dims, tok)


def test_a_forward_patched_by_trls_fused_head_passes():
    from trl.trainer.utils import add_fused_lm_head

    model = tiny_model()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # what GRPOTrainer.__init__ does
    check_chunked_logprob_head(SimpleNamespace(model=model))


def test_a_forward_that_would_build_full_logits_stops_the_run():
    with pytest.raises(RuntimeError, match="would build full logits"):
        check_chunked_logprob_head(SimpleNamespace(model=tiny_model()))


def test_a_trl_whose_log_prob_path_does_not_call_the_fused_head_stops_the_run(monkeypatch):
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    def full_logits(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):  # an older TRL's path
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", full_logits)
    model = tiny_model()
    add_fused_lm_head(model)
    with pytest.raises(RuntimeError, match="fused call: False"):
        check_chunked_logprob_head(SimpleNamespace(model=model))
