"""The ``bf16_matmul`` setting an evaluate job runs with: the one its run was trained with.

An evaluation of a bf16 model should take the same matrix-product path as its training (precision field
``bf16_matmul``: native / emulated / auto, ``training.bf16_matmul``), so a trained run's pass@1 and KL
are measured on the numerics it was trained on. Base runs serve several arms:

| run                     | setting                                                                  |
| ----------------------- | ------------------------------------------------------------------------ |
| ``<precision>-s<seed>`` | the arm's ``bf16_matmul`` (repeats ``-r<k>`` too)                        |
| base run in bfloat16    | the setting shared by every arm whose param_dtype is bfloat16 (the arms  |
| (``base-bfloat16``, or  | it is the reference of); arms that disagree are a config error           |
| ``base`` when           | (``problems``): one base evaluation cannot take two paths, and a dJ      |
| model.dtype is bf16)    | paired across paths would carry the path difference                      |
| any other base run      | ``auto``: it has no bf16 product, so no arm's setting reruns it          |

Torch-free (the Snakefile imports it while parsing; rules/common.smk ``evaluate_matmul``).
"""

from collections.abc import Iterator, Mapping

from workflow_scripts.runtime import paths

BF16 = "bfloat16"
DEFAULT = "auto"  # the schema's default of precisions.<arm>.bf16_matmul


def _setting(mode: Mapping) -> str:
    return str(mode.get("bf16_matmul") or DEFAULT)


def _bf16_arms(config: Mapping) -> dict[str, str]:
    """Arm -> bf16_matmul of the arms whose param dtype is bfloat16 (the arms of the bf16 base run)."""
    return {name: _setting(m) for name, m in config["precisions"].items() if m["param_dtype"] == BF16}


def problems(config: Mapping) -> Iterator[tuple[str, str]]:
    """(dotted key, what is wrong) when the bf16 arms disagree on ``bf16_matmul`` (config.py's Problem)."""
    arms = _bf16_arms(config)
    if len(set(arms.values())) > 1:
        listed = ", ".join(f"{a}: {s}" for a, s in arms.items())
        base = paths.base_run(BF16, config["model"]["dtype"])
        for arm in arms:
            yield (
                f"precisions.{arm}.bf16_matmul",
                f"the arms with param_dtype bfloat16 share one reference evaluation ({base}) but set "
                f"different bf16_matmul ({listed}); give them one setting",
            )


def bf16_matmul(config: Mapping, run: str) -> str:
    """The ``bf16_matmul`` choice the evaluate job of ``run`` passes to ``evaluate.run``; ValueError on
    a config whose bf16 arms disagree (``problems``)."""
    parsed = paths.parse_run(run)
    if not parsed.is_base:
        return _setting(config["precisions"][parsed.precision])
    if (parsed.dtype or config["model"]["dtype"]) != BF16:
        return DEFAULT
    found = list(problems(config))
    if found:
        raise ValueError(f"{found[0][0]}: {found[0][1]}")
    return next(iter(_bf16_arms(config).values()), DEFAULT)
