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
BUDGET_ROLLOUTS = "data/budget/rollouts"  # completions sampled, pilots and committed (grpo.budget_pilot)
BUDGET_PILOT_SIGNAL = "data/budget/pilot_signal"  # prompts whose pilot group already varied (grpo.budget_pilot)
# Dynamic sampling in another trainer (verl's algorithm.filter_groups, DAPO): groups sampled, then dropped.
GROUPS_FILTERED = "data/step_num_groups_filtered"  # scores all equal (no signal): dropped, more sampled
GROUPS_SURPLUS = "data/step_num_groups_surplus"  # groups with signal beyond the batch: sampled, unused
# Async pipelines (ART's PipelineTrainer, SkyRL's fully async trainer) drop groups between sampling
# and the update too: GROUPS_FILTERED for those with no signal, and these for those too old to train on.
CUM_GROUPS_FILTERED = "data/cum/num_groups_filtered"  # GROUPS_FILTERED summed over the run so far
GROUPS_STALE = "data/step_num_groups_stale"  # sampled by a policy too many updates old: dropped, signal unjudged
CUM_GROUPS_STALE = "data/cum/num_groups_stale"  # GROUPS_STALE summed over the run so far

# --- health -------------------------------------------------------------------
# Non-trainable (flat) groups split by why, one cause per group (analysis.flat_causes, which says why
# this order): the per-step count of each cause. They add up to submitted - trainable at every step.
GROUPS_SOLVED = "health/groups_all_solved"  # every completion right (the outcome at the top of its range)
GROUPS_UNSOLVED = "health/groups_none_solved"  # every completion wrong (the outcome at the bottom)
FLAT_ERRORED = "health/flat_all_errored"  # every rollout's scoring raised or gave NaN/inf
FLAT_TRUNCATED = "health/flat_all_truncated"  # every completion cut at grpo.max_new_tokens
FLAT_IDENTICAL = "health/flat_identical"  # every completion the same text
FLAT_SHAPING = "health/flat_shaping_only"  # the outcome uniform; only shaping terms varied, below the gate
FLAT_BELOW_GATE = "health/flat_below_threshold"  # the rewards varied, the outcome too, std <= min_group_std
FLAT_NOISE = "health/flat_float_noise"  # the totals differ by float rounding only
FLAT_OTHER = "health/flat_other_uniform"  # the same middling total for every completion (or no range to judge)
# Each cause as stored per group (the group_outcomes table's outcome column), and "mixed": trainable.
CAUSE_MIXED = "mixed"  # a trainable group: its rewards vary (no cause)
CAUSE_ERRORED = "all errored"  # 1st in precedence: counted under FLAT_ERRORED
CAUSE_SOLVED = "all solved"  # 2nd: GROUPS_SOLVED
CAUSE_IDENTICAL = "identical"  # 3rd: FLAT_IDENTICAL
CAUSE_TRUNCATED = "all truncated"  # 4th: FLAT_TRUNCATED
CAUSE_UNSOLVED = "none solved"  # 5th: GROUPS_UNSOLVED
CAUSE_SHAPING = "shaping only"  # 6th: FLAT_SHAPING
CAUSE_BELOW_GATE = "below threshold"  # 7th: FLAT_BELOW_GATE
CAUSE_NOISE = "float noise"  # 8th: FLAT_NOISE
CAUSE_OTHER = "other uniform"  # 9th, the rest: FLAT_OTHER
CAUSE_UNRECORDED = "uniform"  # a run from before the causes: flat, neither all solved nor none solved
# cause -> its per-step count, in precedence order (the first cause that holds names the group)
FLAT_CAUSES = {CAUSE_ERRORED: FLAT_ERRORED, CAUSE_SOLVED: GROUPS_SOLVED, CAUSE_IDENTICAL: FLAT_IDENTICAL,
               CAUSE_TRUNCATED: FLAT_TRUNCATED, CAUSE_UNSOLVED: GROUPS_UNSOLVED, CAUSE_SHAPING: FLAT_SHAPING,
               CAUSE_BELOW_GATE: FLAT_BELOW_GATE, CAUSE_NOISE: FLAT_NOISE, CAUSE_OTHER: FLAT_OTHER}

TRAINABLE_RATIO = "health/trainable_ratio"
CUM_TRAINABLE_RATIO = "health/cum_trainable_ratio"
PHANTOM_GROUPS = "health/phantom_groups"
# Groups counted trainable whose reward spread is float rounding (step_stats.float_noise): TRL
# trains them, on advantages made of rounding error. The stricter view beside TRL's count.
NOISE_GROUPS = "health/float_noise_groups"
# prime-rl's solve rates: the share of the step's groups whose every reward is 0 / is 1. Both are
# uniform groups; with rewards other than 0 and 1 there are uniform groups neither counts, so the
# two give 1 - trainable ratio only for 0/1 rewards, which a log does not say: no ratio is derived.
SHARE_NONE_SOLVED = "health/share_none_solved"  # share of the step's groups: every reward 0 (prime-rl)
SHARE_ALL_SOLVED = "health/share_all_solved"  # share of the step's groups: every reward 1 (prime-rl)
MIN_GROUP_STD = "health/min_group_std"  # the threshold in force at this step
DIFFICULTY = "health/difficulty"  # the task level in force at this step
# Template collapse (train/collapse_check.py, every health.collapse_every steps): N distinct prompts of the
# step, one completion each, every completion scored under every prompt (RAGEN-2, arXiv 2604.06268).
COLLAPSE_RETRIEVAL = "health/collapse/retrieval_acc"  # share of completions their own prompt scores best (ties share)
COLLAPSE_CHANCE = "health/collapse/chance"  # 1/N: the retrieval accuracy of completions that ignore their prompt
COLLAPSE_SKILL = "health/collapse/retrieval_skill"  # (acc - chance) / (1 - chance): 0 at chance, 1 = all retrieved
COLLAPSE_MI = "health/collapse/mi_nats"  # InfoNCE lower bound on I(prompt; completion), nats, at most log N

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
TIME_COLLAPSE = "time/collapse_check_s"  # the template-collapse check (health.collapse_every)


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

