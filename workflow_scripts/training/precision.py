"""Precision modes: one config entry (``precisions.<name>``) -> everything numeric a training run does.

A mode is data. ``PrecisionMode.from_config`` reads it; the train stage applies it through the
functions below and nowhere else, so a new arm (fp16 autocast, bf16 autocast over fp32 masters, ...)
is a new config entry, never a code change.

| mode field    | what it switches                                                        | applied by       |
|---------------|-------------------------------------------------------------------------|------------------|
| param_dtype   | dtype the policy is loaded in = dtype of the master weights, their      | load_policy      |
|               | gradients and AdamW's states (exp_avg/exp_avg_sq are created like the   | (modeling.       |
|               | parameter: bfloat16 masters => bfloat16 optimizer state, no fp32 copy   | load_model),     |
|               | anywhere). Checked at start and end: any trainable tensor of another    | check_param_     |
|               | dtype is an error. The saved weights are read back from the safetensors | dtypes,          |
|               | headers and checked too.                                                | check_saved_     |
|               |                                                                         | dtypes           |
| autocast      | null: no autocast anywhere. TRL's GRPOConfig turns bf16 autocast ON by  | trainer_         |
|               | default, so bf16=False, fp16=False are ALWAYS passed. bfloat16/float16: | precision_args,  |
|               | accelerate's native mixed precision (bf16=True / fp16=True), i.e.       | check_supported, |
|               | torch.autocast around every forward over param_dtype masters (fp16 adds | AutocastProbe    |
|               | a GradScaler). Only over float32 masters; autocast float32 is rejected. |                  |
|               | accelerate skips fp16 on CPU (no autocast, no scaler: a silent fp32     | enable_cpu_fp16  |
|               | run); there torch's CPU autocast and GradScaler are switched on by hand.|                  |
|               | The run OBSERVES the autocast state inside the first training forward.  |                  |
| deterministic | true: torch.use_deterministic_algorithms(True), cuDNN deterministic and | apply_           |
|               | no benchmark, CUBLAS_WORKSPACE_CONFIG=:4096:8 and                       | determinism      |
|               | FLASH_ATTENTION_DETERMINISTIC=1 (CUDA). false: all explicitly off (the  |                  |
|               | switch is process-global; a previous run's setting never leaks). Seeds  |                  |
|               | come from the run's seed either way. transformers' full_determinism is  |                  |
|               | NOT used: it also sets CUDA_LAUNCH_BLOCKING=1, which serialises every   |                  |
|               | kernel launch on a GPU; the rest of what it does is done here.          |                  |
|               | torch's NaN fill of uninitialized memory stays off (35% of an fp32 CPU  |                  |
|               | step; no result of a kernel that writes its output depends on it).      |                  |
| dropout       | every ``*dropout*`` key of the model config (Llama: attention_dropout;  | load_policy      |
|               | other architectures: hidden/embedding/residual dropouts) set to this    |                  |
|               | value; TRL's disable_dropout stays off so the config value is what runs.|                  |
|               | Dropout acts ONLY in the loss forward: rollouts and the old-log-prob    | grpo_trainer.    |
|               | pass run in eval mode (``grpo_trainer.sampling_mode``), as vLLM samples |  sampling_mode   |
|               | at paper scale. (TRL alone samples in train mode: at the base, dropout  |                  |
|               | 0.1 cut rollout reward 0.117 -> 0.023.) The KL log and evaluation       |                  |
|               | sample in eval mode too.                                                |                  |
| (sharded)     | train.distributed.strategy fsdp (FSDP2) keeps every arm's meaning: the  | fsdp_mixed_      |
|               | shards are param_dtype (fp32 arm: fp32 shards, no mixed precision; bf16 |  precision       |
|               | arm: bf16 shards, gradients and AdamW state) and FSDP casts nothing: an |                  |
|               | autocast arm all-gathers its fp32 shards in fp32 and accelerate's       |                  |
|               | torch.autocast lowers the matmuls to bf16, as in one process; gradients |                  |
|               | stay fp32 and are reduce-scattered in fp32 (accelerate's own bf16 policy|                  |
|               | would gather bf16 copies and reduce gradients in bf16: another arm).    |                  |
| (always)      | TF32 off (allow_tf32=False for matmul and cuDNN, float32 matmul         | apply_           |
|               | precision "highest"): a float32 arm computes in IEEE fp32 on Ampere+.   | determinism      |
| bf16_matmul   | auto / native / emulated: how the bf16 matrix products of an arm that   | matmul_path,     |
|               | computes in bf16 run (``bf16_matmul``: bf16 operands -> fp32 GEMM ->    | bf16_matmul.     |
|               | bf16 result, the native kernels' contract at fp32 speed). auto =        |  bf16_matmul     |
|               | emulated where torch reports a CPU without bf16 GEMM kernels.           |                  |
| rounding      | nearest (TRL's AdamW) / stochastic: AdamW's update in fp32, written to  | optimizers       |
|               | the bf16 masters by stochastic rounding (bfloat16 masters only).        |                  |
| update_noise  | null or X: Gaussian noise of std X times the bf16 spacing of each       | optimizers       |
|               | weight added after every optimizer step (a positive-control arm).       |                  |
| control       | null / negative / positive: a label the analysis reads; changes nothing.| (analysis)       |
| seed_offset   | the arm trains seed s with s + seed_offset (a negative-control twin's   | train_seed       |
|               | own seeds; its runs keep their names).                                  |                  |
| lm_head_dtype | null (= param_dtype) or float32: the LM head's weights (and so its      | load_policy,     |
|               | gradients and AdamW states) in fp32, its logits computed in fp32        | trainer_         |
|               | outside autocast (TRL's cast_lm_head_to_fp32, ScaleRL).                 |  precision_args  |
| sampler_dtype | the rollout sampler's own weights dtype (null: it computes as the       | training.sampler |
|               | trainer); importance_correction: the arm's IS correction mode (null:    |                  |
|               | train.importance_sampling). Both act through ``training.sampler``.      |                  |
| (contract)    | every dtype the arm implies, checked at the first optimizer step (params| ContractCheck    |
|               | and gradients before it, AdamW states after it), LM head, autocast and  |                  |
|               | rollout dtype observed, FSDP reduce dtype, vLLM engine and KV cache:    |                  |
|               | any difference is an error naming the arm and the field; run.json keeps |                  |
|               | expected and observed.                                                  |                  |

On CPU the kernels used here are deterministic anyway (same (mode, seed) => bit-identical weights,
tested for the fp32 arm); the flag matters on GPUs, where it needs checking there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from workflow_scripts.models.dtypes import dtype_name, from_safetensors, torch_dtype
from workflow_scripts.models.modeling import dropout_keys, load_model, set_head_dtype
from workflow_scripts.runtime.config import check_precision
from workflow_scripts.training import bf16_matmul


class PrecisionError(RuntimeError):
    """A precision mode that cannot be honoured (unsupported on this device, or a dtype check failed)."""


@dataclass(frozen=True)
class PrecisionMode:
    name: str
    param_dtype: str
    autocast: str | None = None
    deterministic: bool = False
    dropout: float = 0.0
    bf16_matmul: str = "auto"
    rounding: str = "nearest"
    update_noise: float | None = None
    control: str | None = None
    lm_head_dtype: str | None = None
    seed_offset: int = 0
    sampler_dtype: str | None = None
    importance_correction: str | None = None

    @classmethod
    def from_config(cls, name: str, entry: Mapping) -> PrecisionMode:
        noise = entry.get("update_noise")
        mode = cls(
            name=name,
            param_dtype=entry["param_dtype"],
            autocast=entry.get("autocast"),
            deterministic=bool(entry.get("deterministic", False)),
            dropout=float(entry.get("dropout", 0.0)),
            bf16_matmul=entry.get("bf16_matmul", "auto"),
            rounding=entry.get("rounding", "nearest"),
            update_noise=None if noise is None else float(noise),
            control=entry.get("control"),
            lm_head_dtype=entry.get("lm_head_dtype"),
            seed_offset=int(entry.get("seed_offset", 0)),
            sampler_dtype=entry.get("sampler_dtype"),
            importance_correction=entry.get("importance_correction"),
        )
        check_precision(name, entry)  # the config's rules between an arm's keys (config.py), ConfigError
        torch_dtype(mode.param_dtype)
        for name_ in (mode.autocast, mode.lm_head_dtype, mode.sampler_dtype):
            if name_ is not None:
                torch_dtype(name_)
        return mode

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return torch_dtype(self.param_dtype)

    @property
    def torch_autocast_dtype(self) -> torch.dtype | None:
        return torch_dtype(self.autocast) if self.autocast else None

    @property
    def head_dtype(self) -> str:
        """The LM head's storage dtype (``lm_head_dtype``, else ``param_dtype``)."""
        return self.lm_head_dtype or self.param_dtype

    @property
    def compute_dtype(self) -> str:
        """The dtype the trainer's products compute in: the autocast dtype, else the masters'."""
        return self.autocast or self.param_dtype

    @property
    def sampler_copies(self) -> bool:
        """Whether the sampler holds its own weights in another numerics than the trainer computes with
        (``sampler_dtype`` set and not just the masters' dtype of an arm without autocast)."""
        own = self.sampler_dtype
        return own is not None and not (own == self.param_dtype and self.autocast is None)

    @property
    def sampler_compute_dtype(self) -> str:
        """The dtype rollouts are computed in: ``sampler_dtype``, else the trainer's compute dtype."""
        return self.sampler_dtype or self.compute_dtype

    @property
    def computes_bf16(self) -> bool:
        """Whether the arm's matrix products run in bf16 (bf16 masters, or bf16 autocast)."""
        return "bfloat16" in (self.param_dtype, self.autocast)

    def as_dict(self) -> dict:
        return asdict(self)


