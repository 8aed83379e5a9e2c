"""The `train` and `export` verbs: a run from the command line, and its checkpoint as a model folder.

For `train`: the config and the store (a new run, one the dashboard created, or --resume), the
checks that need no model, the stop signals, and one line (exit code 1 or 2) for what went
wrong, never a traceback wall: a run that fails, at its start or mid-run, ends with its one line
(runs/failure.py), the same line its store keeps, and its traceback in the run's log. Those lines
(stderr) are the verb's own output; what the trainer says as it runs comes through `logging` (the
CLI shows it)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from grpo_core.analysis.alert_rules import user_rules
from grpo_core.errors import USER_ERRORS, ConfigError
from grpo_core.runs import failure
from grpo_core.runs.config import RunConfig, apply_overrides, from_dict, validate
from grpo_core.runs.locations import check_run_id, new_run_id, runs_dir
from grpo_core.runs.names import REWARD, TRAINABLE_RATIO
from grpo_core.runs.run_meta import CREATED, FAILED
from grpo_core.runs.store import RunStore
from grpo_core.tasks import build_metrics, make_task
from grpo_core.tasks.loading import load_config
from grpo_core.train import models, rank_failure, ranks
from grpo_core.train.models import set_threads
from grpo_core.train.trainer import Trainer


def install_stop_signals(trainer: Trainer):
    """SIGTERM / first Ctrl-C: finish the step, checkpoint, status stopped (under torchrun every
    rank stops after the same step, whichever got the signal). A second Ctrl-C interrupts at once."""
    def handler(signum, frame):
        if trainer.signal_reason or trainer.stop_reason:
            raise KeyboardInterrupt
        trainer.signal_reason = signal.Signals(signum).name
        trainer.log(f"{trainer.signal_reason}: stopping after this step")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def preflight(cfg: RunConfig):
    """What can be checked before a store exists and a model loads: every dataset row, the
    custom metrics import, a local model folder, the run's own alert rules. ConfigError names
    the field/line."""
    user_rules(cfg.health)  # each rule parses, or one line naming the rule and the field
    make_task(cfg)
    names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
    build_metrics(names, cfg.reward.custom)
    if cfg.model.path:
        models.check_model_path(cfg.model.path)


def open_run(args) -> tuple[RunConfig, RunStore]:
    """Config + store from CLI args (new run, a run the dashboard created, or --resume)."""
    overrides = list(getattr(args, "overrides", None) or [])
    if getattr(args, "resume", False):
        if not args.run_id:
            raise ConfigError("--resume needs --run-id: the run to continue")
        if args.config:
            raise ConfigError("--resume continues with the run's stored config: drop --config "
                              "(use --set, e.g. --set grpo.steps=400, to change a knob)")
        store = RunStore.open(runs_dir(args.runs_dir) / check_run_id(args.run_id))
        cfg = validate(from_dict(apply_overrides(store.config, overrides)))
        user_rules(cfg.health)  # a --set health.rules=... on resume: one line, before the model loads
        return cfg, store
    cfg = load_config(args.config, overrides)
    preflight(cfg)  # bad dataset rows, metrics or model folder: one line, and no run is created
    root = args.runs_dir or cfg.log.runs_dir or None
    run_id = args.run_id or new_run_id(cfg.task.name)
    store = RunStore.create(run_id, cfg.to_dict(), root=root, exist_ok=True)
    status = store.get_meta().get("status")
    if status != CREATED:
        store.close()
        raise ConfigError(f"run {run_id!r} already exists (status {status}): pass --resume to continue it, "
                          "or choose another --run-id")
    store.set_meta(config=cfg.to_dict())
    toml = store.run_dir / "config.toml"
    if not toml.exists():
        toml.write_text(cfg.to_toml())
    return cfg, store


def cli_train(args) -> int:
    rank_set = ranks.from_environment()  # torchrun: join the job's process group first
    try:
        cfg, store, run_dir = open_on_ranks(args, rank_set)
        return train(args, cfg, store, run_dir, rank_set)
    finally:
        rank_set.close()


def open_on_ranks(args, rank_set: ranks.Ranks):
    """Rank 0 opens the run (open_run) and tells the other ranks its config and folder; a bad
    config (or run id) ends every rank with rank 0's one line."""
    store, opened = None, None
    if rank_set.main:
        try:
            cfg, store = open_run(args)
            ranks.check_config(cfg, rank_set)
            opened = {"config": cfg.to_dict(), "run_dir": str(store.run_dir)}
        except Exception as e:  # the other ranks wait for this broadcast: tell them, then fail
            if store is not None:
                store.set_status(FAILED, error=failure.failure_line(e, store.run_dir))
            rank_set.broadcast({"error": str(e)})
            raise
    opened = rank_set.broadcast(opened)
    if "error" in opened:
        raise ConfigError(opened["error"])
    cfg = cfg if rank_set.main else validate(from_dict(opened["config"]))
    return cfg, store, Path(opened["run_dir"])


