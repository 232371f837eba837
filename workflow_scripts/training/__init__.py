"""What a training run does around TRL: GRPO config and trainer, precision modes and their numerics,
optimizers, multi-process launch, checkpoints, metrics, health. Imports nothing: import the module you
need.
"""
