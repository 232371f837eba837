"""Our GRPOTrainer: the ONE place where the project overrides TRL 1.16's GRPO loop, and why.

| override (train mode)   | TRL alone                            | here                                   |
|-------------------------|--------------------------------------|----------------------------------------|
| ``_generate_and_score_  | samples rollouts and computes the    | both in eval mode (``sampling_mode``): |
| completions``           | old log-probs in TRAIN mode: an      | no dropout while sampling, as vLLM at  |
|                         | arm's dropout perturbs them (reward  | paper scale; dropout acts only in the  |
|                         | 0.117 -> 0.023, grad norm ~1.4 ->    | loss forward (the training step runs   |
|                         | ~280 at the base)                    | in train mode)                         |
| same hook, under FSDP2  | generates outside autocast (the      | inside the arm's autocast, as without  |
|                         | FSDP2 model has no autocast forward) | FSDP                                   |
| same hook, with         | keeps zero-spread groups (all        | DAPO dynamic sampling: they are        |
| ``dynamic_sampling``    | rewards equal: no gradient)          | dropped, fresh prompts drawn (below)   |
| ``_calculate_rewards``  | -                                    | keeps the round's rewards (spread test)|
| ``_get_train_sampler``  | RepeatSampler: a new permutation per | ``EpochRepeatSampler``: epoch e's      |
|                         | ``__iter__``                         | order from e alone (exact resume);     |
|                         |                                      | with ``train.curriculum``:             |
|                         |                                      | ``CurriculumSampler``, each round from |
|                         |                                      | its phase's rows (dynamic sampling's   |
|                         |                                      | refills too)                           |
| ``_compute_loss``       | -                                    | the sampler-trainer gap (sampler_gap)  |
| ``_generate_single_    | the trained model samples (HF)       | an HF copy in the arm's sampler_dtype  |
| turn`` (``sampler``)    |                                      | samples and scores (``OwnSampler``)    |
| ``__init__`` with       | builds the colocated vLLM engine     | the engine gets the arm's sampler      |
| ``use_vllm``            | with dtype "auto": vLLM casts a      | dtype (``PrecisionMode.sampler_compute |
|                         | float32 checkpoint to 16 bits, so    | _dtype``: sampler_dtype, else compute  |
|                         | the fp32 arm would sample in bf16;   | dtype), and the seed (run              |
|                         | seed = process_index // tp: every    | seed, TP group), not the group alone   |
|                         | run seed shares one random stream    | (``vllm_engine_args``, ``vllm_seed``)  |
|                         | and no KV-cache size is given        | with the ``train.vllm`` settings       |
| ``vllm_generation.      | run inside the trainer's contexts    | outside ``bf16_matmul``'s emulation    |
| generate``, ``.sync_    |                                      | (``outside_emulation``); on vLLM's CPU |
| weights``               |                                      | build the sync is ``sync_weights_cpu`` |

Dynamic sampling (DAPO, Yu et al. 2025, section 3.2). A generation round needs ``n`` prompt groups
(``generation_batch_size / num_generations``). A group is zero-spread when the standard deviation of
its total rewards is 0 (TRL's own ``frac_reward_zero_std`` test); its advantages are all 0, so it only
dilutes the token-normalised DAPO loss. With the switch on, the round keeps its groups with spread and,
while fewer than ``n``, draws more prompts (as many as the missing groups need at the spread rate seen
so far, +25%, at most ``n``: DAPO redraws whole batches, same filter, more generation; uniformly, without
replacement within the draw, seeded by (seed, step, refill): a resumed run redraws the same prompts),
generates and scores them and keeps their groups with spread, in draw order, until ``n`` are kept. At
most ``dynamic_sampling_max_rounds`` refills per round: when the cap is hit the batch is filled with
zero-spread groups (in draw order), and the round logs ``dynamic/cap_hit`` 1 and how many zero-spread
groups the loss saw. Several processes: each keeps and refills its own groups; every process joins
every refill draw until all are full (generation and reward gathering are collective), counts are
summed over processes. Every round logs ``dynamic/rollouts_drawn`` (groups generated, refills
included), ``dynamic/groups_kept`` (groups with spread in the loss batch) and
``dynamic/groups_zero_spread``; with the switch off the same counts describe TRL's batch and nothing
else changes (bit-identical training). TRL's rollout metrics (reward, lengths, frac_reward_zero_std)
average over every group drawn. Kept groups from different draws are re-padded to a common width and
all-padding columns removed; old log-probs stay those of each draw (Llama's rotary positions make a
shift of left padding change them only by rounding).

Long on purpose: every override of TRL's loop stays in this one class, so the table above is the whole
list of where the project departs from TRL (the colocated sync's FSDP2 helpers included).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from functools import partial

import torch

# keys of TRL's rollout dict that are per-row tensors, and how each is padded: (side, value or None = pad id)
_ROW_KEYS = {
    "prompt_ids": ("left", None),
    "prompt_mask": ("left", 0),
    "completion_ids": ("right", None),
    "completion_mask": ("right", 0),
    "old_per_token_logps": ("right", 0.0),
    "sampling_per_token_logps": ("right", 0.0),
    "importance_sampling_ratio": ("right", 1.0),
    "ref_per_token_logps": ("right", 0.0),
    "tool_mask": ("right", 1),
    "advantages": (None, None),
}


@contextlib.contextmanager
def sampling_mode(model: torch.nn.Module) -> Iterator[None]:
    """Every submodule in eval mode (no dropout) while rollouts are sampled and scored; restored after.

    The root module keeps its flag on purpose: TRL reads ``self.model.training`` to choose between its
    train and eval code paths (batch sizes, num_generations, metric names), which must stay "train".
    """
    flags = [(module, module.training) for module in model.modules()]
    for module, _ in flags[1:]:
        module.training = False
    try:
        yield
    finally:
        for module, flag in flags:
            module.training = flag


def group_has_spread(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """(groups,) bool: the group's total rewards differ (TRL's test: nan-std not close to 0; a group with
    fewer than two scored completions has no spread: its advantages are 0).

    rewards_per_func: (completions, reward functions), NaN where a function did not apply.
    """
    from trl.trainer.utils import nanstd

    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    std = nanstd(rewards.view(-1, group_size), dim=1).nan_to_num(0.0)
    return ~torch.isclose(std, torch.zeros_like(std))


def _pad_to(tensor: torch.Tensor, width: int, side: str, value) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing <= 0:
        return tensor
    fill = torch.full((tensor.size(0), missing), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([fill, tensor] if side == "left" else [tensor, fill], dim=1)


def merge_groups(
    draws: list[dict], picks: list[tuple[int, int]], group_size: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """One rollout dict from the groups ``picks`` = [(draw index, group index), ...] of ``draws``.

    Tensors are re-padded to a common width, then columns that are padding in every row are removed
    (left of the prompts, right of the completions); ``num_items_in_batch`` is recounted.
    """
    unknown = set(draws[0]) - set(_ROW_KEYS) - {"num_items_in_batch"}
    if unknown:
        raise NotImplementedError(f"dynamic sampling: rollout fields {sorted(unknown)} are not supported")
    merged: dict[str, torch.Tensor] = {}
    for key, (side, value) in _ROW_KEYS.items():
        if key not in draws[0]:
            continue
        parts = []
        for draw, group in picks:
            rows = draws[draw][key][group * group_size : (group + 1) * group_size]
            parts.append(rows)
        per_sequence = key == "importance_sampling_ratio" and parts[0].size(1) == 1
        if side is not None and parts[0].dim() == 2 and not per_sequence:
            width = max(p.size(1) for p in parts)
            fill = pad_id if value is None else value
            parts = [_pad_to(p, width, side, fill) for p in parts]
        merged[key] = torch.cat(parts, dim=0)
    used_prompt = merged["prompt_mask"].bool().any(dim=0)
    first = int(used_prompt.nonzero()[0]) if used_prompt.any() else merged["prompt_mask"].size(1) - 1
    used_completion = merged["completion_mask"].bool().any(dim=0)
    last = int(used_completion.nonzero()[-1]) + 1 if used_completion.any() else 1
    completion_width = merged["completion_ids"].size(1)
    for key, (side, _) in _ROW_KEYS.items():
        tensor = merged.get(key)
        if tensor is None or side is None or tensor.dim() != 2:
            continue
        if side == "left":
            merged[key] = tensor[:, first:]
        elif tensor.size(1) == completion_width:
            merged[key] = tensor[:, :last]
    loss_mask = merged["completion_mask"]
    if "tool_mask" in merged:
        loss_mask = loss_mask * merged["tool_mask"]
    merged["num_items_in_batch"] = loss_mask.sum()
    return merged


VLLM_SEED_STRIDE = 10_000  # engine seeds of one run: run seed * stride + TP group (readable: 30002)


def vllm_seed(run_seed: int, group: int) -> int:
    """The colocated vLLM engine's sampling seed for run seed ``run_seed`` and tensor-parallel group
    ``group`` (= process_index // tensor_parallel_size: the ranks of one group must share it).

    TRL 1.16 seeds the engine with the group index alone, so every training seed (and every arm) drew
    rollouts from the same random stream; here seed s of every arm shares one stream (paired design)
    and different seeds differ. Per-request seeds (SamplingParams.seed) would not do: TRL sends each of
    a group's num_generations copies of a prompt as its own request, which would then sample alike.
    The value stays below 2**32 (numpy's seed range, used by vLLM's set_random_seed)."""
    if not 0 <= group < VLLM_SEED_STRIDE:
        raise ValueError(f"vLLM group index {group} outside [0, {VLLM_SEED_STRIDE})")
    seed = int(run_seed) * VLLM_SEED_STRIDE + int(group)
    if not 0 <= seed < 2**32:
        raise ValueError(f"run seed {run_seed} gives vLLM seed {seed}, outside [0, 2**32)")
    return seed


@contextlib.contextmanager
def vllm_engine_args(
    dtype: str | None, run_seed: int | None = None, engine: dict | None = None
) -> Iterator[dict]:
    """While TRL builds its colocated vLLM engine: build it with ``dtype`` instead of "auto", with the
    seed ``vllm_seed(run_seed, group)`` instead of TRL's group index and with the ``train.vllm`` settings
    ``engine`` (``vllm_engine.engine_kwargs``: KV-cache size, eager mode, memory share, length). Yields
    what the engine was built with and what it runs ({dtype, seed} + ``vllm_engine.engine_record``,
    filled when it is built), for run.json and the precision contract.

    TRL 1.16 calls ``vllm.LLM(...)`` without a dtype (trl/generation/vllm_generation.py); vLLM's "auto"
    downcasts a float32 checkpoint (float16 before vLLM 0.10.1, bfloat16 since), so an fp32 arm's
    rollouts would be sampled in 16 bits and the arms would differ in more than they name. It passes
    ``seed=process_index // tensor_parallel_size`` (see ``vllm_seed``) and no KV-cache size. TRL offers
    no option for these, so the name it calls is wrapped for the duration of ``GRPOTrainer.__init__``
    only. The job's torch thread count is restored after the engine starts (``keep_threads``)."""
    built: dict = {}
    if dtype is None and run_seed is None and engine is None:
        yield built
        return
    from trl.generation import vllm_generation

    from workflow_scripts.models import vllm_engine as engines

    original = vllm_generation.LLM
    engines.claim_rendezvous_port()  # before TRL's ensure_master_addr_port picks its fixed 29500

    def build(*args, **kwargs):
        if dtype is not None:
            kwargs["dtype"] = dtype
        if run_seed is not None:
            kwargs["seed"] = vllm_seed(run_seed, int(kwargs.get("seed") or 0))
        if engine is not None:
            engines.prepare_process()
            kwargs.update(engines.engine_kwargs(engine, "train.vllm"))
        built.update(dtype=kwargs.get("dtype"), seed=kwargs.get("seed"))
        with engines.keep_threads(None):
            llm = original(*args, **kwargs)
        if engine is not None:
            built.update(engines.engine_record(llm))
        return llm

    vllm_generation.LLM = build
    try:
        yield built
    finally:
        vllm_generation.LLM = original


def check_chunked_logprob_head(trainer) -> None:
    """Stop a run whose TRL log-prob path would build the full [tokens, vocabulary] logits.

    The memory plan (``runtime.memory_plan``, ``logprob_head``) counts TRL 1.16's chunked head: the
    trainer patches the model's forward (``add_fused_lm_head``) and ``_get_per_token_logps_and_entropies``
    calls it with ``fused_lm_head=True``, so logits exist one [4096, 32768] tile at a time. A TRL whose
    path computes full logits would hold ~3 fp32 copies of them in backward (one-node fp32: ~90 GiB), out
    of memory hours into a queue; this finds out at train start, on CPU as on GPU."""
    import inspect

    from trl import GRPOTrainer

    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    forward = getattr(model.forward, "__func__", model.forward)
    code = getattr(forward, "__code__", None)
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount] if code is not None else ()
    patched = "fused_lm_head" in names
    try:
        calls = "fused_lm_head=True" in inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    except (OSError, TypeError, AttributeError):
        calls = False
    if not (patched and calls):
        raise RuntimeError(
            "TRL's per-token log-prob path here would build full logits (GRPOTrainer."
            "_get_per_token_logps_and_entropies does not call a forward patched by add_fused_lm_head with "
            f"fused_lm_head=True; patched forward: {patched}, fused call: {calls}). The memory plan "
            "(workflow_scripts/runtime/memory_plan.py, logprob_head) assumes TRL 1.16's chunked head; "
            "install trl 1.16 (pyproject.toml) or count full logits in the plan before running"
        )