def train(args, cfg: RunConfig, store: RunStore | None, run_dir: Path, rank_set: ranks.Ranks) -> int:
    """The run on this rank: rank 0 (a single process's only rank) with the store, the others without."""
    if store is not None:
        # Our pid before the (maybe long) model load: a trainer killed while starting shows stale, not created.
        store.set_meta(pid=os.getpid(), host=os.uname().nodename)
        print(f"run {store.run_id}: {store.run_dir}" + (f" ({rank_set.size} ranks)" if rank_set.distributed else ""),
              file=sys.stderr, flush=True)
    set_threads(cfg, processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    quiet = None if rank_set.main else (lambda msg: None)  # rank 0 speaks for the job
    try:
        trainer = Trainer(cfg, store, resume=bool(getattr(args, "resume", False)), log=quiet, ranks=rank_set,
                          run_dir=run_dir)
    except BaseException as e:
        line = start_failed(e, store, run_dir, rank_set)
        if not isinstance(e, Exception):  # Ctrl-C while loading: exit 130, as before
            raise
        print(f"error{'' if rank_set.main else f' (rank {rank_set.rank})'}: {line}", file=sys.stderr)
        return 2 if isinstance(e, USER_ERRORS) else 1  # bad input exits 2, as the CLI's other verbs
    install_stop_signals(trainer)
    try:
        status = trainer.run_safely()
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        return report_failure(e, trainer, rank_set, run_dir)
    if store is not None:
        last = store.scalars_wide(since_step=store.last_step() - 1) if store.last_step() else None
        if last is not None and not last.empty:
            r = last.iloc[-1]
            print(f"run {store.run_id} {status} at step {trainer.step}: reward {r[REWARD]:.3f}, "
                  f"trainable ratio {r[TRAINABLE_RATIO]:.2f}", file=sys.stderr)
    return 0


def start_failed(e: BaseException, store: RunStore | None, run_dir: Path, rank_set: ranks.Ranks) -> str:
    """A trainer that could not start (a model or an engine that does not load): its one line,
    stored as the run's error (rank 0), its traceback in the run's log (every rank)."""
    line = failure.failure_line(e, run_dir, who=f"rank {rank_set.rank}" if rank_set.distributed else "")
    if store is not None:
        store.reject_open_requests("trainer failed to start")
        store.set_status(FAILED, error=line)
    return line


def report_failure(e: Exception, trainer: Trainer, rank_set: ranks.Ranks, run_dir: Path) -> int:
    """The run's one line (the one its store keeps) for what stopped it, exit 1; the finished
    steps are in the store, the traceback in the run's log."""
    if trainer.store is None:  # a rank without the store: rank 0 records it, unless rank 0 is what is gone
        line = trainer.failure_line(e)  # logs this rank's traceback where the run's folder is reachable
        if ranks.lost_peer(e):
            rank_failure.record_lost_main(run_dir)
        print(f"error (rank {rank_set.rank}): {line}", file=sys.stderr)
        return 1
    print(f"error: {trainer.failure or trainer.failure_line(e)}", file=sys.stderr)
    return 1


def cli_export(args) -> int:
    """The run's last complete checkpoint as a plain Hugging Face folder: a LoRA run's adapters
    merged into the base the run trained (its model.path, or the built-in model's warm start)."""
    from grpo_core.train.checkpoints import latest_checkpoint
    with RunStore.open(args.run, readonly=True) as store:
        cfg = validate(from_dict(store.config))
        run_dir, run_id = store.run_dir, store.run_id
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"run {run_id} has no complete checkpoint to export (checkpoints are written every "
                          "log.checkpoint_every steps and at the end)")
    if (ckpt / "adapter_config.json").is_file():
        base, tokenizer, _ = models.load_policy(cfg.model, make_task(cfg), run_dir.parent, seed=cfg.grpo.seed)
        model = models.apply_lora(base, cfg.model)
        models.load_lora_state(model, ckpt)
        model = model.merge_and_unload()
    else:
        model, tokenizer = models.load_pretrained(str(ckpt))
    models.save_pretrained(model, tokenizer, args.out)
    print(f"exported {run_id} {ckpt.name} to {args.out}", file=sys.stderr)
    return 0