def mode_from_config(config: Mapping, name: str) -> PrecisionMode:
    try:
        entry = config["precisions"][name]
    except KeyError as err:
        raise PrecisionError(
            f"unknown precision {name!r}; configured: {sorted(config['precisions'])}"
        ) from err
    return PrecisionMode.from_config(name, entry)


def check_supported(mode: PrecisionMode, device_type: str) -> None:
    """Fail early and clearly where the device cannot run the mode honestly."""
    if mode.autocast == "float16" and device_type not in ("cuda", "cpu"):
        raise PrecisionError(
            f"precision {mode.name!r}: float16 autocast (AMP with a GradScaler) runs on CUDA or CPU "
            f"(``enable_cpu_fp16``); this run is on {device_type!r}"
        )
    if (
        device_type == "cuda"
        and "bfloat16" in (mode.param_dtype, mode.autocast)
        and not torch.cuda.is_bf16_supported()
    ):
        raise PrecisionError(f"precision {mode.name!r}: this GPU does not support bfloat16")


def trainer_precision_args(mode: PrecisionMode) -> dict:
    """The GRPOConfig / TrainingArguments fields a mode sets (bf16 and fp16 are ALWAYS passed explicitly)."""
    return {
        "bf16": mode.autocast == "bfloat16",
        "fp16": mode.autocast == "float16",
        "disable_dropout": False,
        # see the module docstring: apply_determinism does it without CUDA_LAUNCH_BLOCKING
        "full_determinism": False,
        # TRL's fp32 LM head (its forward casts the hidden states and runs outside autocast)
        "cast_lm_head_to_fp32": mode.lm_head_dtype == "float32",
    }


