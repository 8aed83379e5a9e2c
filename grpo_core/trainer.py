"""The embedded GRPO trainer: rollout -> score -> health -> advantage -> loss -> update -> log.

Each stage is a small function over tensors/arrays (tested one by one in
tests/test_trainer.py); `Trainer` wires them to a task, a run store and the control
requests the dashboard writes. Facts the code relies on:

- One update per batch, so the "old" policy is the current one: old log-probs are the
  detached current log-probs (TRL with num_iterations=1). The importance ratio is 1 in
  value and the clipped surrogate reduces to the policy gradient, with one forward pass.
- Non-trainable groups get advantage 0 (DESIGN.md), and with beta = 0 a zero-advantage
  row has zero gradient, so by default they are dropped from the forward/backward batch:
  a step costs in proportion to its trainable ratio. A step with no trainable group does
  no backward at all and leaves every parameter untouched.
- Control requests are claimed and applied between steps only, so a step never sees
  half a change; each is resolved with the step it takes effect at.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from grpo_core import autopilot as AP
from grpo_core import health
from grpo_core import models
from grpo_core import names as N
from grpo_core import store as S
from grpo_core.config import (ConfigError, RunConfig, apply_overrides, from_dict, load_config,
                              validate)
from grpo_core.control import validate_request
from grpo_core.rewards import CompositeReward
from grpo_core.tasks import build_metrics, make_task
from grpo_core.writer import BatchedWrites, StoreWriter

ADV_EPS = 1e-4  # as TRL: (r - mean) / (std + 1e-4)
CKPT_PREFIX = "step-"
CKPT_KEEP = 2  # complete checkpoints kept on disk
ALERT_REARM = 10  # steps an alert must stay quiet before it may fire (and be logged) again


# =============================================================================================
# Rollout: batched sampling with the KV cache
# =============================================================================================
@dataclass
class Rollouts:
    input_ids: torch.Tensor  # [B, Lp + Lc]: left-padded prompt, then the completion (pad after eos)
    attention_mask: torch.Tensor  # [B, Lp + Lc]: 0 on padding and after eos
    prompt_len: int  # Lp
    texts: list[str]  # [B] decoded completions
    examples: list[dict]  # [B] each prompt's example, repeated G times
    num_prompts: int
    group_size: int

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.attention_mask[:, self.prompt_len:]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len:]


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 on every token up to and including the first eos, 0 after (no Python loop)."""
    is_eos = completion_ids == eos_id
    before = is_eos.long().cumsum(-1) - is_eos.long()  # eos seen strictly before this position
    return (before == 0).long()


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter with generate's arithmetic (TopPLogitsWarper): sort ascending, drop the
    tail whose cumulative mass is <= 1 - top_p, always keep the most likely token."""
    sorted_logits, order = torch.sort(scores, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


@torch.no_grad()
def sample_tokens(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int, *,
                  max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                  suppress_ids: list[int] | None = None) -> torch.Tensor:
    """`model.generate(do_sample=True, top_k=0, num_return_sequences=G, suppress_tokens=...)`
    for left-padded prompts [P, Lp] -> completion ids [P*G, Lc], pad after each row's eos,
    stopping once every row has ended. Same logits processing (suppress, temperature, top-p)
    and the same multinomial draws in the same order, so a seed gives generate's tokens
    (tests/test_trainer.py). Faster where it matters on a small model: each prompt goes
    through the model once, not G times (its KV cache is copied to its G rows; measured on
    the demo: the prefill of 64 rows was ~40% of generate's time), rows that have ended leave
    the model's batch (once a quarter of it has ended), and none of generate's per-token
    bookkeeping runs."""
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(group_size)
    logits = out.logits[:, -1].float().repeat_interleave(group_size, 0)  # [B, V], B = P*G
    mask = prompt_mask.repeat_interleave(group_size, 0)
    nxt = pos[:, -1:].repeat_interleave(group_size, 0) + 1  # generate's positions: count of attended tokens - 1
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    rows = torch.arange(logits.shape[0], device=logits.device)  # the rows still in the model's batch
    toks = []
    for t in range(max_new_tokens):
        scores = logits
        if suppress_ids:
            scores[:, suppress_ids] = float("-inf")
        if temperature != 1.0:
            scores = scores / temperature
        if top_p < 1.0:
            scores = _top_p(scores, top_p)
        # Drawn for every row, ended ones too (then replaced by pad): the random stream is generate's.
        tok = torch.multinomial(scores.softmax(-1), 1).squeeze(1).masked_fill(done, pad_id)
        toks.append(tok)
        done = done | (tok == eos_id)
        if t == max_new_tokens - 1:
            break
        live = ~done[rows]  # rows outside the batch have ended already
        n_live = int(live.sum())  # the one host sync per token (generate has one too)
        if n_live == 0:
            break
        if n_live <= 3 * len(rows) // 4:
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, mask, nxt = rows[keep], mask[keep], nxt[keep]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        out = model(input_ids=tok[rows, None], attention_mask=mask, position_ids=nxt, past_key_values=cache,
                    use_cache=True)
        nxt = nxt + 1
        logits[rows] = out.logits[:, -1].float()  # an ended row keeps its last logits: only drawn from
    return torch.stack(toks, 1)


def rollout(model, tokenizer, examples: list[dict], group_size: int, *, max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0, suppress_ids: list[int] | None = None) -> Rollouts:
    """P prompts -> P*G sampled completions in one batch (KV cache, each prompt prefilled once).
    Rows are grouped: rows g*G .. g*G+G-1 are prompt g's group."""
    device = next(model.parameters()).device
    enc = tokenizer([e["prompt"] for e in examples], return_tensors="pt", padding=True).to(device)
    comp = sample_tokens(model, enc["input_ids"], enc["attention_mask"], group_size, max_new_tokens=max_new_tokens,
                         eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=temperature,
                         top_p=top_p, suppress_ids=suppress_ids)
    lp = enc["input_ids"].shape[1]
    cmask = completion_mask(comp, tokenizer.eos_token_id)
    attn = torch.cat([enc["attention_mask"].repeat_interleave(group_size, 0), cmask], 1)
    out = torch.cat([enc["input_ids"].repeat_interleave(group_size, 0), comp], 1).masked_fill(attn == 0,
                                                                                               tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, lp:], skip_special_tokens=True)
    rep = [e for e in examples for _ in range(group_size)]
    return Rollouts(out, attn, lp, texts, rep, len(examples), group_size)


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Join rollouts of several prompt batches (dynamic sampling) into one padded batch."""
    if len(parts) == 1:
        return parts[0]
    lp = max(r.prompt_len for r in parts)
    lc = max(r.input_ids.shape[1] - r.prompt_len for r in parts)
    ids, masks = [], []
    for r in parts:
        left, right = lp - r.prompt_len, lc - (r.input_ids.shape[1] - r.prompt_len)
        ids.append(torch.nn.functional.pad(r.input_ids, (left, right), value=pad_id))
        masks.append(torch.nn.functional.pad(r.attention_mask, (left, right), value=0))
    return Rollouts(torch.cat(ids), torch.cat(masks), lp, sum((r.texts for r in parts), []),
                    sum((r.examples for r in parts), []), sum(r.num_prompts for r in parts), parts[0].group_size)


# =============================================================================================
# Advantages and loss
# =============================================================================================
def advantages(totals: np.ndarray, trainable: np.ndarray, scale: str = "group", eps: float = ADV_EPS,
               std: str = "unbiased") -> np.ndarray:
    """totals [P, G], trainable [P] -> advantages [P, G].

    group: (r - group mean) / (group std + eps); batch: divided by the whole batch's std
    instead; none: r - group mean. std "unbiased" is the Bessel-corrected std (n - 1), as TRL
    (`nanstd`) and verl (`torch.std`) divide by; "population" divides by n. Non-trainable
    groups get 0: a near-constant group's noise is never blown up into +-1 advantages."""
    totals = np.asarray(totals, dtype=np.float64)
    if std not in ("unbiased", "population"):
        raise ConfigError(f"grpo.advantage_std must be 'unbiased' or 'population', got {std!r}")
    ddof = 1 if std == "unbiased" else 0
    centered = totals - totals.mean(axis=1, keepdims=True)
    if scale == "group":
        adv = centered / (totals.std(axis=1, ddof=ddof, keepdims=True) + eps)
    elif scale == "batch":
        adv = centered / (totals.std(ddof=ddof) + eps)
    elif scale == "none":
        adv = centered
    else:
        raise ConfigError(f"grpo.scale must be 'group', 'batch' or 'none', got {scale!r}")
    return np.where(np.asarray(trainable, dtype=bool)[:, None], adv, 0.0)


