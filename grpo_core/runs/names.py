"""The metric names: the one place they are spelled.

Compatible with ART (`data/...`) and TRL (`reward`, `reward_std`,
`frac_reward_zero_std`) where the two overlap; see docs/design.md. Everything
else (store, charts, reports, wandb mirror, importers) imports from here.
"""

# --- groups: how much of the step's compute could carry a signal --------------
GROUPS_SUBMITTED = "data/step_num_groups_submitted"
GROUPS_TRAINABLE = "data/step_num_groups_trainable"
CUM_GROUPS_SUBMITTED = "data/cum/num_groups_submitted"
CUM_GROUPS_TRAINABLE = "data/cum/num_groups_trainable"
SCORING_ERRORS = "data/scoring_errors"  # rollouts whose metric raised or gave NaN/inf
SAMPLING_BATCHES = "data/sampling_batches"  # prompt batches drawn (dynamic sampling)
SKIPPED_PROMPTS = "data/skipped_prompts"  # drawn, skipped before sampling (grpo.skip_zero_variance)
CUM_SKIPPED_PROMPTS = "data/cum/skipped_prompts"

# --- health -------------------------------------------------------------------
# Non-trainable groups split by why (step_stats.group_outcomes): every completion right / every one wrong.
GROUPS_SOLVED = "health/groups_all_solved"
GROUPS_UNSOLVED = "health/groups_none_solved"
TRAINABLE_RATIO = "health/trainable_ratio"
CUM_TRAINABLE_RATIO = "health/cum_trainable_ratio"
PHANTOM_GROUPS = "health/phantom_groups"
# Groups counted trainable whose reward spread is float rounding (step_stats.float_noise): TRL
# trains them, on advantages made of rounding error. The stricter view beside TRL's count.
NOISE_GROUPS = "health/float_noise_groups"
MIN_GROUP_STD = "health/min_group_std"  # the threshold in force at this step
DIFFICULTY = "health/difficulty"  # the task level in force at this step

# --- compute: sampling spent on groups that taught nothing (step_stats.wasted_compute) -----
WASTED_TOKENS = "compute/wasted_tokens"  # completion tokens of the step's non-trainable groups
WASTED_SAMPLING_S = "time/wasted_sampling_s"  # the step's sampling seconds, shared out by tokens
CUM_SAMPLED_TOKENS = "compute/cum/sampled_tokens"
CUM_WASTED_TOKENS = "compute/cum/wasted_tokens"
WASTED_SHARE = "compute/cum_wasted_share"  # cumulative wasted / sampled tokens

# --- reward -------------------------------------------------------------------
REWARD = "train/reward"
REWARD_STD = "train/reward_std"  # mean within-group std of the total reward
FRAC_REWARD_ZERO_STD = "frac_reward_zero_std"  # TRL's name: 1 - trainable ratio


def metric_mean(metric: str) -> str:
    return f"reward/{metric}/mean"


def metric_group_std(metric: str) -> str:
    return f"reward/{metric}/group_std"


def metric_weight(metric: str) -> str:
    return f"reward/{metric}/weight"


def metric_batch_std(metric: str) -> str:
    """Std of the metric over *all* completions of a step (TRL's `rewards/<fn>/std`): it mixes
    between-prompt and within-group spread, so it is kept apart from `group_std`."""
    return f"reward/{metric}/batch_std"


def parse_metric_name(name: str) -> tuple[str, str] | None:
    """`reward/<metric>/<field>` -> (metric, field); None for any other name."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "reward" and parts[2] in ("mean", "group_std", "weight"):
        return parts[1], parts[2]
    return None


# --- held-out evaluation (eval.every) ---------------------------------------------
EVAL_REWARD = "eval/reward"  # mean weighted total over the held-out completions, the weights in force
EVAL_PASS = "eval/pass@1"  # share of held-out completions whose pass metric scored 1 (greedy: of prompts)
TIME_EVAL = "time/eval_s"


def eval_metric_mean(metric: str) -> str:
    return f"eval/{metric}/mean"


# --- imported or mirrored from other trainers -----------------------------------
# TRL's `reward_std`: in TRL 1.x the std of the total reward over all completions of the
# step (Bessel-corrected), not the mean within-group std that REWARD_STD is; kept apart.
TRL_REWARD_STD = "trl/reward_std"


def foreign(source: str, key: str) -> str:
    """A metric another trainer logged that has no equivalent here, kept under its own
    name in the source's namespace (`trl/learning_rate`, `wandb/train/exception_rate`)."""
    return f"{source}/{key}"


# --- loss ---------------------------------------------------------------------
LOSS_POLICY = "loss/policy"
LOSS_KL = "loss/kl"
LOSS_ENTROPY = "loss/entropy"
GRAD_NORM = "loss/grad_norm"
CLIP_RATIO = "loss/clip_ratio"
LEARNING_RATE = "optim/learning_rate"  # the rate of the step's update (grpo.lr x the schedule's factor)

# --- completions, time, throughput ----------------------------------------------
COMPLETION_MEAN_LENGTH = "completions/mean_length"
TIME_STEP = "time/step_s"
TIME_GENERATE = "time/generate_s"
TIME_SCORE = "time/score_s"
TIME_TRAIN = "time/train_s"
TIME_LOG = "time/log_s"  # store + mirror writes of the previous step
THROUGHPUT_TOKENS = "throughput/tokens_per_s"
TIME_WEIGHT_SYNC = "time/weight_sync_s"  # grpo.engine=vllm: pushing the updated weights into the engine

