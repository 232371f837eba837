"""train.curriculum: the config checks, the phase schedule and the sampler that draws each round from its
phase (the workflow test tests/workflow/test_curriculum.py runs it end to end)."""

from __future__ import annotations

import copy

import pytest
from conftest import load_test_config

from workflow_scripts.runtime.config import ConfigError, validate_config
from workflow_scripts.training.curriculum import phase_of_step, phases, round_phases, steps_per_round
from workflow_scripts.training.grpo_trainer import CurriculumSampler


def config_with(curriculum, **train) -> dict:
    config = copy.deepcopy(load_test_config())
    config["train"].update(max_steps=8, curriculum=curriculum, **train)
    return config


def test_schedule_of_two_phases():
    train = validate_config(
        config_with([{"family": "add_sub_small", "steps": 4}, {"source": "train", "steps": 4}])
    )["train"]
    assert steps_per_round(train) == 2  # steps_per_generation 2, gradient_accumulation_steps 1
    assert [phase_of_step(train, s) for s in range(9)] == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert round_phases(train) == [0, 0, 1, 1]
    assert phases(train)[0]["n"] == 2000 and phases(train)[1]["source"] == "train"
    assert phase_of_step({"curriculum": []}, 3) is None


@pytest.mark.parametrize(
    "curriculum,train,message",
    [
        ([{"family": "add_sub_small", "steps": 4}], {}, r"train.curriculum: the phases' steps add up to 4"),
        ([{"family": "add_sub_small", "steps": 3}, {"source": "train", "steps": 5}], {},
         r"train.curriculum.0.steps: must be a multiple of .* one generation round \(2\)"),
        ([{"family": "mcq", "steps": 8}], {}, r"curriculum.0.family: mcq rows have verifier kind 'mcq'"),
        ([{"steps": 8}], {}, r"train.curriculum.0.family: required when source is 'synthetic'"),
        ([{"source": "train", "family": "mul", "steps": 8}], {}, r"train.curriculum.0.family: only for"),
        ([{"source": "gsm8k", "steps": 8}], {}, r"train.curriculum.0.source: a real phase source must be"),
        ([{"family": "add_sub_small", "steps": 8, "size": 3}], {}, r"train.curriculum.0.size: unknown key"),
    ],
)  # fmt: skip
def test_bad_curricula_are_refused_naming_the_field(curriculum, train, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(config_with(curriculum, **train))


def test_sampler_draws_each_round_from_its_phase_and_repeats_like_trls():
    ranges = [(0, 5), (5, 105)]  # phase 0: 5 rows (fewer than a round's 3 prompts twice: permutations chain)
    sampler = CurriculumSampler(
        [0, 0, 0, 1, 1], ranges, mini_repeat_count=2, batch_size=3, repeat_count=2, seed=7
    )
    drawn = list(sampler)
    assert len(drawn) == len(sampler) == 5 * 3 * 2 * 2
    rounds = [drawn[i : i + 12] for i in range(0, len(drawn), 12)]
    for phase, chunk in zip([0, 0, 0, 1, 1], rounds, strict=True):
        prompts = chunk[:6:2]
        assert chunk == [p for p in prompts for _ in range(2)] * 2  # TRL's layout: mini repeats, then repeats
        start, stop = ranges[phase]
        assert all(start <= p < stop for p in prompts)
    phase0 = [p for chunk in rounds[:3] for p in chunk[:6:2]]
    assert sorted(phase0[:5]) == [0, 1, 2, 3, 4]  # a whole permutation of the phase before any repeat
    assert drawn == list(CurriculumSampler([0, 0, 0, 1, 1], ranges, 2, 3, 2, seed=7))  # the seed alone
    assert drawn != list(CurriculumSampler([0, 0, 0, 1, 1], ranges, 2, 3, 2, seed=8))
    # phase 1's draws do not depend on how long phase 0 lasts
    longer = list(CurriculumSampler([0, 0, 0, 0, 1, 1], ranges, 2, 3, 2, seed=7))
    assert longer[-24:] == drawn[-24:]