def _reduce(x: torch.Tensor, mask: torch.Tensor, loss_type: str, denom: float | None = None) -> torch.Tensor:
    """token: sum over the masked tokens / denom (default: their count; long completions weigh
    more, as in DAPO); sequence: sum of per-sequence means / denom (default: sequences with tokens)."""
    mask = mask.to(x.dtype)
    if loss_type == "token":
        return (x * mask).sum() / (denom if denom else mask.sum().clamp(min=1.0))
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    has = (mask.sum(-1) > 0).to(x.dtype)
    return (per_seq * has).sum() / (denom if denom else has.sum().clamp(min=1.0))


def _reduce_count(mask: torch.Tensor, loss_type: str) -> float:
    return float(mask.sum()) if loss_type == "token" else float((mask.sum(-1) > 0).sum())


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
              policy_rows: torch.Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2,
              loss_type: str = "token", ref_logp: torch.Tensor | None = None, beta: float = 0.0,
              policy_denom: float | None = None):
    """Clipped surrogate (+ beta * k3 KL to the reference). Shapes: logp/old_logp/ref_logp/mask
    [B, L], adv [B], policy_rows [B] bool (rows whose group is trainable; default all).

    The policy term sums over the tokens of policy rows and divides by every row's tokens
    (token) or the number of rows (sequence), as TRL does with zero-advantage rows in the
    batch; `policy_denom` gives that count when rows were dropped before the call (train_on),
    so masking a non-trainable row and dropping it give the same gradient when beta = 0. A
    step with few trainable groups therefore takes a small step, not a full one built from
    a couple of prompts (measured: the full step collapses the demo's policy within ~30
    steps of a level change). The KL term averages over every row's tokens
    (train_on forwards every row when beta > 0), as TRL's. Returns (loss, stats) with stats as
    floats."""
    mask = mask.to(logp.dtype)
    pmask = mask if policy_rows is None else mask * policy_rows.to(logp.dtype)[:, None]
    ratio = torch.exp(logp - old_logp)
    a = adv.to(logp.dtype)[:, None]
    pg = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    policy = _reduce(pg, pmask, loss_type, policy_denom or _reduce_count(mask, loss_type))
    if ref_logp is not None and beta > 0:
        d = ref_logp - logp
        kl = _reduce(torch.exp(d) - d - 1, mask, loss_type)  # k3: unbiased, always >= 0
    else:
        kl = torch.zeros((), dtype=logp.dtype, device=logp.device)
    loss = policy + beta * kl
    with torch.no_grad():
        policy, kl = policy.detach(), kl.detach()
        clipped = ((ratio < 1 - eps_low) & (a < 0)) | ((ratio > 1 + eps_high) & (a > 0))
        clip = (clipped.to(pmask.dtype) * pmask).sum() / pmask.sum().clamp(min=1.0)
    return loss, {"policy": policy.item(), "kl": kl.item(), "clip_ratio": clip.item()}