# --- GPU memory (CUDA only: absent on CPU), in GiB (2^30 bytes, as memory_model and bench/gpu_check) ---
GPU_MEMORY_ALLOCATED = "gpu/memory_allocated_gb"  # torch.cuda.memory_allocated at the step's end (rank 0's GPU)
GPU_MAX_MEMORY_ALLOCATED = "gpu/max_memory_allocated_gb"  # the peak since the previous step's end

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
    # PipelineTrainer (art.pipeline_trainer): it drops groups before the backend trains, so its
    # data/step_num_groups_* count only the batch trained on; integrations.base.derive_counts adds
    # the zero-variance ones back into submitted (they were sampled for the step, and taught nothing).
    "discarded/step/zero_variance_groups": GROUPS_FILTERED,  # rewards within 1e-12 of each other
    "discarded/cum/zero_variance_groups": CUM_GROUPS_FILTERED,
    "discarded/step/stale_groups": GROUPS_STALE,  # older than max_steps_off_policy when dequeued
    "discarded/cum/stale_groups": CUM_GROUPS_STALE,
    # Kept as art/<name>: discarded/rate/* (cumulative share of all groups generated),
    # discarded/reward (the dropped groups' mean reward: split "discarded"), and queue/* (the
    # pipeline's plumbing: queue depth and occupancy, put/get waits, queue/actual_stale_fraction =
    # the step's stale groups / groups dequeued), which say how the pipeline flows, not what a group taught.
}
# SkyRL (skyrl.train.fully_async_trainer): with sample_full_batch it drops zero-variance groups
# (rewards within zero_variance_filter_tol) until a mini-batch of groups with signal is full.
SKYRL_NAMES = {
    "async/num_groups_dropped": GROUPS_FILTERED,
    # mini_batch / (mini_batch + dropped): the share of groups with signal (a group with one live
    # trajectory, the rest masked out, is kept too: rare), i.e. our trainable ratio
    "async/keep_rate": TRAINABLE_RATIO,
}
# prime-rl (orchestrator/metrics.py solve_rates; the key moved with its releases: all three are read).
# <agent> is one path segment: with several agents, each agent's value lands on the one name
# (reported as logged twice with different values).
PRIME_RL_NAMES = {
    "reward/solve_none": SHARE_NONE_SOLVED,  # 2025: every reward of the group == 0
    "reward/solve_all": SHARE_ALL_SOLVED,  # every reward == 1
    "solve_none/all": SHARE_NONE_SOLVED,  # 2026 to June: the group's rewards sum to 0
    "solve_all/all": SHARE_ALL_SOLVED,  # they sum to the group size
    "train/agg/all/<agent>/solved_none": SHARE_NONE_SOLVED,  # since: sum 0, over every rollout that came back
    "train/agg/all/<agent>/solved_all": SHARE_ALL_SOLVED,  # every reward == 1.0
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
    # dynamic sampling (verl/trainer/ppo/v1/replay_buffer.py): counts of groups (prompt uids), summed per step
    "training/filter_groups/evicted_samples": GROUPS_FILTERED,
    "training/filter_groups/discarded_surplus_samples": GROUPS_SURPLUS,
}
FOREIGN_NAMES = {"trl": TRL_NAMES, "art": ART_NAMES, "verl": VERL_NAMES, "skyrl": SKYRL_NAMES,
                 "prime-rl": PRIME_RL_NAMES}


def foreign_name(source: str, key: str) -> str | None:
    """`source`'s `key` -> our name by its FOREIGN_NAMES table; a `<...>` part of a listed key
    matches one path segment (and fills the same `<...>` in our name). None: not listed."""
    table = FOREIGN_NAMES.get(source, {})
    if key in table:
        return table[key]
    parts = key.split("/")
    for listed, ours in table.items():
        pattern = listed.split("/")
        if "<" not in listed or len(pattern) != len(parts):
            continue
        slots = {p: k for p, k in zip(pattern, parts) if p.startswith("<") and p.endswith(">")}
        if all(p == k or p in slots for p, k in zip(pattern, parts)):
            for slot, segment in slots.items():
                ours = ours.replace(slot, segment)
            return ours
    return None


# The names every step of the embedded trainer logs (per-metric names come on top).
STEP_SCALARS = (
    GROUPS_SUBMITTED, GROUPS_TRAINABLE, CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE,
    TRAINABLE_RATIO, CUM_TRAINABLE_RATIO, PHANTOM_GROUPS, NOISE_GROUPS, REWARD, REWARD_STD,
    FRAC_REWARD_ZERO_STD, LOSS_POLICY, LOSS_KL, LOSS_ENTROPY, GRAD_NORM, CLIP_RATIO, LEARNING_RATE,
    COMPLETION_MEAN_LENGTH, TIME_STEP, TIME_GENERATE, TIME_SCORE, TIME_TRAIN,
    THROUGHPUT_TOKENS,
)