def outside_emulation(method):
    """``method`` run with ``bf16_matmul.suspended``: vLLM's calls never enter the emulated bf16 path."""
    from workflow_scripts.training.bf16_matmul import suspended

    def call(*args, **kwargs):
        with suspended():
            return method(*args, **kwargs)

    return call


def sync_weights_cpu(generation) -> None:
    """TRL's colocated weight sync for vLLM's CPU build (tests on CPU only; a GPU runs TRL's own).

    TRL loads each trained tensor through ``model_runner.model.load_weights``. The CPU build packs every
    linear weight for its GEMM kernel once, after loading (vllm/model_executor/layers/utils.py,
    ``dispatch_cpu_unquantized_gemm``), so that call cannot update one: the projections' weights were
    replaced by empty parameters ("'Parameter' object has no attribute 'weight_loader'", "Attempted to
    load weight ... into parameter (torch.Size([0]))"), and the LM head loads without an error into a
    weight its kernel no longer reads (its packed copy stays). Only the embedding and the norms load.
    vLLM's layerwise reload takes TRL's same (name, tensor) stream, DTensor gather included, and packs
    it again (``driver_worker.reload_weights(weights_iterator=...)``); the prefix cache is reset as TRL
    does. ``tests/models/test_colocated_sync.py`` shows each of these on the CPU build."""
    worker = generation.llm.llm_engine.model_executor.driver_worker
    worker.reload_weights(weights_iterator=generation._iter_named_params())
    generation.llm.reset_prefix_cache()


