"""The command line, `python -m grpo_core VERB` (installed as `grpo-health`): its parser and one function per verb.

Each subcommand is one function in its own module, imported only when called, so
`status`/`control` never pay for importing torch. Bad input exits 2 with one line.
Library code logs (logging.getLogger(__name__)) and never prints; the CLI shows grpo_core's
log on stderr (StderrLines), so `train` says what the trainer logs as it goes.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from grpo_core.errors import USER_ERRORS


def _add_run_options(p: argparse.ArgumentParser):
    p.add_argument("--config", help="TOML run config (see `config` for every knob)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one knob, e.g. --set grpo.group_size=8 (repeatable)")
    p.add_argument("--run-id", help="run id (default: generated)")
    p.add_argument("--runs-dir", help="runs directory (default: $GRPO_HEALTH_RUNS_DIR or ./runs)")


def cmd_train(args):
    from grpo_core.train.launch import cli_train
    return cli_train(args)


def cmd_export(args):
    from grpo_core.train.launch import cli_export
    return cli_export(args)


def cmd_pilot(args):
    from grpo_core.train.pilot import cli_pilot
    return cli_pilot(args)


def cmd_report(args):
    from grpo_core.analysis.report import cli_report
    return cli_report(args)


def cmd_prompts(args):
    from pathlib import Path

    from grpo_core.analysis import prompt_history
    table = prompt_history.load(args.run)
    text = prompt_history.to_jsonl(prompt_history.never_trainable(table) if args.never_trainable else table)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10))} prompts to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_watch(args):
    from grpo_core.integrations.follow import cli_watch
    return cli_watch(args)


def cmd_import(args):
    from grpo_core.integrations.importers import cli_import
    return cli_import(args)


def cmd_serve(args):
    from grpo_core.dashboard.serve import cli_serve
    return cli_serve(args)


def cmd_status(args):
    from grpo_core.runs import names
    from grpo_core.runs.run_meta import RunMeta, display_status, error_line, ranks_label, status_label
    from grpo_core.runs.store import RunStore
    with RunStore.open(args.run, readonly=True) as s:
        meta = s.get_meta()
        last = s.last_step()
        row = s.scalars_wide(since_step=(last - 1) if last is not None else -1)
        run = RunMeta.parse(meta)
        out = {"run_id": s.run_id, "status": status_label(display_status(meta), meta.get("stop_reason")),
               "last_step": last,
               "steps": run.steps_budget,  # set_steps changes it mid-run
               "ranks": run.ranks,  # training processes; None (null): the store does not say
               "error": error_line(meta)}  # one line; the traceback is in the run's trainer.log
        if not row.empty:
            r = row.iloc[-1]
            for name in (names.TRAINABLE_RATIO, names.CUM_TRAINABLE_RATIO, names.REWARD, names.REWARD_STD,
                         names.CUM_GROUPS_SUBMITTED, names.CUM_GROUPS_TRAINABLE):
                if name in r and r[name] == r[name]:
                    out[name] = float(r[name])
        pending = s.control()
        out["pending_requests"] = int((pending["status"] == "pending").sum()) if len(pending) else 0
    text = {**out, "ranks": ranks_label(out["ranks"])}  # "unknown", not None
    print(json.dumps(out, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in text.items()))
    return 0


def cmd_control(args):
    from grpo_core.runs import requests
    payload = requests.parse_cli_request(args.action, args.values)
    rid = requests.send(args.run, args.action.replace("-", "_"), payload, source="cli")
    print(f"request {rid} sent: {args.action} {json.dumps(payload)} (pending until the trainer's next step)")
    return 0


def cmd_runs(args):
    from grpo_core.runs.run_index import list_runs
    from grpo_core.runs.run_meta import status_label
    df = list_runs(args.runs_dir)
    if df.empty:
        print("no runs yet: start one with `python -m grpo_core train`")
    else:
        df["status"] = [status_label(st, r) for st, r in zip(df["status"], df["stop_reason"])]
        df = df[["run_id", "status", "last_step", "steps", "kind", "error"]].copy()
        for col in ("last_step", "steps"):  # whole numbers, not 12.0 (NaN made them floats)
            df[col] = df[col].astype("Int64")
        print(df.astype(object).where(df.notna(), "-").to_string(index=False))
    return 0


def cmd_config(args):
    from grpo_core.runs.config import describe
    from grpo_core.runs.trl_names import names_for
    for key, default, help in describe():
        trl = ", ".join(names_for(key))
        print(f"{key:34} = {default!r:24} " + (f"[TRL: {trl}] " if trl else "") + help)
    return 0


def _import_args(p: argparse.ArgumentParser):
    """The import subcommand's arguments (its kinds come from the importers: no torch there)."""
    from grpo_core.integrations.kinds import KINDS, kinds_help  # no torch there: cheap
    p.add_argument("kind", choices=list(KINDS), help=f"what FILE is ({kinds_help()})")
    p.add_argument("file", help="the file or folder (see docs/integrations.md, 'Import a run')")
    p.add_argument("--run-id", help="run id (default: from the file name)")
    p.add_argument("--runs-dir", help="runs directory (default: $GRPO_HEALTH_RUNS_DIR or ./runs)")
    p.add_argument("--groups-per-step", type=int, help="trl: groups per step (generation_batch_size / "
                   "num_generations), which trainer_state.json does not record; gives group counts")
    p.add_argument("--logging-steps", type=int, help="trl-log: the run's logging_steps (the printed dicts carry no "
                   "step; default: from the progress bar, else 1)")
    p.add_argument("--group-size", type=int, help="trl-completions: num_generations (default: from the prompts); "
                   "trl, trl-log: num_generations, to rescale old TRL's reward_std")
    p.add_argument("--reward-funcs", help="trl-completions: the reward columns, comma-separated (default: the "
                   "numeric columns between completion and advantage)")
    p.add_argument("--reward-weights", help="trl-completions: fn=w,fn=w (default: 1 each, TRL's default)")
    p.add_argument("--run", help="trackio: the run's name or id (default: the project's only run)")


