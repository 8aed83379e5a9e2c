"""TRL's GRPOConfig names as aliases of our knobs: the one table, and how a TRL name or value translates.

`num_generations = 8` in a TOML file (at the top level or in any section) and `--set
num_generations=8` both mean grpo.group_size = 8, as `trl.GRPOConfig(num_generations=8)` does;
`python -m grpo_core config` shows each knob's TRL name beside it. Values translate where
TRL's differ from ours (scale_rewards True/False, lr_scheduler_type, bf16, use_vllm, loss_type:
LOSS_TYPES). A TRL name with no equivalent here is one line that says so and what to set
instead (UNMAPPED), never a silently ignored setting. runs/config.py applies the table
(from_dict, parse_override, validate); tests/test_config_trl_names.py checks every name
against the installed trl.GRPOConfig.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grpo_core.errors import ConfigError

DROP = object()  # a TRL value that is our default already (fp16 = False): nothing to set

# TRL 1.16 loss_type -> ours. token = sum over every completion token / their count (TRL's bnpo;
# its dapo divides by the tokens of the whole generation batch, every process's: on one process
# with one accumulation step, and always here, where the count is summed over ranks, the same);
# sequence = the mean of per-sequence means (grpo); dr_grpo = the token sum / (rows x
# max_completion_length), Dr. GRPO's constant normaliser.
LOSS_TYPES = {"token": "token", "sequence": "sequence", "dr_grpo": "dr_grpo",
              "bnpo": "token", "dapo": "token", "grpo": "sequence"}
# TRL's other loss types: their per-token objective differs from the clipped surrogate here.
LOSS_TYPES_ELSEWHERE = ("cispo", "sapo", "luspo", "vespo")


def loss_type(value: str) -> str:
    """grpo.loss_type, TRL's names accepted -> ours; one line for a value we do not have."""
    if value in LOSS_TYPES:
        return LOSS_TYPES[value]
    also = f"TRL's {value!r} is not implemented here; " if value in LOSS_TYPES_ELSEWHERE else ""
    raise ConfigError(f"grpo.loss_type: {also}must be one of token (= TRL's bnpo and dapo), sequence (= grpo) or "
                      f"dr_grpo, got {value!r}")


def _choice(name: str, table: dict) -> Callable[[Any], Any]:
    def convert(value):
        key = value.lower() if isinstance(value, str) else value
        if key not in table:
            raise ConfigError(f"{name} = {value!r}: accepted values here are "
                              f"{', '.join(repr(k) for k in table)}")
        return table[key]
    return convert


def _top_k(value):
    """TRL's top_k: 0 (its default), -1 and None all turn top-k filtering off (here: 0)."""
    return 0 if value in (-1, None) else value


@dataclass(frozen=True)
class Alias:
    targets: tuple[str, ...]  # section.key it sets (epsilon sets both clip bounds, as in TRL)
    convert: Callable[[Any], Any] | None = None  # TRL value -> ours (DROP: nothing to set)


def _context(value):
    """TRL's vllm_max_model_length: None (its default: the model's whole context, which on CPU
    leaves no room for the KV cache) is 0 here, the context sized from the run."""
    return 0 if value is None else value


def _a(*targets: str, convert=None) -> Alias:
    return Alias(targets, convert)


ALIASES: dict[str, Alias] = {
    "num_generations": _a("grpo.group_size"),
    "max_completion_length": _a("grpo.max_new_tokens"),
    "learning_rate": _a("grpo.lr"),
    "max_steps": _a("grpo.steps"),
    "temperature": _a("grpo.temperature"),
    "top_p": _a("grpo.top_p"),
    "top_k": _a("grpo.top_k", convert=_top_k),
    "beta": _a("grpo.beta"),
    "epsilon": _a("grpo.epsilon_low", "grpo.epsilon_high"),  # TRL: epsilon_high defaults to epsilon
    "epsilon_high": _a("grpo.epsilon_high"),
    "num_iterations": _a("grpo.num_iterations"),
    "loss_type": _a("grpo.loss_type"),  # its values: LOSS_TYPES, applied by validate
    "scale_rewards": _a("grpo.scale", convert=_choice("scale_rewards", {
        "group": "group", "batch": "batch", "none": "none", True: "group", False: "none",
        "true": "group", "false": "none"})),
    "lr_scheduler_type": _a("grpo.lr_schedule", convert=_choice("lr_scheduler_type", {
        "constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"})),
    "warmup_steps": _a("grpo.warmup_steps"),
    "weight_decay": _a("grpo.weight_decay"),
    "max_grad_norm": _a("grpo.max_grad_norm"),
    "seed": _a("grpo.seed"),
    "use_vllm": _a("grpo.engine", convert=_choice("use_vllm", {True: "vllm", False: "native"})),
    "vllm_gpu_memory_utilization": _a("grpo.vllm_gpu_memory_utilization"),
    "vllm_max_model_length": _a("grpo.vllm_max_model_length", convert=_context),
    "vllm_enable_sleep_mode": _a("grpo.vllm_sleep"),
    "vllm_importance_sampling_correction": _a("grpo.vllm_importance_sampling_correction"),
    "vllm_importance_sampling_mode": _a("grpo.vllm_importance_sampling_mode"),
    "vllm_importance_sampling_clip_max": _a("grpo.vllm_importance_sampling_cap"),
    "gradient_checkpointing": _a("model.gradient_checkpointing"),
    "bf16": _a("model.dtype", convert=_choice("bf16", {True: "bfloat16", False: "float32"})),
    "fp16": _a("model.dtype", convert=_choice("fp16", {True: "float16", False: DROP})),
    "save_steps": _a("log.checkpoint_every"),
}

