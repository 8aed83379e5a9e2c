"""JSONL prompts: one JSON object per line with "prompt" plus the fields its metrics read.

Every row is checked when the file is loaded, before any model is touched: a row that is
not JSON, misses a field a metric needs or has the wrong type is an error naming the line
and the field ("data.jsonl line 7: field 'answer' (needed by metric exact) is missing").
Blank lines are skipped. The stream walks the rows in a seeded shuffled order, epoch after
epoch.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from grpo_core.config import ConfigError
from grpo_core.tasks import Task, prompt_id

# metric -> (field, type, required). Custom metrics read what they like: not checked here.
FIELDS = {
    "answer_f1": [("answer", str, True)],
    "exact": [("answer", str, True)],
    "citation": [("source", str, True)],
    "format": [("format", str, False)],
    "length": [("max_len", int, False)],
}
TYPE_NAMES = {str: "a string", int: "an integer"}


def _type_ok(value, want) -> bool:
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def load_rows(path: str | Path, metric_names: list[str], custom: set[str] = frozenset()) -> list[dict]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task.dataset {str(path)!r}: no such file")
    needs: dict[str, tuple[type, bool, str]] = {"prompt": (str, True, "every task")}
    for m in metric_names:
        if m in custom:
            continue
        for field, typ, required in FIELDS.get(m, []):
            cur = needs.get(field)
            if cur is None or (required and not cur[1]):  # name the first metric that requires it
                needs[field] = (typ, required, m)
    rows = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p.name} line {n}"
            try:
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: expected a JSON object {{\"prompt\": ...}}, got {type(row).__name__}")
            for field, (typ, required, metric) in needs.items():
                if field not in row:
                    if required:
                        raise ConfigError(f"{where}: field '{field}' (needed by "
                                          f"{'metric ' + metric if metric != 'every task' else metric}) is missing")
                    continue
                if not _type_ok(row[field], typ):
                    raise ConfigError(f"{where}: field '{field}' must be {TYPE_NAMES[typ]}, "
                                      f"got {type(row[field]).__name__} {json.dumps(row[field])[:40]}")
            if not row["prompt"].strip():
                raise ConfigError(f"{where}: field 'prompt' is empty")
            if "format" in row:
                try:
                    re.compile(row["format"])
                except re.error as e:
                    raise ConfigError(f"{where}: field 'format' is not a valid regex ({e})") from None
            row.setdefault("prompt_id", prompt_id(row["prompt"]))
            row["prompt_id"] = str(row["prompt_id"])
            rows.append(row)
    if not rows:
        raise ConfigError(f"task.dataset {str(path)!r} has no rows: one JSON object per line, e.g. "
                          '{"prompt": "...", "answer": "..."}')
    return rows


class JsonlTask(Task):
    name = "jsonl"
    levels = 1

    def __init__(self, path: str, metric_names: list[str], custom: set[str] = frozenset(), seed: int = 0):
        super().__init__(1, seed)
        self.path = str(path)
        self.rows = load_rows(path, metric_names, set(custom))
        self.digest = hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:16]
        self.rng = random.Random(seed)
        self.warm_rng = random.Random(f"warm-{seed}")
        self.order: list[int] = []
        self.pos = 0

    def metrics(self) -> list[str]:
        return []

    def batch(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            if self.pos >= len(self.order):  # next epoch, freshly shuffled
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
                self.pos = 0
            out.append(dict(self.rows[self.order[self.pos]]))
            self.pos += 1
        return out

    def has_targets(self) -> bool:
        return all("answer" in r or "target" in r for r in self.rows)

    def warm_batch(self, n: int) -> list[dict]:
        return [dict(self.warm_rng.choice(self.rows)) for _ in range(n)]

    def target(self, example: dict) -> str:
        if "target" in example:
            return str(example["target"])
        if "answer" not in example:
            raise ConfigError("the built-in model's warm-start needs an 'answer' (or 'target') in every row; "
                              "set model.warm_start_steps = 0 or use your own model (model.path)")
        return f"{example['answer']} [{example['source']}]" if "source" in example else str(example["answer"])

    def cache_key(self) -> dict:
        return {"name": self.name, "seed": self.seed, "data": self.digest}

    def state_dict(self) -> dict:
        return {"level": 1, "rng": self.rng.getstate(), "order": self.order, "pos": self.pos}

    def load_state_dict(self, state: dict):
        if "rng" in state:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
        self.order, self.pos = list(state.get("order", [])), int(state.get("pos", 0))
