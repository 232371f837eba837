"""The TRL reward adapter: a verifier kind as a GRPOTrainer reward function.

TRL 1.16 calls ``f(prompts=..., completions=..., completion_ids=..., **reward_kwargs)`` where the
keyword lists are the dataset's columns (``answer``, ``meta``, ``kind`` ...) plus ``trainer_state``,
``log_metric`` and ``log_extra``. The reward is 1.0 if ``verifiers.verify_batch`` says correct, else
0.0; the fractions of timeouts / no-answers / errors go to ``log_metric``. A module-level class (not
a closure) so the reward function pickles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from workflow_scripts.verify import verifiers


class RewardFunction:
    """``f(prompts, completions, answer, **kwargs) -> list[float]`` for one verifier kind."""

    def __init__(
        self, kind: str, timeout: float = 5.0, workers: int = 1, settings: Mapping | None = None
    ) -> None:
        verifiers.check_settings(kind, settings)
        self.kind = kind
        self.timeout = timeout
        self.workers = workers
        self.settings = dict(settings or {})
        self.__name__ = f"{kind}_reward"

    def __call__(self, prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
        if completions is None:
            raise ValueError(f"{self.__name__}: no completions passed")
        if answer is None:
            raise ValueError(f"{self.__name__}: the dataset needs an 'answer' column")
        kinds = kwargs.get("kind")
        if kinds is not None and any(k != self.kind for k in kinds):
            raise ValueError(f"{self.__name__}: batch has rows of kind {sorted(set(kinds))}")
        metas = kwargs.get("meta")
        verdicts = verifiers.verify_batch(
            self.kind,
            list(completions),
            [str(a) for a in answer],
            list(metas) if metas is not None else None,
            timeout=self.timeout,
            workers=self.workers,
            prompts=list(prompts) if prompts is not None else None,
            settings=self.settings,
        )
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and verdicts:
            for status in ("timeout", "no_answer", "error"):
                frac = sum(v.status == status for v in verdicts) / len(verdicts)
                log_metric(f"verifier/{self.kind}/{status}_frac", frac)
        return [1.0 if v.correct else 0.0 for v in verdicts]

    def __repr__(self) -> str:
        return f"RewardFunction(kind={self.kind!r}, timeout={self.timeout}, workers={self.workers})"


def make_reward_function(
    kind: str, timeout: float = 5.0, workers: int = 1, settings: Mapping | None = None
) -> Callable[..., list[float]]:
    """The TRL reward function for ``kind`` (named ``f"{kind}_reward"`` in TRL's logs)."""
    return RewardFunction(kind, timeout=timeout, workers=workers, settings=settings)