def reshard_fsdp(model) -> None:
    """Every FSDP2 module of ``model`` back to its shards (a no-op for sharded ones and without FSDP2).

    After a forward with no backward (a KL or held-out measurement between an optimizer step and the next
    rollouts), FSDP2 keeps the root's parameters and those accelerate shards with
    ``reshard_after_forward=False`` (final norm, LM head) gathered, as plain tensors; TRL's FSDP2 gather
    calls ``full_tensor()`` on each and fails ("'Tensor' object has no attribute 'full_tensor'")."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def attach_colocated_sync(generation, engine_args: dict) -> None:
    """The colocated engine's sync and generation as the trainer runs them: TRL's ``sync_weights``, or
    ``sync_weights_cpu`` where the engine is vLLM's CPU build (``engine_args["platform"]``, from
    ``vllm_engine_args``), after ``reshard_fsdp`` of the trained model, both outside ``bf16_matmul``'s
    emulation (the engine computes with its own kernels, ``outside_emulation``)."""
    load = (
        partial(sync_weights_cpu, generation)
        if engine_args.get("platform") == "cpu"
        else generation.sync_weights
    )

    def sync_weights() -> None:
        reshard_fsdp(generation.model)
        load()

    generation.sync_weights = outside_emulation(sync_weights)
    generation.generate = outside_emulation(generation.generate)


class CurriculumSampler(torch.utils.data.Sampler):
    """TRL's RepeatSampler layout (a round's prompt chunk repeated ``repeat_count`` times, each prompt
    ``mini_repeat_count`` times) with round r's chunk drawn from the rows of its phase ``rounds[r]``
    (``ranges[p]`` = that phase's (start, stop) in the concatenated dataset). Each phase walks its own
    seeded permutations (a new one when its rows run out), so the order is a function of the seed alone
    (exact resume) and a phase's draws do not depend on how long the other phases are."""

    def __init__(self, rounds: list[int], ranges: list[tuple[int, int]], mini_repeat_count: int,
                 batch_size: int, repeat_count: int, seed: int) -> None:  # fmt: skip
        self.rounds, self.ranges = list(rounds), list(ranges)
        self.mini_repeat_count, self.batch_size, self.repeat_count = (
            mini_repeat_count,
            batch_size,
            repeat_count,
        )
        self.seed = int(seed)

    def chunks(self) -> list[list[int]]:
        """Every round's prompt indices."""
        streams: dict[int, list[int]] = {}
        generators = {}
        out = []
        for phase in self.rounds:
            start, stop = self.ranges[phase]
            stream = streams.setdefault(phase, [])
            gen = generators.setdefault(phase, torch.Generator().manual_seed(self.seed * 1_000 + phase))
            while len(stream) < self.batch_size:
                stream.extend((start + torch.randperm(stop - start, generator=gen)).tolist())
            out.append(stream[: self.batch_size])
            del stream[: self.batch_size]
        return out

    def __iter__(self):
        for chunk in self.chunks():
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        return len(self.rounds) * self.batch_size * self.mini_repeat_count * self.repeat_count

    def set_epoch(self, epoch: int) -> None:  # one epoch covers the run: nothing to rewind
        return None


def make_trainer_class(
    dynamic_sampling: bool = False,
    max_rounds: int = 0,
    vllm_dtype: str | None = None,
    vllm_settings: dict | None = None,
    curriculum: dict | None = None,
    sampler_dtype: str | None = None,
):
    """GRPOTrainer with the overrides of the module docstring (TRL is imported only here).

    ``vllm_dtype``: the colocated vLLM engine's dtype (the arm's sampler dtype; None: no vLLM);
    ``vllm_settings``: its ``train.vllm`` block (None: TRL's engine arguments but dtype and seed);
    ``curriculum``: {rounds: the phase of every generation round, ranges: each phase's rows (start, stop)
    in the training dataset, steps_per_round}; ``sampler_dtype``: the HF copy's (``sampler.OwnSampler``)."""
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    from workflow_scripts.models.dtypes import torch_dtype
    from workflow_scripts.training.precision import AutocastProbe
    from workflow_scripts.training.sampler import OwnSampler, OwnSamplerMixin
    from workflow_scripts.training.sampler_gap import SamplerGapMixin

    class EpochRepeatSampler(RepeatSampler):
        """TRL's RepeatSampler draws a new permutation from its own generator at every ``__iter__``; a
        resumed run iterates fewer times, so it would replay epoch 0's order. Here ``set_epoch(e)``
        (called by the Trainer before each epoch) rewinds the generator to the state an uninterrupted
        run has at epoch e: the same orders as RepeatSampler, but reproducible from the epoch alone."""

        def set_epoch(self, epoch: int) -> None:
            if self.seed is None or not self.shuffle:
                return
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)

    class Trainer(OwnSamplerMixin, SamplerGapMixin, GRPOTrainer):  # sampler, sampler_gap: own overrides
        def __init__(self, *args, **kwargs):
            run_seed = getattr(kwargs.get("args"), "seed", None) if vllm_dtype is not None else None
            settings = vllm_settings if vllm_dtype is not None else None
            # the copy is taken before TRL patches the model's forward (its fused head is added below)
            own = OwnSampler(kwargs["model"], torch_dtype(sampler_dtype)) if sampler_dtype else None
            with vllm_engine_args(vllm_dtype, run_seed, settings) as engine_args:
                super().__init__(*args, **kwargs)
            self.vllm_engine_args = engine_args  # what the colocated engine was built with (run.json)
            if own is not None:
                own.attach(self.temperature, self.args.cast_lm_head_to_fp32, self.accelerator.device)
                self.own_sampler, self.own_sampler_probe = own, AutocastProbe(own.model)
            if getattr(self, "use_vllm", False):
                attach_colocated_sync(self.vllm_generation, engine_args)

        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            if curriculum is not None:
                return CurriculumSampler(curriculum["rounds"], curriculum["ranges"], base.mini_repeat_count,
                                         base.batch_size, base.repeat_count, base.seed)  # fmt: skip
            return EpochRepeatSampler(
                data_source=base.data_source,
                mini_repeat_count=base.mini_repeat_count,
                batch_size=base.batch_size,
                repeat_count=base.repeat_count,
                shuffle=base.shuffle,
                seed=base.seed,
            )

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._round_rewards = rewards
            return rewards

        def _draw(self, inputs, local: bool):
            """Generate and score ``inputs``; the spread of every group (``local``: this process's)."""
            # FSDP2: accelerate prepares the model without its autocast forward (prepare_model's native-amp
            # wrapper is skipped on that path) and TRL generates outside any autocast, so an autocast
            # arm's rollouts would compute in fp32 (the precision contract caught it on 2 gloo ranks)
            fsdp_autocast = self.accelerator.autocast() if self.is_fsdp_enabled else contextlib.nullcontext()
            if curriculum is not None:  # the phase the rows really came from (metrics.jsonl phase_drawn)
                self._metrics["train"]["curriculum/phase"].append(
                    sum(r["phase"] for r in inputs) / len(inputs)
                )
            with sampling_mode(self.model), fsdp_autocast:
                output = super()._generate_and_score_completions(inputs)
            # TRL gathers the rewards of every process (groups are normalised globally)
            spread = group_has_spread(self._round_rewards, self.reward_weights, self.num_generations)
            if local:
                if len(inputs) % self.num_generations:
                    raise ValueError("dynamic sampling needs whole prompt groups on every process")
                count = len(inputs) // self.num_generations
                spread = spread[self.accelerator.process_index * count :][:count]
            return output, spread

        def _total(self, value: float, reduce: str = "sum") -> float:
            """``value`` summed (or maxed) over processes: every process must call it alike."""
            gathered = self.accelerator.gather(torch.tensor([float(value)], device=self.accelerator.device))
            return float(gathered.max() if reduce == "max" else gathered.sum())

        def _refill_size(self, spreads: list, missing: int, groups: int) -> int:
            """Groups to draw in a refill: the missing ones over the spread rate seen so far (+25%).

            DAPO redraws whole batches; drawing only what is expected to fill the batch keeps the same
            filter at a fraction of the generation cost (a refill of a 90%-informative round draws ~8
            groups, not 64). Computed from totals over processes, so every process draws alike."""
            drawn = self._total(sum(s.numel() for s in spreads))
            rate = max(self._total(sum(int(s.sum()) for s in spreads)) / max(drawn, 1.0), 0.1)
            need = self._total(float(missing), "max")
            return int(min(groups, max(1, math.ceil(1.25 * need / rate))))

        def _refill_inputs(self, groups: int, refill: int) -> list[dict]:
            dataset = self.train_dataset
            start, stop = 0, len(dataset)
            if curriculum is not None:  # the phase of the round being drawn
                round_index = int(self.state.global_step) // curriculum["steps_per_round"]
                start, stop = curriculum["ranges"][curriculum["rounds"][round_index]]
            seed = (int(self.args.seed) * 1_000_003 + int(self.state.global_step)) * 1_009 + refill
            generator = torch.Generator().manual_seed(seed * 131 + self.accelerator.process_index)
            order = start + torch.randperm(stop - start, generator=generator)
            if groups > len(order):
                extra = start + torch.randint(stop - start, (groups - len(order),), generator=generator)
                order = torch.cat([order, extra])
            rows = [dataset[int(i)] for i in order[:groups]]
            return [row for row in rows for _ in range(self.num_generations)]

        def _generate_and_score_completions(self, inputs):
            if not self.model.training:  # TRL's evaluation path (unused by the stage): unchanged
                return super()._generate_and_score_completions(inputs)
            metrics = self._metrics["train"]
            if not dynamic_sampling:  # TRL's batch as is; its (global) groups counted
                output, spread = self._draw(inputs, local=False)
                metrics["dynamic/rollouts_drawn"].append(float(spread.numel()))
                metrics["dynamic/groups_kept"].append(float(spread.sum()))
                metrics["dynamic/groups_zero_spread"].append(float((~spread).sum()))
                metrics["dynamic/cap_hit"].append(0.0)
                return output
            output, spread = self._draw(inputs, local=True)
            groups = spread.numel()
            draws, spreads = [output], [spread]
            refills = 0

            # every process takes part in every draw (generation and reward gathering are collective)
            def missing() -> int:  # groups with spread still missing here (0 when full)
                return max(0, groups - sum(int(s.sum()) for s in spreads))

            while refills < max_rounds and self._total(missing(), "max") > 0:
                refills += 1
                extra_output, extra_spread = self._draw(
                    self._refill_inputs(self._refill_size(spreads, missing(), groups), refills), local=True
                )
                draws.append(extra_output)
                spreads.append(extra_spread)
            kept = [(d, g) for d, s in enumerate(spreads) for g in range(s.numel()) if s[g]][:groups]
            filler = [(d, g) for d, s in enumerate(spreads) for g in range(s.numel()) if not s[g]]
            picks = kept + filler[: groups - len(kept)]
            if picks != [(0, g) for g in range(groups)]:
                output = merge_groups(draws, picks, self.num_generations, self._tokenizer.pad_token_id)
            loss_mask = output["completion_mask"]
            if "tool_mask" in output:
                loss_mask = loss_mask * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            metrics["dynamic/rollouts_drawn"].append(self._total(sum(s.numel() for s in spreads)))
            metrics["dynamic/groups_kept"].append(self._total(len(kept)))
            metrics["dynamic/groups_zero_spread"].append(self._total(groups - len(kept)))
            metrics["dynamic/cap_hit"].append(float(self._total(float(len(kept) < groups), "max") > 0))
            return output

    return Trainer
