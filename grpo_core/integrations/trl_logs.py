"""Import a TRL / Unsloth terminal transcript: the log dicts transformers prints.

transformers prints every log entry as a Python dict: `ProgressCallback` (the tqdm bar,
the default) via tqdm.write, `PrinterCallback` (disable_tqdm=True) via print. Since
transformers 4.5x both format floats as strings with 4 significant digits
(`{'loss': '0.0123', 'reward': '0.9375', ...}`); older ones print raw floats. Neither
prints the step. This reader finds the dicts anywhere in the text (inside tqdm lines, after
carriage returns, across hard-wrapped lines), and gives each training entry its step from,
in order: a `step` key in the dict; the panel TRL's log_completions prints right after it
(`╭── Step 12 ──╮`); else its position: entry k (1-based) is step k x logging_steps, with
logging_steps given, or inferred from the tqdm bar (`| 200/350 [`), or 1. How the steps
were found is in the ImportReport. The bar's total, when printed, is max_steps.
"""
from __future__ import annotations

import ast
import re

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.trl_state import parse_trl_history

_DICT = re.compile(r"\{\s*['\"][^{}]*\}", re.S)
_PANEL_STEP = re.compile(r"[─━-]\s*Step\s+(\d+)\s*[─━-]")
_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")
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


def bar_counts(text: str) -> tuple[int | None, int | None]:
    """(last counter, total) of the training tqdm bar, the bar with the largest total."""
    bars = [(int(n), int(t)) for n, t in _BAR.findall(text)]
    if not bars:
        return None, None
    total = max(t for _, t in bars)
    return max(n for n, t in bars if t == total), total


def _is_train(d: dict) -> bool:
    """A training entry: not an evaluation (eval_*) nor the run-totals summary entry."""
    return "train_runtime" not in d and not any(k.startswith("eval_") for k in d)


def assign_steps(entries, report, logging_steps: int | None, bar_last: int | None) -> tuple[list[dict], int]:
    """Entries with a `step` each (see the module docstring); returns them and logging_steps."""
    train = [d for d, _ in entries if _is_train(d)]
    ls, how = logging_steps, "given"
    if ls is None:
        if bar_last and train and bar_last >= len(train):
            ls, how = bar_last // len(train), f"inferred from the progress bar ({bar_last} steps, {len(train)} entries)"
        else:
            ls, how = 1, "assumed (no bar, no steps printed: pass logging_steps if the run set it)"
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


def parse_transcript(data: bytes, filename: str, groups_per_step: int | None = None,
                     logging_steps: int | None = None) -> SourceRun:
    """Terminal text -> SourceRun, through the trainer_state path (same names, same notes)."""
    text = data.decode("utf-8", errors="replace")
    if "\x00" in text:
        raise ConfigError(f"{filename}: expected a terminal transcript (text with TRL's printed log dicts); "
                          "this is a binary file")
    report = ImportReport("trl-log", filename)
    entries = find_entries(text, report)
    if not entries:
        raise ConfigError(f"{filename}: expected a terminal transcript with TRL's printed log dicts "
                          "({'loss': ..., 'reward': ...}); found none")
    bar_last, total = bar_counts(text)
    history, ls = assign_steps(entries, report, logging_steps, bar_last)
    last = max([bar_last or 0] + [d["step"] for d in history])
    top = {"logging_steps": ls, "max_steps": total, "global_step": last}
    parsed = parse_trl_history(history, top, report, groups_per_step)
    parsed.config["source"] = "trl-log"
    parsed.finished = bool(parsed.summary) or (total is not None and last >= total)
    return parsed