_BATCH = "set grpo.prompts_per_step (prompts per step) and grpo.group_size (completions per prompt) instead"
# TRL names with no knob here -> what to do instead.
UNMAPPED: dict[str, str] = {
    "per_device_train_batch_size": f"TRL counts completions per device per micro-step; {_BATCH}: prompts_per_step "
                                   "= per_device_train_batch_size x gradient_accumulation_steps x processes / "
                                   "num_generations",
    "gradient_accumulation_steps": f"{_BATCH}; micro-batches are sized by grpo.micro_batch_mb",
    "generation_batch_size": f"{_BATCH}: prompts_per_step = generation_batch_size / num_generations",
    "steps_per_generation": f"every step samples its own batch here; {_BATCH}",
    "num_train_epochs": "a run is grpo.steps steps long (the prompt stream walks the data epoch after epoch)",
    "reward_weights": "name each metric's weight in reward.weights (--set reward.weights.NAME=W)",
    "multi_objective_aggregation": "the reward here is the weighted sum of the metrics, normalised after the sum "
                                   "(TRL's default, sum_then_normalize)",
    "importance_sampling_level": "the importance ratio here is per token (TRL's default, token)",
    "mask_truncated_completions": "not implemented here: truncated completions train like the others",
    "top_entropy_quantile": "not implemented here: every completion token trains",
    "use_bias_correction_kl": "the KL term here is k3 without the importance-ratio factor",
    "min_p": "not implemented here: only top_p (--set top_p=...)",
    "repetition_penalty": "not implemented here",
    "delta": "not implemented here: the ratio is clipped two-sided by epsilon only",
    "vllm_mode": "vLLM runs in the trainer's process here (TRL's colocate): --set use_vllm=true",
    "sync_ref_model": "the reference model here is the starting policy, never synced",
    "logging_steps": "every step is logged here",
    "output_dir": "runs go to log.runs_dir (--set log.runs_dir=...)",
    "report_to": "the run store is always written; a W&B mirror is log.wandb",
}


def known_name(name: str) -> bool:
    return name in ALIASES or name in UNMAPPED


def translate(name: str, value: Any) -> list[tuple[str, str, Any]]:
    """A TRL name and its value -> [(section, key, our value)]; one line when it has no equivalent."""
    if name in UNMAPPED:
        raise ConfigError(f"{name}: TRL's {name} has no equivalent here: {UNMAPPED[name]}")
    alias = ALIASES[name]
    value = alias.convert(value) if alias.convert else value
    if value is DROP:
        return []
    return [(*target.split("."), value) for target in alias.targets]


def names_for(key: str) -> list[str]:
    """The TRL names of the knob `section.key` (what `config` shows beside it)."""
    return [name for name, alias in ALIASES.items() if key in alias.targets]


def resolve(data: dict, fields: dict[str, set[str]]) -> dict:
    """A TOML config dict with TRL names (at the top level, or in a section where the name is not
    one of its own keys: `[grpo] temperature` is ours) moved to our keys. `fields`: section ->
    its keys. A TRL name and our key for the same knob, set to different values, is an error."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    found = []
    for key in [k for k, v in out.items() if not isinstance(v, dict) and known_name(k)]:
        found.append((key, key, out.pop(key)))
    for sec, values in out.items():
        if isinstance(values, dict) and sec in fields:
            for key in [k for k in values if k not in fields[sec] and known_name(k)]:
                found.append((f"{sec}.{key}", key, values.pop(key)))
    set_by: dict[tuple[str, str], str] = {}
    for where, name, value in found:
        for sec, key, ours in translate(name, value):
            section = out.setdefault(sec, {})
            if name == "epsilon" and key == "epsilon_high" and key in section:
                continue  # epsilon_high set too: it wins over epsilon, as in TRL
            if key in section and section[key] != ours and (sec, key) not in set_by:
                raise ConfigError(f"{where} (TRL's name for {sec}.{key}) = {value!r} and {sec}.{key} = "
                                  f"{section[key]!r} are both set: keep one")
            section[key] = ours
            set_by[(sec, key)] = name
    return out