def enable_cpu_fp16(accelerator) -> bool:
    """Switch on fp16 autocast and a loss scaler where accelerate would silently run fp32: on CPU.

    accelerate 1.15 turns native AMP and its GradScaler on for ``mixed_precision="fp16"`` only off CPU;
    on CPU it leaves both off, so an fp16 arm would train in fp32 unnoticed (the contract would then
    fail on the autocast field). Torch has both on CPU (``torch.autocast("cpu", float16)``,
    ``torch.amp.GradScaler("cpu")``), so they are set on the accelerator before ``train()`` prepares the
    model (its forward is wrapped in ``accelerator.autocast``) and the optimizer (it gets the scaler).
    Returns whether it changed anything."""
    if accelerator.state.mixed_precision != "fp16" or accelerator.device.type != "cpu" or accelerator.scaler:
        return False
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")
    return True


def train_seed(mode: PrecisionMode, seed: int) -> int:
    """The seed the arm's run ``seed`` trains with (prompt order, sampling, rounding and noise streams)."""
    return int(seed) + mode.seed_offset


def matmul_path(mode: PrecisionMode, device_type: str) -> str:
    """The path the arm's bf16 products take here ("native" or "emulated"; "native" when it has none)."""
    return bf16_matmul.resolve(mode.bf16_matmul, device_type) if mode.computes_bf16 else "native"