def _completion_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                       group_size: int) -> torch.Tensor:
    """Logits predicting each completion token [B, Lc, V]. Rows in groups of G with the same
    prompt (group_size = G > 1): the prompt goes through the model once per group, with grad,
    its KV cache is copied to the group's rows and the completions attend to it. The same
    function and gradient as one forward over all rows (tests/test_trainer.py), on a fraction
    of the tokens (the demo: ~2x faster forward + backward)."""
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    lc = input_ids.shape[1] - prompt_len
    if group_size > 1 and prompt_len > 0:
        pm = attention_mask[::group_size, :prompt_len]
        out = model(input_ids=input_ids[::group_size, :prompt_len], attention_mask=pm,
                    position_ids=pos[::group_size, :prompt_len], use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        if hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(group_size)
            first = out.logits[:, -1:].repeat_interleave(group_size, 0)
            cpos = pos[:, prompt_len - 1:prompt_len] + 1 + torch.arange(lc, device=pos.device)  # as in sample_tokens
            rest = model(input_ids=input_ids[:, prompt_len:], attention_mask=attention_mask, position_ids=cpos,
                         past_key_values=cache, use_cache=True).logits[:, :-1]
            return _upcast(torch.cat([first, rest], 1))
    return _upcast(model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                         logits_to_keep=lc + 1).logits[:, :-1])


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 for the log-softmax; float64 (the exactness tests) stays."""
    return logits if logits.dtype == torch.float64 else logits.float()


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, *,
                   temperature: float = 1.0, suppress_ids: list[int] | None = None, with_entropy: bool = False,
                   group_size: int = 1):
    """Log-probs of the completion tokens [B, Lc] (logits only for the completion positions),
    and their entropy [B, Lc] (no grad) when asked. Positions follow the attention mask, as in
    `generate` with left padding. group_size = G: rows come in groups of G sharing a prompt
    (rows g*G .. g*G+G-1), whose forward is then shared."""
    logits = _completion_logits(model, input_ids, attention_mask, prompt_len, group_size)
    if temperature != 1.0:
        logits = logits / temperature
    if suppress_ids:  # the sampler never saw these tokens: the policy it sampled from excludes them
        logits[..., suppress_ids] = float("-inf")
    logsm = logits.log_softmax(-1)
    logp = logsm.gather(-1, input_ids[:, prompt_len:, None]).squeeze(-1)
    # After eos the targets are padding, which may be a suppressed (-inf) token: zero them so
    # masked positions can never turn the loss into nan (nan * 0 is nan).
    logp = torch.where(attention_mask[:, prompt_len:].bool(), logp, torch.zeros_like(logp))
    ent = None
    if with_entropy:
        with torch.no_grad():
            p = logsm.exp()
            ent = -(p * logsm.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, ent


def trim(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
    """Drop columns that are padding in every row (left of the longest prompt, right of the
    longest completion): no forward pass is spent on them."""
    cols = attention_mask.any(0)
    first = int(cols[:prompt_len].long().argmax()) if prompt_len else 0
    last = prompt_len + int(attention_mask[:, prompt_len:].sum(-1).max())
    return input_ids[:, first:last], attention_mask[:, first:last], prompt_len - first


def train_on(model, optimizer, roll: Rollouts, adv: np.ndarray, trainable: np.ndarray, gcfg, *,
             ref_model=None, suppress_ids=None, before_backward=None) -> dict:
    """One GRPO update on the rollouts. adv [P, G], trainable [P]. Returns loss stats; a batch
    with no trainable group returns zeros without a forward or backward. before_backward():
    called as the backward pass starts (the trainer lets its store writer run then)."""
    G = roll.group_size
    row_trainable = torch.as_tensor(np.repeat(np.asarray(trainable, bool), G))
    with_kl = gcfg.beta > 0 and ref_model is not None
    if not bool(row_trainable.any()) and not with_kl:
        return {"policy": 0.0, "kl": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0, "entropy": float("nan"),
                "rows": 0, "tokens": 0}
    # With a KL term every row has a gradient (TRL averages the KL over all tokens): dropping
    # the non-trainable rows would change it, so they are only dropped when beta = 0.
    rows = row_trainable if gcfg.drop_untrainable and not with_kl else torch.ones_like(row_trainable)
    idx = rows.nonzero().squeeze(-1)
    device = roll.input_ids.device
    ids, attn, lp = trim(roll.input_ids[idx], roll.attention_mask[idx], roll.prompt_len)
    cmask = attn[:, lp:]
    a = torch.as_tensor(adv.reshape(-1), dtype=torch.float64, device=device)[idx.to(device)]  # cast to logp's dtype in grpo_loss
    prow = row_trainable.to(device)[idx.to(device)]
    logp, ent = token_logprobs(model, ids, attn, lp, temperature=gcfg.temperature, suppress_ids=suppress_ids,
                               with_entropy=True, group_size=G)  # rows are whole groups: share each prompt
    ref = None
    if with_kl:
        with torch.no_grad():
            ref, _ = token_logprobs(ref_model, ids, attn, lp, temperature=gcfg.temperature, suppress_ids=suppress_ids,
                                    group_size=G)
    denom = _reduce_count(roll.completion_mask, gcfg.loss_type)  # every row, the dropped ones too
    loss, stats = grpo_loss(logp, logp.detach(), a, cmask, policy_rows=prow, eps_low=gcfg.epsilon_low,
                            eps_high=gcfg.epsilon_high, loss_type=gcfg.loss_type, ref_logp=ref, beta=gcfg.beta,
                            policy_denom=denom)
    optimizer.zero_grad(set_to_none=True)
    if before_backward is not None:
        before_backward()
    loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    gn = torch.nn.utils.clip_grad_norm_(params, gcfg.max_grad_norm if gcfg.max_grad_norm > 0 else float("inf"))
    optimizer.step()
    m = cmask.to(ent.dtype)
    stats.update(grad_norm=float(gn), entropy=float((ent * m).sum() / m.sum().clamp(min=1)),
                 rows=int(len(idx)), tokens=int(cmask.sum()))
    return stats


# =============================================================================================
# Checkpoints: temp dir + atomic rename; a half-written one is never loaded
# =============================================================================================
def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a temp dir is never listed)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX)
            and (p / "state.pt").is_file() and (p / "config.json").is_file()]
    return sorted(done, key=lambda p: int(p.name[len(CKPT_PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict):
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# =============================================================================================
# Heartbeat: its own connection, its own thread, so a long step never looks dead
# =============================================================================================
class Heartbeat(threading.Thread):
    """Also folds the WAL into the db every beat, so the training loop's own writes never
    wait for that (the loop's connection defers checkpoints while this thread runs; measured
    on the demo's steps: log_step 2.4 -> 1.4 ms mean, p99 18 -> 6 ms)."""

    def __init__(self, db_path: Path, every: float = 2.0):
        super().__init__(daemon=True, name="grpo-heartbeat")
        self.db_path, self.every, self.done = db_path, every, threading.Event()

    def run(self):
        store = S.RunStore(self.db_path)
        try:
            while True:
                try:
                    store.heartbeat()
                    store.checkpoint()
                except Exception:  # a busy db for a moment: the next beat will do
                    pass
                if self.done.wait(self.every):
                    return
        finally:
            store.close()

    def stop(self):
        self.done.set()
        self.join(timeout=5)


# =============================================================================================
# The trainer
# =============================================================================================
def resumed_budget(meta: dict, steps: int) -> int:
    """The step budget a resumed run trains to: the one in force when it stopped (a set_steps
    request changes it mid-run; meta "settings" records it, as the runs list shows it), unless
    this resume sets grpo.steps itself (`--set grpo.steps=N`: then it differs from the stored
    config, which run() rewrites with the budget in force at each start)."""
    stored = ((meta.get("config") or {}).get("grpo") or {}).get("steps")
    in_force = (meta.get("settings") or {}).get("steps")
    return int(in_force) if in_force is not None and steps == stored else steps


def set_threads(cfg: RunConfig | None = None):
    """CPU threads for torch: $GRPO_TORCH_THREADS, else 1 for the built-in model (and when no
    config is given), else min(4, cores). The built-in model's ops are far too small to split:
    a second thread only waits at barriers, and on a shared box it waits for a core
    (measured, 2 cores at load ~14: 1.63 s/step with 2 threads, 0.18 s with 1; docs/benchmarks.md)."""
    n = int(os.environ.get("GRPO_TORCH_THREADS", "0"))
    if not n:
        n = max(1, min(4, os.cpu_count() or 1)) if cfg is not None and cfg.model.path else 1
    torch.set_num_threads(n)


class Trainer:
    def __init__(self, cfg: RunConfig, store: S.RunStore, *, resume: bool = False, log=None):
        self.cfg, self.store, self.resume = cfg, store, resume
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.runs_root = store.run_dir.parent
        g = cfg.grpo
        self.task = make_task(cfg)
        metric_names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
        fns, self.metric_kinds = build_metrics(metric_names, cfg.reward.custom)
        self.reward = CompositeReward(fns, cfg.reward.weights)
        self.outcome_index = (self.reward.names.index(cfg.reward.outcome_metric)
                              if cfg.reward.outcome_metric else None)
        self.min_group_std = g.min_group_std
        self.step = 0  # last finished step; steps are numbered from 1
        self.cum_submitted = self.cum_trainable = 0
        self.paused = False
        self.stop_reason: str | None = None
        self.active_alerts: dict[str, int] = {}  # alert kind -> last step it held
        self.history: list[dict] = []  # recent steps' scalars, for alerts and the curriculum
        self.curriculum_streak = 0
        self.last_log_s = 0.0
        self.last_ckpt_step: int | None = None
        self.pending_events: list[tuple[str, dict]] = []
        self.autopilot_on = cfg.autopilot.enabled  # set_autopilot switches it mid-run
        self.autopilot = AP.AutopilotState()
        self.stop_source: str | None = None  # source of the stop request (meta stop_reason); None: a signal
        self.writer: StoreWriter | BatchedWrites | None = None  # during run(): how steps reach the store
        self.requests_waiting = False  # a control request was pending when the last step was handed over

        torch.manual_seed(g.seed)
        np.random.seed(g.seed)
        random.seed(g.seed)
        self.model, self.tokenizer, self.model_info = models.load_policy(
            cfg.model, self.task, self.runs_root, seed=g.seed, log=self.log)
        self.device = next(self.model.parameters()).device
        self.suppress_ids = models.suppressed_token_ids(self.tokenizer)
        self.ref_model = None
        if g.beta > 0:  # the frozen reference is the starting policy (after warm-start)
            self.ref_model, _, _ = models.load_policy(cfg.model, self.task, self.runs_root, seed=g.seed)
            self.ref_model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=g.lr, weight_decay=g.weight_decay)
        if resume:
            self._load_checkpoint()

    # ---- one step ------------------------------------------------------------------------
    def sample(self):
        """Draw prompt batches (more than one only with dynamic sampling) and score them."""
        g = self.cfg.grpo
        parts, raws, errors, t_gen, t_score, batches = [], [], [], 0.0, 0.0, 0
        trainable_so_far = 0
        while True:
            batches += 1
            examples = self.task.batch(g.prompts_per_step)
            t0 = time.perf_counter()
            roll = rollout(self.model, self.tokenizer, examples, g.group_size, max_new_tokens=g.max_new_tokens,
                           temperature=g.temperature, top_p=g.top_p, suppress_ids=self.suppress_ids)
            t1 = time.perf_counter()
            scored = self.reward.score(roll.texts, roll.examples)
            t_gen, t_score = t_gen + t1 - t0, t_score + time.perf_counter() - t1
            parts.append(roll)
            raws.append(scored.raw)
            errors += scored.errors
            if not g.dynamic_sampling or batches >= g.dynamic_max_batches:
                break
            # The step's own rule: with an outcome gate, a phantom group does not count toward the target.
            st = health.group_stats(scored.totals.reshape(-1, g.group_size), scored.raw.reshape(-1, g.group_size,
                                    scored.raw.shape[1]), min_group_std=self.min_group_std,
                                    outcome_index=self.outcome_index, uniform_std=self.cfg.health.uniform_std)
            trainable_so_far += int(st.trainable.sum())
            if trainable_so_far >= g.dynamic_min_trainable:
                break
        roll = concat_rollouts(parts, self.tokenizer.pad_token_id)
        raw = np.concatenate(raws)
        return roll, raw, errors, batches, t_gen, t_score

    def train_step(self, update: bool = True) -> tuple[dict, S.StepGroups, S.StepRollouts]:
        """One step; update=False samples, scores and logs without training (the pilot)."""
        g = self.cfg.grpo
        t_start = time.perf_counter()
        roll, raw, errors, batches, t_gen, t_score = self.sample()
        P, G, K = roll.num_prompts, g.group_size, raw.shape[1]
        t0 = time.perf_counter()
        totals = self.reward.totals(raw).reshape(P, G)
        scores = raw.reshape(P, G, K)
        stats = health.group_stats(totals, scores, min_group_std=self.min_group_std,
                                   outcome_index=self.outcome_index, uniform_std=self.cfg.health.uniform_std)
        adv = advantages(totals, stats.trainable, g.scale, std=g.advantage_std)
        t_score += time.perf_counter() - t0
        t0 = time.perf_counter()
        loss = train_on(self.model, self.optimizer, roll, adv, stats.trainable, g, ref_model=self.ref_model,
                        suppress_ids=self.suppress_ids, before_backward=self.writer_go) if update else \
            dict.fromkeys(("policy", "kl", "entropy", "grad_norm", "clip_ratio"), float("nan"))
        t_train = time.perf_counter() - t0
        self.writer_go()  # a step without a backward pass: the last step is written now

        scalars = health.step_scalars(stats, scores, self.reward.names, self.reward.weights,
                                      self.cum_submitted, self.cum_trainable)
        self.cum_submitted, self.cum_trainable = (int(scalars[N.CUM_GROUPS_SUBMITTED]),
                                                  int(scalars[N.CUM_GROUPS_TRAINABLE]))
        n_tokens = int(roll.completion_mask.sum())
        step_s = time.perf_counter() - t_start
        scalars.update({
            N.LOSS_POLICY: loss["policy"], N.LOSS_KL: loss["kl"], N.LOSS_ENTROPY: loss["entropy"],
            N.GRAD_NORM: loss["grad_norm"], N.CLIP_RATIO: loss["clip_ratio"],
            N.COMPLETION_MEAN_LENGTH: n_tokens / len(roll.texts),
            N.TIME_STEP: step_s, N.TIME_GENERATE: t_gen, N.TIME_SCORE: t_score, N.TIME_TRAIN: t_train,
            N.TIME_LOG: self.last_log_s, N.THROUGHPUT_TOKENS: n_tokens / max(step_s, 1e-9),
            N.MIN_GROUP_STD: self.min_group_std, N.DIFFICULTY: float(self.task.level),
            N.SCORING_ERRORS: float(sum(e is not None for e in errors)), N.SAMPLING_BATCHES: float(batches),
        })
        if not update:  # nothing trained: log no loss at all rather than empty values
            for k in (N.LOSS_POLICY, N.LOSS_KL, N.LOSS_ENTROPY, N.GRAD_NORM, N.CLIP_RATIO):
                scalars.pop(k)
        groups = S.StepGroups(np.arange(P), [roll.examples[i * G].get("prompt_id", str(i)) for i in range(P)],
                              G, stats.mean, stats.std, stats.trainable, stats.phantom)
        keep_all = self.cfg.log.keep_text == "all"
        n_text = P if keep_all else min(P, self.cfg.log.text_sample_groups)
        n = P * G
        rollouts = S.StepRollouts(self.reward.names, np.arange(n) // G, np.arange(n) % G, totals.reshape(-1), raw,
                                  roll.texts[:n_text * G] + [None] * (n - n_text * G), errors)
        return scalars, groups, rollouts

    # ---- control requests -------------------------------------------------------------------
    def poll_control(self):
        if self.writer is not None and self.writer.threaded and self.writer.busy():
            # The writer is committing the last step: use the read made just before it was handed
            # over (run()), not a read now, which would trade the GIL with the writer thread.
            pending = self.requests_waiting
        else:
            pending = self.store.has_pending()  # a read: never waits behind a write transaction
        if not pending:
            return
        # What a request does refers to the steps so far (applied / paused / stopped at step N):
        # those steps are in the store before its answer is.
        self.flush_writes()
        for req in self.store.claim_pending():
            applied, step, message = self.apply_request(req)
            self.store.resolve_request(req["id"], applied, step, message)
            self.log(f"request {req['id']} {req['kind']}: {'applied' if applied else 'rejected'} ({message})")
            if applied:
                AP.note_applied(self.autopilot, req, step)
                self.publish_settings()

    def apply_request(self, req: dict) -> tuple[bool, int | None, str]:
        """-> (applied, step it takes effect at, message). set_* take effect at the next step;
        pause/stop/checkpoint act on the state after the last finished step."""
        kind, nxt = req["kind"], self.step + 1
        try:
            payload = validate_request(kind, req.get("payload") or {}, self.reward.names, max_level=self.task.levels)
        except ConfigError as e:
            return False, None, str(e)
        if kind == S.SET_WEIGHTS:
            new = self.reward.set_weights({**self.reward.weights, **payload["weights"]})
            return True, nxt, "weights " + ", ".join(f"{k}={v:g}" for k, v in new.items()) + f" from step {nxt}"
        if kind == S.SET_THRESHOLD:
            old, self.min_group_std = self.min_group_std, payload["min_group_std"]
            return True, nxt, f"min_group_std {old:g} -> {self.min_group_std:g} from step {nxt}"
        if kind == S.SET_DIFFICULTY:
            if self.task.levels < 2:
                return False, None, f"task {self.task.name!r} has no difficulty levels"
            old = self.task.level
            self.task.set_level(payload["level"])
            return True, nxt, f"level {old} -> {self.task.level} from step {nxt}"
        g = self.cfg.grpo
        if kind in (S.SET_GROUP_SIZE, S.SET_PROMPTS, S.SET_TEMPERATURE):
            key = {S.SET_GROUP_SIZE: "group_size", S.SET_PROMPTS: "prompts_per_step",
                   S.SET_TEMPERATURE: "temperature"}[kind]
            old = getattr(g, key)
            setattr(g, key, payload[key])
            return True, nxt, f"{key} {old:g} -> {payload[key]:g} from step {nxt}"
        if kind == S.SET_STEPS:
            if payload["steps"] < self.step:
                return False, None, f"steps {payload['steps']} is below the current step {self.step}"
            old, g.steps = g.steps, payload["steps"]
            return True, nxt, f"steps {old} -> {g.steps}" + (" (ends after this step)" if g.steps == self.step else "")
        if kind == S.SET_AUTOPILOT:
            self.autopilot_on = payload["enabled"]
            return True, nxt, f"autopilot {'on' if self.autopilot_on else 'off'} from step {nxt}"
        if kind == S.PAUSE:
            if self.paused:
                return False, None, "already paused"
            self.paused = True
            self.store.set_status(S.PAUSED)
            return True, self.step, f"paused after step {self.step}"
        if kind == S.RESUME:
            if not self.paused:
                return False, None, "not paused"
            self.paused = False
            self.store.set_status(S.RUNNING)
            return True, nxt, f"resumed at step {nxt}"
        if kind == S.STOP:
            self.stop_source = req.get("source") or "ui"
            why = payload.get("reason")
            self.stop_reason = f"stop request {req['id']} from {self.stop_source}" + (f": {why}" if why else "")
            return True, self.step, f"stopping after step {self.step}"
        if kind == S.CHECKPOINT:
            path = self.save_checkpoint("request")
            return True, self.step, f"checkpoint {path.name}"
        return False, None, f"unknown request kind {kind!r}"

    def wait_while_paused(self):
        while self.paused and not self.stop_reason:
            time.sleep(0.5)
            self.poll_control()

    # ---- settings in force and the autopilot ---------------------------------------------------
    def settings(self) -> dict:
        g = self.cfg.grpo
        return {"weights": dict(self.reward.weights), "min_group_std": self.min_group_std, "level": self.task.level,
                "max_level": self.task.levels, "group_size": g.group_size, "prompts_per_step": g.prompts_per_step,
                "temperature": g.temperature, "steps": g.steps, "autopilot": self.autopilot_on,
                "outcome_metric": self.cfg.reward.outcome_metric or None, "uniform_std": self.cfg.health.uniform_std,
                "metric_max": AP.metric_max(self.metric_kinds)}

    def publish_settings(self):
        """Meta "settings": what is in force now (the live page and the runs list read it)."""
        self.store.set_meta(settings=self.settings())

    def run_autopilot(self):
        """The autopilot looks at the steps so far; its moves are requests that poll_control
        applies at the next step boundary, like the user's."""
        self.autopilot.settings = self.settings()
        ids = AP.step_hook(self.store, self.step, self.autopilot, self.cfg.autopilot, self.cfg.health)
        if ids:
            self.log(f"autopilot after step {self.step}: request(s) {', '.join(map(str, ids))}")

    # ---- alerts and curriculum ------------------------------------------------------------------
    def new_alerts(self, step: int, scalars: dict) -> list[tuple[str, dict]]:
        """Alert events for alerts that start at this step. An ongoing alert is not repeated, and
        one that went quiet for fewer than ALERT_REARM steps is the same episode (measured on
        the demo: a trend alert near its significance line flaps on and off every few steps)."""
        h = self.cfg.health
        keep = max(h.trend_window, h.near_zero_steps, h.zero_trainable_steps) + 1
        self.history.append({"step": step, **scalars})
        del self.history[:-keep]
        held = health.alert_kinds(self.history, h)
        is_new = lambda kind: step - self.active_alerts.get(kind, -ALERT_REARM - 1) > ALERT_REARM  # noqa: E731
        if held is not None and not any(map(is_new, held)):  # nothing starts: no message to write
            self.active_alerts.update(dict.fromkeys(held, step))
            return []
        # An alert starts (or the window has gaps): health.alerts() writes the messages.
        # Only the columns alerts() reads: building a frame of every logged name cost more than the alerts.
        wide = pd.DataFrame({n: [r.get(n, np.nan) for r in self.history] for n in health.ALERT_INPUTS},
                            index=pd.Index([r["step"] for r in self.history], name="step"))
        now = health.alerts(wide, h)
        events = [(S.EV_ALERT, {"kind": a.kind, "severity": a.severity, "message": a.message, "step": a.step})
                  for a in now if is_new(a.kind)]
        self.active_alerts.update({a.kind: step for a in now})
        return events

    def curriculum(self, scalars: dict) -> list[tuple[str, dict]]:
        c = self.cfg.curriculum
        if c.mode != "auto" or self.task.levels < 2:
            return []
        easy = scalars[N.TRAINABLE_RATIO] < c.raise_ratio and scalars[N.REWARD] > c.raise_reward
        self.curriculum_streak = self.curriculum_streak + 1 if easy else 0
        top = min(c.max_level, self.task.levels)
        if self.curriculum_streak < c.window or self.task.level >= top:
            return []
        old = self.task.level
        self.task.set_level(old + 1)
        self.curriculum_streak = 0
        msg = (f"curriculum: level {old} -> {self.task.level} from step {self.step + 1} (ratio < {c.raise_ratio:g} "
               f"and reward > {c.raise_reward:g} for {c.window} steps)")
        self.log(msg)
        return [(S.EV_CHANGE, {"kind": S.SET_DIFFICULTY, "request": {"level": self.task.level},
                               "source": "curriculum", "message": msg})]

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, reason: str) -> Path:
        self.flush_writes()  # a checkpoint at step N implies steps <= N are stored (--resume truncates after it)
        root = self.store.run_dir / "checkpoints"
        final = root / f"{CKPT_PREFIX}{self.step:06d}"
        if self.last_ckpt_step == self.step and final.is_dir():
            return final
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        for old in root.glob(".tmp-*") if root.is_dir() else []:  # left by a killed trainer (never loaded)
            pid = old.name.rsplit("-", 1)[-1]
            if old == tmp or not (pid.isdigit() and S.pid_alive(int(pid))):
                shutil.rmtree(old, ignore_errors=True)
        try:
            models.save_pretrained(self.model, self.tokenizer, tmp)
            torch.save({"step": self.step, "optimizer": self.optimizer.state_dict(), "rng": _rng_state(),
                        "task": self.task.state_dict(), "weights": dict(self.reward.weights),
                        "min_group_std": self.min_group_std, "cum": [self.cum_submitted, self.cum_trainable],
                        "curriculum_streak": self.curriculum_streak, "active_alerts": self.active_alerts,
                        "history": self.history, "autopilot": self.autopilot.to_dict(),
                        "autopilot_on": self.autopilot_on,
                        "grpo_settings": {k: getattr(self.cfg.grpo, k) for k in ("group_size", "prompts_per_step",
                                                                                 "temperature")}}, tmp / "state.pt")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write (disk full) leaves no half checkpoint
            raise
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)  # atomic: the folder is complete or absent
        for old in checkpoint_dirs(self.store.run_dir)[:-CKPT_KEEP]:
            shutil.rmtree(old, ignore_errors=True)
        self.last_ckpt_step = self.step
        self.store.add_event(S.EV_CHECKPOINT, {"path": str(final), "reason": reason}, step=self.step)
        return final

    def _load_checkpoint(self):
        ckpt = latest_checkpoint(self.store.run_dir)
        if ckpt is None:
            raise ConfigError(f"--resume: run {self.store.run_id} has no complete checkpoint in "
                              f"{self.store.run_dir / 'checkpoints'}; start it again without --resume")
        self.model, self.tokenizer = models.load_pretrained(str(ckpt), self.device,
                                                            next(self.model.parameters()).dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.grpo.lr,
                                           weight_decay=self.cfg.grpo.weight_decay)
        st = torch.load(ckpt / "state.pt", weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        _set_rng_state(st["rng"])
        self.task.load_state_dict(st["task"])
        self.reward.set_weights(st["weights"])
        self.min_group_std = st["min_group_std"]
        self.cum_submitted, self.cum_trainable = st["cum"]
        self.curriculum_streak = st.get("curriculum_streak", 0)
        seen = st.get("active_alerts", {})
        self.active_alerts = seen if isinstance(seen, dict) else dict.fromkeys(seen, int(st["step"]))
        self.history = st.get("history", [])
        for k, v in st.get("grpo_settings", {}).items():  # changed mid-run by requests (steps: below)
            setattr(self.cfg.grpo, k, v)
        self.cfg.grpo.steps = resumed_budget(self.store.get_meta(), self.cfg.grpo.steps)
        self.autopilot = AP.AutopilotState.from_dict(st.get("autopilot"))
        self.autopilot.stopped = False  # resuming is the user's call: the autopilot may act again
        self.autopilot_on = st.get("autopilot_on", self.autopilot_on)
        self.step = self.last_ckpt_step = int(st["step"])
        # Requests applied after the checkpoint were part of the lost steps: apply them again.
        done = self.store.control()
        if len(done):
            later = done[(done["status"] == S.APPLIED) & (done["applied_step"] > self.step)]
            for _, r in later.iterrows():
                if r["kind"] in (S.SET_WEIGHTS, S.SET_THRESHOLD, S.SET_DIFFICULTY, S.SET_GROUP_SIZE, S.SET_PROMPTS,
                                 S.SET_TEMPERATURE, S.SET_AUTOPILOT):
                    self.apply_request({"id": int(r["id"]), "kind": r["kind"], "payload": r["payload"]})
        self.resumed_from = ckpt

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> str:
        """Train to cfg.grpo.steps or a stop; returns the final status. Exceptions propagate
        (run_safely records them)."""
        cfg, store = self.cfg, self.store
        store.set_meta(pid=os.getpid(), host=os.uname().nodename, started=time.time(), error=None,
                       metric_names=self.reward.names, metric_kinds=self.metric_kinds,
                       model=self.model_info, device=str(self.device), config=cfg.to_dict())
        store.set_status(S.RUNNING, stop_reason=None)
        self.publish_settings()
        if self.resume:
            dropped = store.truncate_after(self.step)
            store.add_event(S.EV_LIFECYCLE, {"event": "resumed", "from": str(self.resumed_from),
                                             "steps_redone": dropped}, step=self.step)
            self.log(f"resumed from {self.resumed_from.name} (step {self.step})")
        else:
            store.add_event(S.EV_LIFECYCLE, {"event": "started", "model": self.model_info,
                                             "steps": cfg.grpo.steps}, step=0)
        beat = Heartbeat(store.path)
        beat.start()
        store.defer_checkpoints()  # the heartbeat thread checkpoints the WAL from now on
        mirror = self.open_mirror()
        bar = None
        if cfg.log.progress:
            from tqdm import tqdm
            bar = tqdm(total=cfg.grpo.steps, initial=self.step, desc=store.run_id, file=sys.stderr,
                       dynamic_ncols=True, mininterval=0.5)
        finished = False
        try:
            # The loop writes its steps and commits those of the last log.commit_every_s together
            # (BatchedWrites: one commit per batch, not per step; writer.py says why).
            # log.background_writes: steps are handed to a thread that writes them during the next
            # backward pass (gated: train_on lets it go there), so their JSON and rows do not take
            # turns with the loop. Off by default: on the 2-core shared benchmark box (no core to
            # spare) the step measured as fast or up to ~8% slower with it (docs/benchmarks.md).
            self.writer = (StoreWriter(store.path, gated=True) if cfg.log.background_writes
                           else BatchedWrites(store, cfg.log.commit_every_s) if cfg.log.commit_every_s > 0 else None)
            while self.step < cfg.grpo.steps and not self.stop_reason:
                self.poll_control()
                self.wait_while_paused()
                if self.stop_reason:
                    break
                scalars, groups, rollouts = self.train_step()
                self.step += 1
                events = self.new_alerts(self.step, scalars) + self.curriculum(scalars)
                t0 = time.perf_counter()
                if self.writer is not None and self.writer.threaded:  # for the next poll_control (see there)
                    self.requests_waiting = store.has_pending()
                self.log_step(scalars, groups, rollouts, events)
                if mirror is not None:
                    self.flush_writes()  # the mirror reads this step's events back from the store
                    self.mirror_step(mirror, scalars, groups, rollouts)
                self.last_log_s = time.perf_counter() - t0
                if self.autopilot_on and not self.stop_reason and self.step < cfg.grpo.steps:
                    self.flush_writes()  # the autopilot reads the window from the store
                    self.run_autopilot()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{scalars[N.REWARD]:.3f}", ratio=f"{scalars[N.TRAINABLE_RATIO]:.2f}",
                                    level=self.task.level, refresh=False)
                every = cfg.log.checkpoint_every
                if every and self.step % every == 0 and self.step < cfg.grpo.steps:
                    self.save_checkpoint("periodic")
            finished = True
        finally:
            try:  # every step handed over is committed before the final status (or failed) is written
                self.close_writer(raise_error=finished)
            finally:
                if bar is not None:
                    bar.close()
                beat.stop()
                store.defer_checkpoints(False)
                if mirror is not None:
                    mirror.finish()
        self.save_checkpoint("stop" if self.stop_reason else "end")
        status = S.STOPPED if self.stop_reason else S.FINISHED
        store.add_event(S.EV_LIFECYCLE, {"event": status, "reason": self.stop_reason}, step=self.step)
        store.reject_open_requests(f"run {status} at step {self.step}")
        store.set_status(status, **({"stop_reason": self.stop_source or "signal", "stop_message": self.stop_reason}
                                    if self.stop_reason else {}))
        return status

    # ---- the store writes of the loop ---------------------------------------------------------
    def log_step(self, scalars: dict, groups: S.StepGroups, rollouts: S.StepRollouts, events: list[tuple]):
        """Step self.step into the store: in run(), kept and committed with the steps of the last
        log.commit_every_s (BatchedWrites) or handed to the background writer (log.background_writes);
        else written here. Each step is whole in the store either way."""
        if self.writer is not None:
            self.writer.submit("log_step", self.step, scalars, groups, rollouts, events)
        else:
            self.store.log_step(self.step, scalars, groups, rollouts, events)

    def writer_go(self):
        """The background writer may write the steps handed over so far (see StoreWriter)."""
        if self.writer is not None:
            self.writer.go()

    def flush_writes(self):
        """Every step submitted is committed (raises the writer's error, e.g. a full disk)."""
        if self.writer is not None:
            self.writer.flush()

    def close_writer(self, raise_error: bool = True):
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close(raise_error=raise_error)

    def open_mirror(self):
        """The W&B mirror when log.wandb is offline/online (imported lazily: wandb is optional)."""
        if self.cfg.log.wandb == "off":
            return None
        from grpo_core.integrations.wandb import WandbMirror
        self._mirrored_event = 0
        return WandbMirror(self.cfg.log.wandb, self.cfg.log.wandb_project, self.store.run_id,
                           self.store.run_dir, self.cfg.to_dict())

    def mirror_step(self, mirror, scalars: dict, groups: S.StepGroups, rollouts: S.StepRollouts):
        """Mirror the step just stored, and every event since the last one (applied and
        rejected requests come from the store, so the mirror sees exactly what readers see)."""
        mirror.log_step(self.step, scalars, groups.frame(), rollouts)
        ev = self.store.events(since_id=self._mirrored_event,
                               kinds=[S.EV_CHANGE, S.EV_REJECTED, S.EV_ALERT, S.EV_CHECKPOINT])
        for kind, payload, step in zip(ev["kind"], ev["payload"], ev["step"]):
            mirror.event(kind, payload, None if step != step else int(step))
        if len(ev):
            self._mirrored_event = int(ev["id"].iloc[-1])

    def run_safely(self) -> str:
        """run(), recording a crash as status failed with the traceback in meta.error."""
        try:
            return self.run()
        except BaseException as e:
            text = traceback.format_exc()
            why = S.storage_problem(e)
            if why:  # the disk's fault: the last line (what the runs page shows) says so and what to do
                text += "\n" + self.storage_message(why)
            for attempt in range(2):
                try:
                    self.store.add_event(S.EV_LIFECYCLE, {"event": "failed", "error": f"{type(e).__name__}: {e}"},
                                         step=self.step)
                    self.store.reject_open_requests(f"run failed at step {self.step}")
                    self.store.set_status(S.FAILED, error=text)
                    break
                except Exception:
                    if attempt or not why:
                        break
                    try:  # a full disk: fold the WAL into the db so the status write can reuse its space
                        self.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    except Exception:
                        break
            raise

    def storage_message(self, why: str) -> str:
        try:  # the last step written, not self.step (its write may be the one that failed)
            last = self.store.last_step() or 0
        except Exception:
            last = "?"
        if latest_checkpoint(self.store.run_dir) is None:
            return (f"cannot write to {self.store.run_dir} ({why}): stopped after step {last}, before any "
                    "complete checkpoint; free space, then start the run again")
        return (f"cannot write to {self.store.run_dir} ({why}): stopped after step {last}; every step up to "
                f"it is kept. Free space, then continue: python -m grpo_core train --resume "
                f"--run-id {self.store.run_id} --runs-dir {self.runs_root}")


