"""Import a TRL / Unsloth terminal transcript: the log dicts transformers prints.

transformers prints every log entry as a Python dict: `ProgressCallback` (the tqdm bar,
the default) via tqdm.write, `PrinterCallback` (disable_tqdm=True) via print. Since
transformers 4.5x both format floats as strings with 4 significant digits
(`{'loss': '0.0123', 'reward': '0.9375', ...}`); older ones print raw floats. Neither
prints the step. This reader finds the dicts anywhere in the text (inside tqdm lines, after
carriage returns, across hard-wrapped lines), and gives each training entry its step from,
in order: a `step` key in the dict; the panel TRL's log_completions prints right after it
(`╭── Step 12 ──╮`); else its position: entry k (1-based) is step k x logging_steps, with
logging_steps given, or inferred from the Trainer's tqdm bar (`| 200/350 [`), or 1. How the
steps were found is in the ImportReport. The bar's total, when printed, is max_steps.

Only the Trainer's own bar counts (no description, tqdm's `it` unit): datasets prints `Map:`
bars over the dataset's rows before training, which are no steps. The run-totals dict
printed at the end (`train_runtime`, ...) carries the last logging window's metrics when
max_steps is not a multiple of logging_steps: they are imported at the last step. A Jupyter
notebook's outputs are read by notebook.py, which uses this module for their printed text.
"""
from __future__ import annotations

import ast
import re

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.trl_state import TRL_SUMMARY_KEYS, is_trl_summary, parse_trl_history

_DICT = re.compile(r"\{\s*['\"][^{}]*\}", re.S)
_PANEL_STEP = re.compile(r"[─━-]\s*Step\s+(\d+)\s*[─━-]")
# A tqdm bar: `{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]`.
_BAR = re.compile(r"(\d+)%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[([^\]\r\n]*)\]")
_RATE_IT = re.compile(r"(?:it/s|s/it)$")  # tqdm's default unit: the Trainer's bar
TRL_HINT_KEYS = ("loss", "reward", "grad_norm", "learning_rate", "frac_reward_zero_std", "train_runtime", "epoch")