def fsdp_mixed_precision(mode: PrecisionMode):
    """FSDP2's mixed-precision policy for the arm (accelerate's plugin ``mixed_precision_policy``).

    Always the no-cast policy, passed explicitly: when the Trainer asks accelerate for bf16/fp16 (an
    autocast arm), accelerate's ``set_mixed_precision`` would otherwise install param_dtype = reduce_dtype
    = bf16 (bf16 copies of the weights in the forward, gradients averaged in bf16), which is not what
    the arm means. With it, each arm's shards are its param_dtype and autocast alone lowers precision.
    accelerate also upcasts non-fp32 trainable params to fp32 under mixed precision (fsdp2_prepare_model);
    that touches only autocast arms, whose masters are fp32 already (and the end-of-run dtype check would
    catch anything else).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    del mode  # the same for every arm: the point is that FSDP adds no casting of its own
    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, output_dtype=None)


def apply_determinism(mode: PrecisionMode) -> dict:
    """Set (or explicitly unset) the process-global determinism switches; return what was set."""
    if mode.deterministic:
        # must be in place before the first cuBLAS handle is created (i.e. before the model moves to the GPU)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    else:
        os.environ.pop("FLASH_ATTENTION_DETERMINISTIC", None)
    torch.use_deterministic_algorithms(mode.deterministic)
    # deterministic mode also NaN-fills every torch.empty (to expose kernels that read memory they
    # never wrote); that fill was 35% of an fp32 CPU training step (TRL's fused log-prob head allocates
    # per tile) and changes no result of a kernel that writes its output, so it stays off
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = mode.deterministic
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {
        "use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32": False,
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
    }


def load_policy(model_dir: str | os.PathLike, mode: PrecisionMode, trust_remote_code: bool = False):
    """The policy in ``param_dtype`` with the mode's dropout on every dropout key (the caller checks the
    dtypes once with ``check_param_dtypes`` and records them). With ``lm_head_dtype`` the head is cast
    after loading, as TRL's cast_lm_head_to_fp32 does: its values start as the base's in param_dtype, so
    the arm starts exactly from base-<param_dtype>."""
    model = load_model(model_dir, mode.param_dtype, trust_remote_code=trust_remote_code, dropout=mode.dropout)
    if mode.head_dtype != mode.param_dtype:
        try:
            set_head_dtype(model, mode.head_dtype)
        except ValueError as err:
            raise PrecisionError(f"precision {mode.name!r}: lm_head_dtype: {err}") from err
    return model


def head_param_names(model) -> set[str]:
    """Names of the LM head's parameters (as in named_parameters and in the saved state dict)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return set()
    ids = {id(p) for p in head.parameters()}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def expected_dtype(mode: PrecisionMode, name: str, head_names: set[str]) -> str:
    """The dtype the arm stores tensor ``name`` in: the head's (``head_dtype``) or ``param_dtype``."""
    return mode.head_dtype if name in head_names else mode.param_dtype


def trainable_dtypes(model) -> dict[str, str]:
    return {name: dtype_name(p.dtype) for name, p in model.named_parameters() if p.requires_grad}


def check_param_dtypes(model, mode: PrecisionMode) -> dict[str, str]:
    """Every trainable tensor must be ``param_dtype`` (the LM head's: ``head_dtype``); raise (listing the
    offenders) otherwise."""
    dtypes = trainable_dtypes(model)
    if not dtypes:
        raise PrecisionError("the model has no trainable parameters")
    heads = head_param_names(model)
    wrong = {n: d for n, d in dtypes.items() if d != expected_dtype(mode, n, heads)}
    if wrong:
        shown = ", ".join(f"{n}={d}" for n, d in list(wrong.items())[:8])
        want = mode.param_dtype
        if mode.head_dtype != mode.param_dtype:
            want += f" (LM head {mode.head_dtype})"
        raise PrecisionError(
            f"precision {mode.name!r}: {len(wrong)}/{len(dtypes)} trainable tensors are not {want}: {shown}"
        )
    return dtypes