# =============================================================================================
# CLI
# =============================================================================================
def _install_stop_signals(trainer: Trainer):
    """SIGTERM / first Ctrl-C: finish the step, checkpoint, status stopped. A second Ctrl-C
    interrupts at once."""
    def handler(signum, frame):
        if trainer.stop_reason:
            raise KeyboardInterrupt
        trainer.stop_reason = signal.Signals(signum).name
        trainer.log(f"{trainer.stop_reason}: stopping after this step")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def preflight(cfg: RunConfig):
    """What can be checked before a store exists and a model loads: every dataset row, the
    custom metrics import, a local model folder. ConfigError names the field/line."""
    make_task(cfg)
    names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
    build_metrics(names, cfg.reward.custom)
    if cfg.model.path:
        models.check_model_path(cfg.model.path)


def open_run(args) -> tuple[RunConfig, S.RunStore]:
    """Config + store from CLI args (new run, a run the dashboard created, or --resume)."""
    overrides = list(getattr(args, "overrides", None) or [])
    if getattr(args, "resume", False):
        if not args.run_id:
            raise ConfigError("--resume needs --run-id: the run to continue")
        if args.config:
            raise ConfigError("--resume continues with the run's stored config: drop --config "
                              "(use --set, e.g. --set grpo.steps=400, to change a knob)")
        store = S.RunStore.open(S.runs_dir(args.runs_dir) / S.check_run_id(args.run_id))
        cfg = validate(from_dict(apply_overrides(store.config, overrides)))
        return cfg, store
    cfg = load_config(args.config, overrides)
    preflight(cfg)  # bad dataset rows, metrics or model folder: one line, and no run is created
    root = args.runs_dir or cfg.log.runs_dir or None
    run_id = args.run_id or S.new_run_id(cfg.task.name)
    store = S.RunStore.create(run_id, cfg.to_dict(), root=root, exist_ok=True)
    status = store.get_meta().get("status")
    if status != S.CREATED:
        store.close()
        raise ConfigError(f"run {run_id!r} already exists (status {status}): pass --resume to continue it, "
                          "or choose another --run-id")
    store.set_meta(config=cfg.to_dict())
    toml = store.run_dir / "config.toml"
    if not toml.exists():
        toml.write_text(cfg.to_toml())
    return cfg, store