def _watch_args(p: argparse.ArgumentParser):
    from grpo_core.integrations.kinds import kinds_help  # no torch there: cheap
    # No argparse choices: a wrong kind is the watch verb's own one-line error (naming the kinds).
    p.add_argument("kind", help=f"what SOURCE is ({kinds_help(watch=True)})")
    p.add_argument("source", help="the file or folder to follow")
    p.add_argument("--run-id", help="run id (default: KIND-<source name>)")
    p.add_argument("--runs-dir", help="runs directory (default: $GRPO_HEALTH_RUNS_DIR or ./runs)")
    p.add_argument("--every", type=float, default=2.0, help="seconds between looks at the source")
    p.add_argument("--polls", type=int, help="stop after this many looks (default: until the source ends or Ctrl-C)")
    p.add_argument("--run", help="trackio: the run's name or id (default: the project's only run)")


def _serve_args(p: argparse.ArgumentParser):
    p.add_argument("--port", type=int, help="port to listen on (default: $GRPO_HEALTH_PORT or 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine "
                   "only); 0.0.0.0 listens on every interface: prints a warning, use with --token")
    p.add_argument("--token", help="ask every browser for this token before showing anything (better: set "
                   "$GRPO_HEALTH_TOKEN, which `ps` does not show)")
    p.add_argument("--no-demo", action="store_true", help="do not start the demo run")
    p.add_argument("--demo", default="builtin", metavar="NAME", help="which demo run to start: builtin (a tiny "
                   "model, a step a second) or smollm2 (SmolLM2-135M-Instruct learning sums, about 10 s a step on "
                   "2 cores)")
    p.add_argument("--redraws-per-s", metavar="N", help="how often a run's open pages together are redrawn at "
                   "most, the dashboard's share of the CPU (default: $GRPO_HEALTH_REDRAWS_PER_S or 1.5: with "
                   "ten pages open each is redrawn every 6.7 s, 2 s at the fastest)")
    p.add_argument("--runs-dir", help="runs directory (default: $GRPO_HEALTH_RUNS_DIR or ./runs)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a knob of the demo run, e.g. --set grpo.steps=500")