def model_dropouts(model) -> dict[str, float]:
    return {k: getattr(model.config, k) for k in dropout_keys(model.config)}


def saved_dtypes(model_dir: str | os.PathLike) -> dict[str, str]:
    """Tensor name -> dtype as written in the safetensors files of ``model_dir`` (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise PrecisionError(f"{model_dir}: no safetensors files")
    out: dict[str, str] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a Mapping
                code = fh.get_slice(key).get_dtype()
                out[key] = from_safetensors(code)
    return out


def check_saved_dtypes(
    model_dir: str | os.PathLike, mode: PrecisionMode, head_names: set[str] = frozenset()
) -> dict[str, str]:
    """Every tensor written to ``model_dir`` must be ``param_dtype`` (the LM head's tensors ``head_names``:
    ``head_dtype``), read from the safetensors headers."""
    written = saved_dtypes(model_dir)
    wrong = {n: d for n, d in written.items() if d != expected_dtype(mode, n, set(head_names))}
    if wrong:
        raise PrecisionError(
            f"{model_dir}: saved tensors not in {mode.param_dtype}: {sorted(wrong.items())[:8]}"
        )
    return written


def summarize_dtypes(dtypes: Mapping[str, str]) -> dict[str, int]:
    """dtype -> count of tensors."""
    counts: dict[str, int] = {}
    for d in dtypes.values():
        counts[d] = counts.get(d, 0) + 1
    return dict(sorted(counts.items()))


def autocast_context(mode: PrecisionMode, device_type: str):
    """``torch.autocast`` for the mode (or a null context), for forwards run outside the trainer."""
    if mode.autocast is None:
        return contextlib.nullcontext()
    check_supported(mode, device_type)
    return torch.autocast(device_type=device_type, dtype=mode.torch_autocast_dtype)


class AutocastProbe:
    """Records, from inside the first gradient-enabled forward of ``model``, whether autocast is on (and,
    in ``sampling``, the same from the first no-grad forward: the dtype rollouts compute in).

    A forward hook on the last linear layer of the network body (not ``lm_head``: TRL computes the
    log-probs with a fused head that never calls that module), i.e. inside whatever autocast context
    wraps the model's forward (accelerate patches ``model.forward`` itself, so a hook on the top module
    would run after that context has exited). It reads ``torch.is_autocast_enabled(device)``, the
    autocast dtype and the dtype that layer actually computed in: what really happened, not what the
    config asked for. The hook removes itself once both are seen, so it costs nothing afterwards.
    """

    def __init__(self, model) -> None:
        self.record: dict | None = None
        self.sampling: dict | None = None  # the same, from the first no-grad forward (a rollout)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linears = [
            (n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head
        ]
        if not linears:
            raise PrecisionError("AutocastProbe: the model has no linear layer to observe")
        self.layer_name, layer = linears[-1]
        self._paused = False
        self._handle = layer.register_forward_hook(self._hook)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards inside are not the run's (the held-out curve's sampling): not recorded."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def _hook(self, module, args, output) -> None:
        if self._paused:
            return
        training = torch.is_grad_enabled()
        if (self.record if training else self.sampling) is not None:
            return
        device_type = output.device.type
        enabled = torch.is_autocast_enabled(device_type)
        seen = {
            "enabled": enabled,
            "dtype": dtype_name(torch.get_autocast_dtype(device_type)) if enabled else None,
            "layer": self.layer_name,
            "layer_output_dtype": dtype_name(output.dtype),
            "device": device_type,
        }
        if training:
            self.record = seen
        else:
            self.sampling = seen
        if self.record is not None and self.sampling is not None:
            self._handle.remove()

    def close(self) -> None:
        self._handle.remove()