def cli_train(args) -> int:
    cfg, store = open_run(args)
    # Our pid before the (maybe long) model load: a trainer killed while starting shows stale, not created.
    store.set_meta(pid=os.getpid(), host=os.uname().nodename)
    set_threads(cfg)
    print(f"run {store.run_id}: {store.run_dir}", file=sys.stderr, flush=True)
    try:
        trainer = Trainer(cfg, store, resume=bool(getattr(args, "resume", False)))
    except BaseException as e:
        msg = str(e) if isinstance(e, ConfigError) else traceback.format_exc()
        store.reject_open_requests("trainer failed to start")
        store.set_status(S.FAILED, error=msg)
        raise
    _install_stop_signals(trainer)
    try:
        status = trainer.run_safely()
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        why = S.storage_problem(e)
        if why:  # disk full / read-only: one clear line, not a traceback (meta.error has both)
            print(f"error: {trainer.storage_message(why)}", file=sys.stderr)
        else:
            traceback.print_exc()
        return 1
    last = store.scalars_wide(since_step=store.last_step() - 1) if store.last_step() else None
    if last is not None and not last.empty:
        r = last.iloc[-1]
        print(f"run {store.run_id} {status} at step {trainer.step}: reward {r[N.REWARD]:.3f}, "
              f"trainable ratio {r[N.TRAINABLE_RATIO]:.2f}", file=sys.stderr)
    return 0