def _value(v):
    """A printed value -> float where it is a number ('0.9375', '7.451e-09', 0.5), else as is."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _literal(text: str):
    for candidate in (text, re.sub(r"[\r\n]+", "", text)):  # a terminal may hard-wrap a long dict
        try:
            d = ast.literal_eval(candidate)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(d, dict) and all(isinstance(k, str) for k in d):
            return d
    return None


def find_entries(text: str, report) -> list[tuple[dict, str]]:
    """[(log dict, the text after it up to the next dict)] in order; dicts that do not
    parse, or are not TRL log entries, are reported."""
    found = list(_DICT.finditer(text))
    out = []
    for i, m in enumerate(found):
        d = _literal(m.group(0))
        if d is None:
            report.skip("text", "looks like a log dict but does not parse as one")
            continue
        if not any(k in TRL_HINT_KEYS or k.startswith(("eval_", "rewards/")) for k in d):
            report.skip("dict", "has none of TRL's log keys (loss, reward, learning_rate, ...)")
            continue
        after = text[m.end():found[i + 1].start() if i + 1 < len(found) else len(text)]
        if any(isinstance(v, str) for v in d.values()):
            report.note("printed values: transformers (4.5x+) prints floats with 4 significant digits, so values "
                        "(and the ratio, 1 - the printed frac_reward_zero_std) are as printed, not full precision")
        out.append(({k: _value(v) for k, v in d.items()}, after))
    return out


def trainer_bar(text: str, report) -> tuple[int | None, int | None]:
    """(last counter, total) of the Trainer's own tqdm bar: transformers' ProgressCallback
    opens it with no description and tqdm's default unit (`  5%|▌   | 10/200 [00:12<03:48,
    1.20s/it]`); the first such bar is the trainer's (evaluation bars open later). Other bars
    (datasets' `Map: 100%|...| 7473/7473 [..., 35000.00 examples/s]`, `Loading checkpoint
    shards`, downloads) count no training step: each is reported, never taken."""
    total, last, prev_end, others = None, None, 0, set()
    for m in _BAR.finditer(text):
        start = max(prev_end, text.rfind("\r", 0, m.start()) + 1, text.rfind("\n", 0, m.start()) + 1)
        prev_end = m.end()
        desc, n, t = text[start:m.start()].strip(), int(m.group(2)), int(m.group(3))
        if desc or not _RATE_IT.search(m.group(4)):
            others.add(desc.rstrip(":") or "a bar with another unit")
            continue
        if total is None:
            total = t
        if t == total:
            last = n if last is None else max(last, n)
    if others:
        report.note(f"progress bars that are not the trainer's ({', '.join(sorted(others))}): not used for steps")
    return last, total


def logging_steps_from(last: int, n: int, summary_window: bool | None) -> list[int]:
    """The logging_steps values that n entries over `last` trainer steps allow: entries at
    ls, 2ls, ..., n ls <= last < (n+1) ls; with the run totals printed, last is a multiple of
    ls unless the totals carry a last window (summary_window True). None: no totals printed."""
    out = []
    for ls in range(1, last // max(n, 1) + 1):
        if not n * ls <= last < (n + 1) * ls:
            continue
        if summary_window is not None and (last % ls != 0) != summary_window:
            continue
        out.append(ls)
    return out


def _is_train(d: dict) -> bool:
    """A training entry: not an evaluation (eval_*) nor the run-totals summary entry."""
    return not is_trl_summary(d) and not any(k.startswith("eval_") for k in d)


def _window(d: dict) -> bool:
    """The run-totals entry carries the last logging window's metrics (trl_state.split_summary)."""
    return any(k not in TRL_SUMMARY_KEYS and not k.startswith("train_") and k not in ("epoch", "step") for k in d)


def infer_ls(entries, report, logging_steps, bar_last, filename) -> tuple[int, str]:
    """logging_steps: given, else from the trainer's bar and the entries (and, where several
    fit, the epochs printed in the entries), else 1 (said so)."""
    if logging_steps is not None:
        return logging_steps, "given"
    train = [d for d, _ in entries if _is_train(d)]
    n = len(train)
    if not bar_last or not n:
        return 1, "assumed (no trainer progress bar, no steps printed: pass logging_steps if the run set it)"
    summaries = [d for d, _ in entries if is_trl_summary(d)]
    fits = logging_steps_from(bar_last, n, _window(summaries[-1]) if summaries else None)
    how = f"inferred from the trainer's progress bar ({bar_last} steps, {n} entries)"
    if len(fits) > 1 and summaries:
        fits, how = by_epoch(train, summaries[-1], bar_last, fits), how + " and the printed epochs"
    if len(fits) != 1:
        which = f"fit logging_steps {', '.join(map(str, fits))}" if fits else "fit no logging_steps"
        raise ConfigError(f"{filename}: cannot tell the steps of the log entries ({n} entries over {bar_last} "
                          f"trainer steps {which}); pass logging_steps (--logging-steps) as the run set it")
    return fits[0], how


def by_epoch(train: list[dict], totals: dict, last: int, fits: list[int]) -> list[int]:
    """The logging_steps among `fits` under which every entry's printed epoch is its step's:
    the Trainer's epoch grows by 1/steps_per_epoch a step, and the totals' epoch is the last
    step's, so entry k (step k ls) has epoch k ls x epoch_last / last (to the printed digits)."""
    e_last = totals.get("epoch")
    epochs = [d.get("epoch") for d in train]
    if not isinstance(e_last, float) or e_last <= 0 or not all(isinstance(e, float) for e in epochs):
        return fits
    per_step = e_last / last
    return [ls for ls in fits if all(abs(e / per_step - (k + 1) * ls) < 0.5 for k, e in enumerate(epochs))]


def assign_steps(entries, report, logging_steps: int | None, bar_last: int | None,
                 filename: str = "transcript") -> tuple[list[dict], int]:
    """Entries with a `step` each (see the module docstring); returns them and logging_steps."""
    ls, how = infer_ls(entries, report, logging_steps, bar_last, filename)
    out, k, last, by = [], 0, 0, {"printed": 0, "panel": 0, "position": 0}
    for d, after in entries:
        d = dict(d)
        is_train = _is_train(d)
        panel = _PANEL_STEP.search(after)
        if isinstance(d.get("step"), float) or isinstance(d.get("global_step"), float):
            d["step"] = int(d.get("step", d.get("global_step")))
            by["printed"] += 1
        elif is_train and panel:
            d["step"] = int(panel.group(1))
            by["panel"] += 1
        elif is_train:
            d["step"] = (k + 1) * ls
            by["position"] += 1
        elif is_trl_summary(d) and _window(d):
            d = _summary_step(d, panel, bar_last, last, report)
        else:
            d["step"] = last  # an eval or summary entry: at the step of the training entry before it
        if is_train:
            k += 1
        last = d["step"]
        out.append(d)
    if by["position"]:
        report.note(f"steps inferred for {by['position']} entries (the log dicts carry no step): entry k is "
                    f"step k x logging_steps, logging_steps = {ls} {how}")
    if by["panel"]:
        report.note(f"steps of {by['panel']} entries read from the 'Step N' panels TRL's log_completions prints")
    return out, ls


def _summary_step(d: dict, panel, bar_last: int | None, last: int, report) -> dict:
    """The run totals with the last window: at the trainer's last step (the 'Step N' panel
    after it, or the bar's last counter); where neither was printed the window's step is
    unknown, so only the totals are kept (at the step before)."""
    step = int(panel.group(1)) if panel else bar_last
    if step is not None:
        return {**d, "step": step}
    window = [k for k in d if _window({k: 0})]
    report.skip("last logging window", f"printed with the run totals ({', '.join(window[:3])}, ...) but its step is "
                "unknown (no trainer progress bar, no 'Step N' panel): not imported", 1)
    return {k: v for k, v in d.items() if k not in window} | {"step": last}


def parse_transcript(data: bytes, filename: str, groups_per_step: int | None = None,
                     logging_steps: int | None = None, group_size: int | None = None) -> SourceRun:
    """Terminal text -> SourceRun, through the trainer_state path (same names, same notes)."""
    text = data.decode("utf-8", errors="replace")
    if "\x00" in text:
        raise ConfigError(f"{filename}: expected a terminal transcript (text with TRL's printed log dicts); "
                          "this is a binary file")
    report = ImportReport("trl-log", filename)
    return transcript_run(text, filename, report, groups_per_step, logging_steps, group_size)


def transcript_run(text: str, filename: str, report, groups_per_step=None, logging_steps=None,
                   group_size=None, extra: list[dict] | None = None) -> SourceRun:
    """Printed log dicts in `text` (plus `extra` entries with their steps, a notebook's
    table rows) -> SourceRun."""
    entries = find_entries(text, report)
    if not entries and not extra:
        raise ConfigError(f"{filename}: expected a terminal transcript with TRL's printed log dicts "
                          "({'loss': ..., 'reward': ...}); found none")
    bar_last, total = trainer_bar(text, report)
    history, ls = assign_steps(entries, report, logging_steps, bar_last, filename) if entries else ([], None)
    history = (extra or []) + history
    last = max([bar_last or 0] + [d["step"] for d in history])
    top = {"logging_steps": ls, "max_steps": total, "global_step": last}
    parsed = parse_trl_history(history, top, report, groups_per_step, group_size)
    parsed.config["source"] = "trl-log"
    parsed.finished = bool(parsed.summary) or (total is not None and last >= total)
    return parsed