# --- sampler vs trainer (grpo.engine=vllm): TRL's names for the same quantities -------
# |trainer - sampler| log-prob of each sampled completion token: ~0 when the engine holds the
# trainer's weights; it grows when a weight sync fails or goes stale.
SAMPLER_LOGP_DIFF_MEAN = "sampling/sampling_logp_difference/mean"
SAMPLER_LOGP_DIFF_MAX = "sampling/sampling_logp_difference/max"
# exp(trainer - sampler log-prob) per token, before the cap: the importance weight the correction bounds.
SAMPLER_IS_RATIO_MIN = "sampling/importance_sampling_ratio/min"
SAMPLER_IS_RATIO_MEAN = "sampling/importance_sampling_ratio/mean"
SAMPLER_IS_RATIO_MAX = "sampling/importance_sampling_ratio/max"

# --- other trainers' names -> ours (where the definitions agree) -------------------
# One table per trainer; the importers, the live attachments and docs/integrations.md read these.
# A name not listed is kept under foreign(source, name), never silently dropped.
# TRL: a log entry's keys (trainer_state.json log_history, TRL's on_log, its W&B/TensorBoard logs).
TRL_NAMES = {
    "reward": REWARD,  # mean weighted total over all completions = mean of the group means
    "frac_reward_zero_std": FRAC_REWARD_ZERO_STD,
    "grad_norm": GRAD_NORM,
    "kl": LOSS_KL,
    "entropy": LOSS_ENTROPY,
    "clip_ratio/region_mean": CLIP_RATIO,
    "clip_ratio": CLIP_RATIO,  # TRL < 0.17 logged one clip ratio
    "completions/mean_length": COMPLETION_MEAN_LENGTH,
    "completion_length": COMPLETION_MEAN_LENGTH,  # TRL < 0.17's name for the same mean
    "step_time": TIME_STEP,
    "learning_rate": LEARNING_RATE,
    "reward_std": TRL_REWARD_STD,
    SAMPLER_LOGP_DIFF_MEAN: SAMPLER_LOGP_DIFF_MEAN,  # TRL with use_vllm: the same names, the same definitions
    SAMPLER_LOGP_DIFF_MAX: SAMPLER_LOGP_DIFF_MAX,
    SAMPLER_IS_RATIO_MIN: SAMPLER_IS_RATIO_MIN,
    SAMPLER_IS_RATIO_MEAN: SAMPLER_IS_RATIO_MEAN,
    SAMPLER_IS_RATIO_MAX: SAMPLER_IS_RATIO_MAX,
    # per reward function (<fn>: the function's name; importers.trl_reward_fn matches these)
    "rewards/<fn>/mean": metric_mean("<fn>"),
    "rewards/<fn>": metric_mean("<fn>"),  # TRL < 0.17: the function's mean, without /mean
    "rewards/<fn>/std": metric_batch_std("<fn>"),  # std over all completions, not within groups
}
# ART (OpenPipe): its W&B / history.jsonl keys (art.Model._log_metrics prefixes a metric with its
# split unless it is in a section: data/, loss/, time/, ...). ART's data/step_num_groups_*,
# data/cum/num_groups_*, loss/entropy and loss/grad_norm are our names already; train/<metric>
# (ART's mean of trajectory.metrics[metric]) -> reward/<metric>/mean (integrations.art_files.map_art_key);
# anything else -> art/<key>.
ART_NAMES = {
    "train/reward": REWARD,  # mean trajectory.reward over the step's trajectories
    "reward/mean": REWARD,
    "train/reward_std_dev": REWARD_STD,  # mean within-group population std (groups of 2+), as ours
    "loss/kl_div": LOSS_KL,
    "loss/train": LOSS_POLICY,  # ART's policy loss (unsloth backend: policy_loss / loss)
    "loss/learning_rate": LEARNING_RATE,
    "time/step_wall_s": TIME_STEP,
    "val/reward": EVAL_REWARD,  # model.log(split="val"): mean reward over the held-out trajectories
    "train/num_groups_submitted": GROUPS_SUBMITTED,  # older ART
    "train/num_groups_trainable": GROUPS_TRAINABLE,
}
# verl: its Tracking keys (console, file logger JSONL, W&B).
VERL_NAMES = {
    "critic/score/mean": REWARD,  # the reward function's score, mean over the step's rollouts
    "actor/pg_loss": LOSS_POLICY,
    "actor/entropy": LOSS_ENTROPY,
    "actor/kl_loss": LOSS_KL,  # the KL to the reference (actor.use_kl_loss); actor/ppo_kl is old vs new policy
    "actor/pg_clipfrac": CLIP_RATIO,
    "actor/grad_norm": GRAD_NORM,
    "actor/lr": LEARNING_RATE,
    "response_length/mean": COMPLETION_MEAN_LENGTH,
    "timing_s/step": TIME_STEP,
    "timing_s/gen": TIME_GENERATE,
    "timing_s/update_actor": TIME_TRAIN,
}
FOREIGN_NAMES = {"trl": TRL_NAMES, "art": ART_NAMES, "verl": VERL_NAMES}


# The names every step of the embedded trainer logs (per-metric names come on top).
STEP_SCALARS = (
    GROUPS_SUBMITTED, GROUPS_TRAINABLE, CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE,
    TRAINABLE_RATIO, CUM_TRAINABLE_RATIO, PHANTOM_GROUPS, NOISE_GROUPS, REWARD, REWARD_STD,
    FRAC_REWARD_ZERO_STD, LOSS_POLICY, LOSS_KL, LOSS_ENTROPY, GRAD_NORM, CLIP_RATIO, LEARNING_RATE,
    COMPLETION_MEAN_LENGTH, TIME_STEP, TIME_GENERATE, TIME_SCORE, TIME_TRAIN,
    THROUGHPUT_TOKENS,
)
