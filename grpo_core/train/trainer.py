"""The embedded GRPO trainer: rollout -> score -> health -> advantage -> loss -> update -> log.

The step's math is grpo.py; `Trainer` wires it to a task, a run store and the control
requests the dashboard writes, with checkpoints (checkpoints.py) and a heartbeat (runs/lifecycle.py).

- Control requests are claimed and applied between steps only, so a step never sees
  half a change; each is resolved with the step it takes effect at.
- Under torchrun (ranks.py) every rank runs this loop on its share of each step's prompts.
  Rank 0 alone holds the store: it reads the requests and the ranks apply them together at
  the same step boundary; the step's numbers are computed from every rank's scores
  (step_batch.py), so they are the same on 1 rank or N, and rank 0 logs them.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from pathlib import Path

import numpy as np
import torch

from grpo_core.analysis import autopilot, step_stats
from grpo_core.errors import ConfigError
from grpo_core.runs import failure, live_settings, names
from grpo_core.runs.config import RunConfig
from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.live_settings import CHECKPOINT, CONTROL_KINDS, PAUSE, RESUME, STOP
from grpo_core.runs.locations import storage_problem
from grpo_core.runs.requests import validate_request
from grpo_core.runs.run_meta import FINISHED, PAUSED, RUNNING, STOPPED, RunMeta
from grpo_core.runs.step_columns import StepGroups, StepRollouts
from grpo_core.runs.store import APPLIED, EV_CHECKPOINT, EV_MEMORY, RunStore
from grpo_core.runs.writer import BatchedWrites
from grpo_core.tasks import build_metrics, chat, make_task
from grpo_core.tasks.rewards import CompositeReward
from grpo_core.train import (budgets, checkpoints, collapse_check, evaluation, grpo, models, out_of_memory,
                             rank_failure, ranks, sampling, step_batch, step_record, step_sinks)
from grpo_core.train.native_sampling import Rollouts
from grpo_core.train.ranks import SINGLE, Ranks, group_seeds
from grpo_core.train.skipping import PromptSkipper
from grpo_core.train.step_events import AlertWatch, Curriculum

logger = logging.getLogger(__name__)  # what a run says as it goes; `python -m grpo_core` shows it on stderr


class Trainer:
    def __init__(self, cfg: RunConfig, store: RunStore | None, *, resume: bool = False, log=None,
                 ranks: Ranks = SINGLE, run_dir: Path | None = None):
        """`store` on rank 0 (every rank of a single process); the other ranks of a torchrun job
        have none and are given the run's folder (`run_dir`) instead."""
        self.cfg, self.store, self.resume, self.ranks = cfg, store, resume, ranks
        self.log = log or logger.info  # log: a callable instead (a test's silence, a quiet rank)
        self.run_dir = store.run_dir if store is not None else Path(run_dir)
        self.runs_root = self.run_dir.parent
        g = cfg.grpo
        self.task = make_task(cfg)
        metric_names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
        fns, self.metric_kinds = build_metrics(metric_names, cfg.reward.custom)
        self.reward = CompositeReward(fns, cfg.reward.weights)
        self.held_out = evaluation.held_out(cfg, self.task, self.reward.names, self.metric_kinds)
        self.outcome_index = (self.reward.names.index(cfg.reward.outcome_metric)
                              if cfg.reward.outcome_metric else None)
        self.step = 0  # last finished step; steps are numbered from 1
        self.cum_submitted = self.cum_trainable = 0
        self.cum_tokens = (0, 0)  # completion tokens sampled, and those in groups that taught nothing
        self.paused = False
        self.stop_reason: str | None = None
        self.signal_reason: str | None = None  # a stop signal this rank got: the ranks agree on it at the next step
        self.alerts = AlertWatch(cfg.health, cfg.reward.outcome_metric or None)
        self.curriculum = Curriculum(cfg.curriculum, self.task, self.log)
        self.last_log_s = 0.0
        self.last_ckpt_step: int | None = None
        self.autopilot_on = cfg.autopilot.enabled  # set_autopilot switches it mid-run
        self.autopilot = autopilot.AutopilotState()
        self.stop_source: str | None = None  # source of the stop request (meta stop_reason); None: a signal
        self.writer: BatchedWrites | None = None  # during run(): how steps reach the store
        self.skipper = PromptSkipper.from_config(g)  # grpo.skip_zero_variance (skipping.py)
        self.history = budgets.BudgetHistory()  # each prompt's groups so far: grpo.budget_pilot's prediction
        self.failure: str | None = None  # the one line of a run that failed (failure_line)

        torch.manual_seed(g.seed)
        np.random.seed(g.seed)
        random.seed(g.seed)
        if not ranks.main:  # rank 0 loads first: a built-in model's warm-start is then cached for the others
            ranks.broadcast(None)
        self.model, self.tokenizer, self.model_info = models.load_policy(
            cfg.model, self.task, self.runs_root, seed=g.seed, log=self.log)
        if ranks.main:
            ranks.broadcast(None)
        self.device = next(self.model.parameters()).device
        # Weights and optimizer state in fp32; forward passes in the compute dtype (model.dtype).
        self.compute_dtype = models.pick_device(cfg.model)[1]
        self.scaler = torch.amp.GradScaler(self.device.type) if self.compute_dtype == torch.float16 else None
        self.suppress_ids = models.suppressed_token_ids(self.tokenizer)
        self.ref_model = None
        self.pending_events: list[tuple[str, dict]] = []  # out-of-memory retries, logged with the step
        if g.beta > 0 and not cfg.model.lora_rank:  # the frozen reference: the starting policy (after warm-start)
            self.ref_model, _, _ = models.load_policy(cfg.model, self.task, self.runs_root, seed=g.seed)
            self.ref_model.requires_grad_(False)
            if self.compute_dtype != torch.float32:  # never trained: its weights need no fp32 copy
                self.ref_model.to(self.compute_dtype)
        self.prepare_model()
        # Its requests are its handlers: every kind, a difficulty only on a task with levels.
        kinds = [k for k in CONTROL_KINDS if k not in live_settings.BY_KIND or live_settings.BY_KIND[k].available(self)]
        self.handlers = dict.fromkeys(kinds, self.apply_request)
        self.session = RunSession(store, self.handlers, self.refuse_request) if store is not None else None
        if resume:
            self._load_checkpoint()
        ranks.same_parameters(self.model)  # every rank from rank 0's weights, as DDP starts
        # After any resume: the engine starts from the weights the trainer holds now.
        self.sampler = sampling.make_sampler(self.model, self.tokenizer, cfg, self.model_info, self.run_dir,
                                             self.device, self.compute_dtype)
        self.model_info["engine"] = self.sampler.name
        budgets.check_engine(g, self.sampler.name)

    def prepare_model(self):
        """LoRA adapters and activation checkpointing on the loaded policy, and the optimizer
        over what trains (the adapters alone with LoRA, whose reference is the same model with
        its adapters off: no second copy)."""
        m, g = self.cfg.model, self.cfg.grpo
        if m.lora_rank and not models.is_lora(self.model):
            self.model = models.apply_lora(self.model, m)
            if g.beta > 0:
                self.ref_model = models.AdaptersOff(self.model)
        if m.gradient_checkpointing:
            models.enable_checkpointing(self.model)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=g.lr,
                                           weight_decay=g.weight_decay)

    # ---- one step ------------------------------------------------------------------------
    def sample(self) -> step_batch.StepBatch:
        """Draw prompt batches (more than one only with dynamic sampling) and score them. Every
        rank draws the step's whole batch (the task's stream is seeded alike) and samples its
        share, each group from its own seed; the scores of every rank are gathered."""
        g = self.cfg.grpo
        rolls, scored, mine, examples, t_gen, t_score = [], [], [], [], 0.0, 0.0
        if g.budget_pilot:  # per-prompt budgets: a pilot, then the rest where it saw signal
            return budgets.sample_step(self)
        trainable_so_far = 0
        while True:
            drawn = self.skipper.draw(self.task.batch, g.prompts_per_step)
            share = self.ranks.share(len(drawn))
            t0 = time.perf_counter()
            roll = self.rollout(drawn[share], seeds=group_seeds(g.seed, self.step + 1, len(rolls), share.start,
                                                                share.stop - share.start))
            t1 = time.perf_counter()
            self.reward.at_step(self.step, g.steps, roll)  # TRL-style reward functions' trainer_state and ids
            local = self.reward.score(roll.texts, roll.examples)
            t_gen, t_score = t_gen + t1 - t0, t_score + time.perf_counter() - t1
            mine += range(len(examples) + share.start, len(examples) + share.stop)
            rolls.append(roll)
            examples += drawn
            scored.append(step_batch.gather(self.ranks, step_batch.Scored.of(roll, local.raw, local.errors)))
            if not g.dynamic_sampling or len(rolls) >= g.dynamic_max_batches:
                break
            # The step's own rule: with an outcome gate, a phantom group does not count toward the target.
            raw = scored[-1].raw
            st = step_stats.group_stats(self.reward.totals(raw).reshape(-1, g.group_size),
                                        raw.reshape(-1, g.group_size, raw.shape[1]), min_group_std=g.min_group_std,
                                        outcome_index=self.outcome_index, uniform_std=self.cfg.health.uniform_std)
            trainable_so_far += int(st.trainable.sum())
            if trainable_so_far >= g.dynamic_min_trainable:
                break
        return step_batch.StepBatch.join(rolls, self.tokenizer.pad_token_id, mine, examples, scored, t_gen, t_score)

    def rollout(self, examples: list[dict], group_size: int | None = None, temperature: float | None = None,
                seeds: list[int] | None = None):
        """The sampler's rollout with the run's settings, in batches halved while they do not fit
        in memory. `seeds`: one per group (None: torch's generator)."""
        g = self.cfg.grpo

        t = self.cfg.task
        prompts = [chat.render(self.tokenizer, e["prompt"], t.chat_template, t.system_prompt) for e in examples]

        def attempt(batch_groups: int) -> Rollouts:
            with grpo.autocast(self.device, self.compute_dtype):
                return self.sampler.rollout(self.model, self.tokenizer, examples, group_size or g.group_size,
                                    max_new_tokens=g.max_new_tokens, top_p=g.top_p, top_k=g.top_k,
                                    suppress_ids=self.suppress_ids,
                                    temperature=g.temperature if temperature is None else temperature,
                                    batch_groups=batch_groups, prompts=prompts, seeds=seeds,
                                    add_special_tokens=not chat.uses_template(self.tokenizer, t.chat_template))
        return out_of_memory.halving(attempt, g.sample_batch_groups or len(examples), stage="sampling",
                                     knob="grpo.sample_batch_groups", on_retry=self.memory_retry("sample_batch_groups"))

    def evaluate(self) -> dict[str, float]:
        """The held-out evaluation's scalars (evaluation.py), with its time."""
        t0 = time.perf_counter()
        out = self.held_out.run(self.rollout, self.reward, self.cfg.grpo.temperature, self.device)
        return {**out, names.TIME_EVAL: time.perf_counter() - t0}

    def train_on(self, roll, adv: np.ndarray, trainable: np.ndarray) -> dict:
        """grpo.train_on, its micro-batch halved while the step does not fit in memory (under
        torchrun: on any rank, and then on every rank)."""
        g = self.cfg.grpo
        forwarded = int(grpo.forwarded_groups(trainable, g, g.beta > 0 and self.ref_model is not None).sum())
        return out_of_memory.halving(
            lambda n: grpo.train_on(self.model, self.optimizer, roll, adv, trainable,
                                    dataclasses.replace(g, micro_batch_groups=n), ref_model=self.ref_model,
                                    suppress_ids=self.suppress_ids, compute_dtype=self.compute_dtype,
                                    scaler=self.scaler, world=self.ranks),
            min(grpo.micro_batch_groups(self.model, roll, max(forwarded, 1), g, self.compute_dtype), max(forwarded, 1)),
            stage="training",
            knob="grpo.micro_batch_groups", on_retry=self.memory_retry("micro_batch_groups"))

    def memory_retry(self, knob: str):
        """on_retry for out_of_memory.halving: the smaller batch stays for the rest of the run
        (the next steps would not fit either) and an event says so."""
        def retry(groups: int, error: str):
            setattr(self.cfg.grpo, knob, groups)
            self.pending_events.append((EV_MEMORY, {"knob": f"grpo.{knob}", "groups": groups, "error": error,
                                                    **({"rank": self.ranks.rank} if self.ranks.distributed else {})}))
            self.log(f"out of memory ({error}): retrying with grpo.{knob}={groups}")
        return retry

    def train_step(self, update: bool = True) -> tuple[dict, StepGroups, StepRollouts]:
        """One GRPO step; update=False samples, scores and logs without training (the pilot)."""
        t_start = time.perf_counter()
        # sample: this rank's share of the step's completions, scored; every rank's scores gathered
        sample = self.sample()
        self.last_roll = sample.roll  # the collapse check's sample (one_step)
        # group statistics and advantages: which groups can teach, and what each completion is worth
        t0 = time.perf_counter()
        groups = step_record.score_groups(self, sample)
        score_s = sample.score_s + time.perf_counter() - t0
        # update: the loss on this rank's trainable groups, one optimizer step, the engine's weights synced
        t0 = time.perf_counter()
        lr = self.set_learning_rate()
        loss, sync_s = self.update(sample, groups) if update else (None, None)
        train_s = time.perf_counter() - t0 - (sync_s or 0.0)
        # what the step taught: why each flat group was flat; each prompt's history (skipping, budgets)
        outcomes = step_record.flat_outcomes(self, sample, groups)
        skipped = self.skipper.after_step(sample.examples, groups.stats.trainable)
        self.history.after_step(sample.examples, groups.stats.trainable)
        # the step's numbers and the store's columns
        times = step_record.StepTimes(time.perf_counter() - t_start, sample.generate_s, score_s, train_s, sync_s,
                                      self.last_log_s)
        scalars = {**step_record.step_scalars(self, sample, groups, outcomes, loss, lr, times), **skipped}
        self.cum_submitted = int(scalars[names.CUM_GROUPS_SUBMITTED])
        self.cum_trainable = int(scalars[names.CUM_GROUPS_TRAINABLE])
        self.cum_tokens = (int(scalars[names.CUM_SAMPLED_TOKENS]), int(scalars[names.CUM_WASTED_TOKENS]))
        n_text = len(sample.examples) if self.cfg.log.keep_text == "all" else \
            min(len(sample.examples), self.cfg.log.text_sample_groups)
        return (scalars, *step_batch.store_columns(sample, self.cfg.grpo.group_size, self.reward.names,
                                                   groups.row_totals, groups.stats, outcomes, n_text))

    def set_learning_rate(self) -> float:
        """grpo.lr under its warmup and schedule at this step, set on the optimizer."""
        g = self.cfg.grpo
        lr = g.lr * grpo.lr_factor(self.step, g.warmup_steps, g.steps, g.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def update(self, sample: step_batch.StepBatch, groups: step_record.ScoredGroups) -> tuple[dict, float | None]:
        """The loss on this rank's trainable groups and one optimizer step -> (train_on's numbers,
        the engine's weight-sync seconds: None when no row trained or the sampler is ours)."""
        self.sampler.before_update()
        loss = self.train_on(sample.roll, groups.adv[sample.mine], groups.stats.trainable[sample.mine])
        # an update happened: the engine samples the next step from the new weights
        return loss, (self.sampler.sync(self.model) if loss["rows"] else None)

    # ---- control requests -------------------------------------------------------------------
    def poll_control(self):
        """At a step boundary: rank 0 claims the open requests and every rank applies them, in
        order; a stop signal any rank got stops them all after the same step."""
        claimed = self.claim_requests() if self.ranks.main else []
        shared = self.ranks.gather((claimed, self.signal_reason, self.in_force()))
        if len({state for _, _, state in shared}) > 1:  # a rank applied something the others did not
            raise RuntimeError(f"the ranks disagree on the settings after step {self.step}: "
                               + " | ".join(f"rank {r}: {state}" for r, (_, _, state) in enumerate(shared)))
        signalled = [f"{why} (rank {r})" if self.ranks.distributed else why
                     for r, (_, why, _) in enumerate(shared) if why]
        if signalled and not self.stop_reason:
            self.stop_reason = signalled[0]
            self.log(f"{self.stop_reason}: stopping after step {self.step}")
        if not self.ranks.main:  # the same requests, applied alike; rank 0 answers them in the store
            for req in shared[0][0]:
                self.handlers.get(req["kind"], self.refuse_request)(req)
            return
        for req, applied, step, message in self.session.serve(shared[0][0]):
            self.log(f"request {req['id']} {req['kind']}: {'applied' if applied else 'rejected'} ({message})")
            if applied:
                autopilot.note_applied(self.autopilot, req, step)
                self.publish_settings()

    def in_force(self) -> str:
        """What every rank must hold alike between steps: the step, the pause and the settings."""
        return json.dumps([self.step, self.paused, self.settings()], sort_keys=True, default=str) \
            if self.ranks.distributed else ""

    def claim_requests(self) -> list[dict]:
        """The open requests, claimed (rank 0)."""
        if not self.store.has_pending():  # a read: never waits behind a write transaction
            return []
        # What a request does refers to the steps so far (applied / paused / stopped at step N):
        # those steps are in the store before its answer is.
        self.flush_writes()
        return self.store.claim_pending()

    def apply_request(self, req: dict) -> tuple[bool, int | None, str]:
        """-> (applied, step it takes effect at, message). set_* take effect at the next step;
        pause/stop/checkpoint act on the state after the last finished step."""
        kind, nxt = req["kind"], self.step + 1
        try:
            payload = validate_request(kind, req.get("payload") or {}, self.reward.names, max_level=self.task.levels)
        except ConfigError as e:
            return False, None, str(e)
        setting = live_settings.BY_KIND.get(kind)
        if setting is not None:  # the setting reads, applies and describes itself
            value = setting.value(payload)
            why = setting.refusal(self, value)
            if why:
                return False, None, why
            old = setting.current(self)
            return True, nxt, setting.applied_text(self, old, setting.apply(self, value), nxt)
        if kind == PAUSE:
            if self.paused:
                return False, None, "already paused"
            self.paused = True
            if self.store is not None:
                self.store.set_status(PAUSED)
            return True, self.step, f"paused after step {self.step}"
        if kind == RESUME:
            if not self.paused:
                return False, None, "not paused"
            self.paused = False
            if self.store is not None:
                self.store.set_status(RUNNING)
            return True, nxt, f"resumed at step {nxt}"
        if kind == STOP:
            self.stop_source = req.get("source") or "ui"
            why = payload.get("reason")
            self.stop_reason = f"stop request {req['id']} from {self.stop_source}" + (f": {why}" if why else "")
            return True, self.step, f"stopping after step {self.step}"
        if kind == CHECKPOINT:
            path = self.save_checkpoint("request")
            return True, self.step, f"checkpoint {path.name if path else self.step}"
        return self.refuse_request(req)

    def refuse_request(self, req: dict) -> tuple[bool, None, str]:
        setting = live_settings.BY_KIND.get(req["kind"])
        why = setting.refusal(self, None) if setting is not None and not setting.available(self) else None
        return False, None, why or f"unknown request kind {req['kind']!r}"

    def wait_while_paused(self):
        while self.paused and not self.stop_reason:
            time.sleep(0.5)
            self.poll_control()

    # ---- settings in force and the autopilot ---------------------------------------------------
    def settings(self) -> dict:
        return {**{s.key: s.current(self) for s in live_settings.SETTINGS}, "max_level": self.task.levels,
                "outcome_metric": self.cfg.reward.outcome_metric or None, "uniform_std": self.cfg.health.uniform_std,
                "metric_max": autopilot.metric_max(self.metric_kinds),
                "budget_refusal": live_settings.BUDGET.refusal(self, autopilot.BUDGET_PILOT)}

    def publish_settings(self):
        """Meta "settings": what is in force now (the live page and the runs list read it)."""
        self.store.set_meta(settings=self.settings())

    def run_autopilot(self):
        """The autopilot looks at the steps so far; its moves are requests that poll_control
        applies at the next step boundary, like the user's."""
        self.autopilot.settings = self.settings()
        ids = autopilot.step_hook(self.store, self.step, self.autopilot, self.cfg.autopilot, self.cfg.health)
        if ids:
            self.log(f"autopilot after step {self.step}: request(s) {', '.join(map(str, ids))}")

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, reason: str) -> Path | None:
        """The weights and the training state after self.step, written once, by rank 0 (every
        rank holds the same weights and state); None on the other ranks."""
        if not self.ranks.main:
            return None
        self.flush_writes()  # a checkpoint at step N implies steps <= N are stored (--resume truncates after it)
        final = self.run_dir / "checkpoints" / f"{checkpoints.CKPT_PREFIX}{self.step:06d}"
        if self.last_ckpt_step == self.step and final.is_dir():
            return final
        final = checkpoints.write_checkpoint(self.run_dir, self.step, self.model, self.tokenizer,
                                             checkpoints.training_state(self))
        self.last_ckpt_step = self.step
        self.store.add_event(EV_CHECKPOINT, {"path": str(final), "reason": reason}, step=self.step)
        return final

    def _load_checkpoint(self):
        """--resume: rank 0 reads the last checkpoint, every rank takes its state (the weights
        follow in same_parameters), so a run resumes on any rank count."""
        state = self.ranks.broadcast(self._read_checkpoint() if self.ranks.main else None)
        checkpoints.restore_training_state(self, state)
        for req in state["replay"]:  # requests applied after the checkpoint were part of the lost steps
            self.apply_request(req)
        self.resumed_from = Path(state["path"])

    def _read_checkpoint(self) -> dict:
        """Rank 0: the last checkpoint's weights loaded, and its state with the step budget and
        the requests to apply again (read from the store)."""
        ckpt = checkpoints.latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise ConfigError(f"--resume: run {self.store.run_id} has no complete checkpoint in "
                              f"{self.run_dir / 'checkpoints'}; start it again without --resume")
        if models.is_lora(self.model):  # a LoRA checkpoint holds the adapters: the base is the run's own
            models.load_lora_state(self.model, ckpt)
        else:
            self.model, self.tokenizer = models.load_pretrained(str(ckpt), self.device,
                                                                models.master_dtype(self.compute_dtype))
        self.prepare_model()
        state = checkpoints.read_state(ckpt)
        done = self.store.control()
        later = done[(done["status"] == APPLIED) & (done["applied_step"] > int(state["step"]))] if len(done) else done
        replay = [{"id": int(r["id"]), "kind": r["kind"], "payload": r["payload"]} for _, r in later.iterrows()
                  if r["kind"] in live_settings.REPLAYED]
        budget = RunMeta.parse(self.store.get_meta()).resumed_budget(self.cfg.grpo.steps)
        return {**state, "replay": replay, "budget": budget, "path": str(ckpt)}

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> str:
        """Train to cfg.grpo.steps or a stop; returns the final status. Exceptions propagate
        (run_safely records them)."""
        cfg, main = self.cfg, self.ranks.main
        if main:
            self.start_session()
        sinks = step_sinks.open_sinks(self) if main else []  # where each step goes: store, mirrors, ...
        finished = False
        try:
            # The loop writes its steps and commits those of the last log.commit_every_s together
            # (BatchedWrites: one commit per batch, not per step; writer.py says why).
            self.writer = BatchedWrites(self.store, cfg.log.commit_every_s) if main and cfg.log.commit_every_s > 0 \
                else None
            while self.step < cfg.grpo.steps and not self.stop_reason:
                self.poll_control()
                self.wait_while_paused()
                if self.stop_reason:
                    break
                self.one_step(sinks)
            finished = True
        finally:
            try:  # every step handed over is committed before the final status (or failed) is written
                self.close_writer(raise_error=finished)
            finally:
                if self.session is not None:
                    self.session.stop_heartbeat()
                step_sinks.close_sinks(sinks)
        self.save_checkpoint("stop" if self.stop_reason else "end")
        status = STOPPED if self.stop_reason else FINISHED
        if main:
            self.session.finish(status, self.step, self.stop_reason,
                                **({"stop_reason": self.stop_source or "signal", "stop_message": self.stop_reason}
                                   if self.stop_reason else {}))
        return status

    def start_session(self):
        """Rank 0: the run's start in the store (status running, meta, the heartbeat)."""
        cfg, store = self.cfg, self.store
        if self.resume:
            dropped = store.truncate_after(self.step)
            event = {"event": "resumed", "from": str(self.resumed_from), "steps_redone": dropped}
            self.log(f"resumed from {self.resumed_from.name} (step {self.step})")
        else:
            event = {"event": "started", "model": self.model_info, "steps": cfg.grpo.steps}
        event.update({"ranks": self.ranks.size} if self.ranks.distributed else {})
        self.session.start(self.step, event, metric_names=self.reward.names, metric_kinds=self.metric_kinds,
                           model=self.model_info, device=str(self.device), config=cfg.to_dict(),
                           ranks=self.ranks.size)
        self.publish_settings()

    def one_step(self, sinks: list[step_sinks.StepSink]):
        """One step of the loop: train, the held-out evaluation and the collapse check when due,
        alerts and curriculum, then the step to each sink (step_sinks.py: the store, the mirrors,
        the autopilot, the progress bar, a periodic checkpoint). Rank 0 logs; every rank trains
        and follows the curriculum."""
        cfg, main = self.cfg, self.ranks.main
        scalars, groups, rollouts = self.train_step()
        self.step += 1
        if main and self.held_out is not None and self.held_out.due(self.step, cfg.grpo.steps):
            scalars.update(self.evaluate())
        if main and collapse_check.due(cfg.health, self.step):  # rank 0's share, as the held-out eval
            scalars.update(collapse_check.check(self, self.last_roll))
        events = [e for rank_events in self.ranks.gather(self.pending_events) for e in rank_events]
        events += (self.alerts.new_alerts(self.step, scalars) if main else []) + \
            self.curriculum.after_step(self.step, scalars)
        self.pending_events = []
        record = step_sinks.StepRecord(self.step, scalars, groups, rollouts, events)
        log_s = 0.0
        for sink in sinks:
            t0 = time.perf_counter()
            sink.after_step(self, record)
            log_s += (time.perf_counter() - t0) if sink.logs else 0.0
        self.last_log_s = log_s

    # ---- the store writes of the loop ---------------------------------------------------------
    def log_step(self, scalars: dict, groups: StepGroups, rollouts: StepRollouts, events: list[tuple]):
        """Step self.step into the store: in run(), kept and committed with the steps of the last
        log.commit_every_s (BatchedWrites); else written here. Each step is whole in the store
        either way."""
        if self.writer is not None:
            self.writer.submit("log_step", self.step, scalars, groups, rollouts, events)
        else:
            self.store.log_step(self.step, scalars, groups, rollouts, events)

    def flush_writes(self):
        """Every step submitted is committed (raises the writer's error, e.g. a full disk)."""
        if self.writer is not None:
            self.writer.flush()

    def close_writer(self, raise_error: bool = True):
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close(raise_error=raise_error)

    def failure_line(self, error: BaseException) -> str:
        """The one line a failed run ends with: in its store, on its terminal, on every page; the
        traceback goes to the run's log (runs/failure.py). A full disk, running out of memory and
        a lost rank each have a line that says more than the exception's own."""
        who = f"rank {self.ranks.rank}" if self.ranks.distributed else ""
        return failure.failure_line(error, self.run_dir, self.clear_line(error), who)

    def clear_line(self, error: BaseException) -> str | None:
        why = storage_problem(error) if self.store is not None else None
        if why:  # the disk's fault: where the run stopped and how to go on
            return checkpoints.storage_message(self.store, why, self.runs_root)
        if isinstance(error, out_of_memory.OutOfMemory):  # it names the knobs that lower memory
            return f"{error}; steps up to {self.step} are kept"
        if self.ranks.distributed and ranks.lost_peer(error):  # torchrun's output names the rank
            return rank_failure.LOST_RANK
        return None

    def run_safely(self) -> str:
        """run(), recording a crash as status failed with its one line (self.failure, what `train`
        prints) in the store and its traceback in the run's log (by rank 0: a rank without the
        store only raises)."""
        try:
            return self.run()
        except BaseException as e:
            if self.session is None:
                raise
            self.failure = self.failure_line(e)
            failure.record_failure(self.session, self.failure, self.step, disk_full=bool(storage_problem(e)))
            raise