def _verb(verbs, name: str, help: str, func) -> argparse.ArgumentParser:
    """One verb: its help line is also its `--help` description (docs/tables.py reads it there)."""
    p = verbs.add_parser(name, help=help, description=help)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grpo-health", description="GRPO Health: train with GRPO and watch "
                                 "whether the training is healthy.")
    add_verbs(ap.add_subparsers(dest="command", required=True))
    return ap


def add_verbs(verbs) -> None:
    """Every verb of the CLI, in the order `--help` lists them, on `verbs` (the action
    `add_subparsers` returns; its `.choices` maps each verb to its parser)."""
    p = _verb(verbs, "train", "run the GRPO trainer (no arguments: the built-in demo)", cmd_train)
    _add_run_options(p)
    p.add_argument("--resume", action="store_true", help="continue the run from its last complete checkpoint")
    _add_run_options(_verb(verbs, "pilot", "sample and score without training: check reward variance first",
                           cmd_pilot))

    p = _verb(verbs, "export", "a run's last checkpoint as a Hugging Face model folder (LoRA merged)", cmd_export)
    p.add_argument("run", help="run dir, run.db or run id")
    p.add_argument("--out", required=True, help="folder to write (from_pretrained loads it)")

    p = _verb(verbs, "report", "post-run analysis as HTML or Markdown", cmd_report)
    p.add_argument("run", help="run dir, run.db or run id")
    p.add_argument("--out", help="report.html or report.md (default: print Markdown)")

    _import_args(_verb(verbs, "import", "import a run another trainer logged (TRL, ART, verl, W&B, TensorBoard, "
                             "CSV, Trackio)", cmd_import))
    _watch_args(_verb(verbs, "watch", "follow another trainer's outputs into a run as they grow "
                                      "(TRL, W&B, TensorBoard, verl, Trackio)", cmd_watch))

    p = _verb(verbs, "prompts", "per-prompt trainability as JSON lines (the least trainable first)", cmd_prompts)
    p.add_argument("run", help="run dir, run.db or run id")
    p.add_argument("--never-trainable", action="store_true", help="only the prompts whose group never trained")
    p.add_argument("--out", help="write to this file (default: stdout)")
    _add_existing_run_verbs(verbs)


def _add_existing_run_verbs(verbs) -> None:
    """The verbs that look at or steer runs that exist, and the dashboard."""
    p = _verb(verbs, "status", "one run's status and latest health", cmd_status)
    p.add_argument("run", help="run dir, run.db or run id")
    p.add_argument("--json", action="store_true")

    from grpo_core.runs import requests  # its kinds come from the settings registry (no torch there)
    p = _verb(verbs, "control", "send a request to a running trainer (applied between steps)", cmd_control)
    p.add_argument("run", help="run dir, run.db or run id")
    p.add_argument("action", choices=requests.cli_actions())
    p.add_argument("values", nargs="*", help=requests.cli_help())

    _verb(verbs, "runs", "list runs", cmd_runs).add_argument("--runs-dir")
    _serve_args(_verb(verbs, "serve", "the dashboard on 127.0.0.1 (starts the built-in demo run unless one "
                                      "is live)", cmd_serve))
    _verb(verbs, "config", "every config knob with its default and help", cmd_config)


class StderrLines(logging.Handler):
    """A log record as one line on sys.stderr as it is when the record comes (so a test's
    captured stderr gets it too): the message alone, `warning: ` / `error: ` before worse news."""

    def emit(self, record: logging.LogRecord):
        try:
            text = self.format(record)
            if record.levelno >= logging.WARNING:
                text = f"{record.levelname.lower()}: {text}"
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a failing handler reports, never raises
            self.handleError(record)


def log_to_stderr():
    """grpo_core's INFO and worse on stderr, once per process (main may run many times in one)."""
    package = logging.getLogger("grpo_core")
    package.setLevel(logging.INFO)
    if not any(isinstance(h, StderrLines) for h in package.handlers):
        package.addHandler(StderrLines())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_to_stderr()
    try:
        return args.func(args) or 0
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
