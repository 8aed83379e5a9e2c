"""JSONL prompts: one JSON object per line with "prompt" plus the fields its metrics read.

Or the rows of a `datasets` folder, parquet file or JSON array (datasets_source.py), checked alike.

Every row is checked when the file is loaded, before any model is touched: a row that is
not JSON, misses a field a metric needs or has the wrong type is an error naming the line,
the field and the fix ("data.jsonl line 7: field 'answer' (needed by metric exact) is
missing; add it to every row, or drop the metric: --set reward.weights.exact=0").
Blank lines are skipped. The stream walks the rows in a seeded shuffled order, epoch after
epoch.

Without a `[reward.weights]` table the task's metrics are the ones its rows can feed
(`default_weights`): an `answer` gives math_answer when every answer is a number, else
answer_f1 + exact; another field adds the metric whose record it feeds (metrics.py: `source`
adds citation, `max_tokens` token_length, ...); custom metrics join at weight 1.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.tasks import datasets_source
from grpo_core.tasks.chat import check_messages
from grpo_core.tasks.metrics import BUILTIN, METRICS, TEXT_OR_MESSAGES, TYPE_NAMES
from grpo_core.tasks.rewards import as_number, final_answer, schema_validator
from grpo_core.tasks.task import Task, prompt_id


def _type_ok(value, want: tuple) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float) and not value == value:  # NaN is no answer
        return False
    return isinstance(value, want)


def read_rows(path: str | Path) -> list[tuple[str, dict]]:
    """(where, row) for every non-blank line ('data.jsonl line 7'); a line that is not a JSON object
    is an error. A datasets folder, parquet file or JSON array: its rows (datasets_source.py)."""
    p = Path(path).expanduser()
    if datasets_source.is_datasets_source(p):
        out = datasets_source.read(p)
    elif not p.is_file():
        raise ConfigError(f"task.dataset {str(path)!r}: no such file")
    else:
        out = _read_jsonl(p)
    if not out:
        raise ConfigError(f"task.dataset {str(path)!r} has no rows: one JSON object per line, e.g. "
                          '{"prompt": "...", "answer": "..."}')
    return out


def _read_jsonl(p: Path) -> list[tuple[str, dict]]:
    out = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p.name} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{p.name} line {n}: expected a JSON object {{\"prompt\": ...}}, got {type(row).__name__}")
            out.append((f"{p.name} line {n}", row))
    return out


def field_needs(metric_names: list[str], custom: set[str] = frozenset()) -> dict[str, tuple[tuple, bool, list[str]]]:
    """field -> (allowed types, required, the metrics that require it) for these metrics."""
    needs: dict[str, tuple[tuple, bool, list[str]]] = {"prompt": (TEXT_OR_MESSAGES, True, [])}
    for m in metric_names:
        if m in custom:
            continue
        for f in METRICS[m].fields if m in METRICS else ():
            types, req, by = needs.get(f.name, (f.types, False, []))
            needs[f.name] = (tuple(t for t in types if t in f.types) or f.types, req or f.required, by + [m] * f.required)
    return needs


def _missing(where: str, field: str, by: list[str]) -> ConfigError:
    if not by:
        return ConfigError(f"{where}: field '{field}' (needed by every task) is missing")
    drop = " ".join(f"--set reward.weights.{m}=0" for m in by)
    what = f"metric {by[0]}" if len(by) == 1 else f"metrics {', '.join(by)}"
    return ConfigError(f"{where}: field '{field}' (needed by {what}) is missing; add it to every row, "
                       f"or drop the {what.split()[0]}: {drop}")


def check_row(where: str, row: dict, needs: dict):
    for field, (typ, required, by) in needs.items():
        if field not in row:
            if required:
                raise _missing(where, field, by)
            continue
        if not _type_ok(row[field], typ):
            raise ConfigError(f"{where}: field '{field}' must be {TYPE_NAMES.get(typ, typ)}, "
                              f"got {type(row[field]).__name__} {json.dumps(row[field])[:40]}")
    if isinstance(row["prompt"], list):
        check_messages(where, row["prompt"])
    elif not row["prompt"].strip():
        raise ConfigError(f"{where}: field 'prompt' is empty")
    if "format" in row and "format" in needs:
        try:
            re.compile(row["format"])
        except re.error as e:
            raise ConfigError(f"{where}: field 'format' is not a valid regex ({e})") from None
    if "schema" in row and "schema" in needs:
        _check_schema(where, row["schema"])


def _check_schema(where: str, schema: dict):
    try:
        schema_validator(json.dumps(schema, sort_keys=True))
    except ImportError:
        raise ConfigError(f"{where}: field 'schema' needs the jsonschema package: pip install jsonschema "
                          "(or drop the row's schema: json_valid then checks JSON syntax only)") from None
    except Exception as e:  # jsonschema.SchemaError and friends
        msg = str(getattr(e, "message", e)).splitlines()[0]
        raise ConfigError(f"{where}: field 'schema' is not a valid JSON Schema ({msg[:120]})") from None


def load_rows(path: str | Path, metric_names: list[str], custom: set[str] = frozenset()) -> list[dict]:
    needs = field_needs(metric_names, set(custom))
    rows = []
    for where, row in read_rows(path):
        check_row(where, row, needs)
        row.setdefault("prompt_id", prompt_id(row["prompt"] if isinstance(row["prompt"], str)
                                              else json.dumps(row["prompt"], sort_keys=True)))
        row["prompt_id"] = str(row["prompt_id"])
        rows.append(row)
    return rows


def _numeric(answer) -> bool:
    if isinstance(answer, str):
        return as_number(final_answer(answer, last_number=False)) is not None
    return isinstance(answer, (int, float)) and not isinstance(answer, bool)


def default_weights(path: str | Path, custom: dict | None = None) -> dict[str, float]:
    """The weights of the metrics these rows can feed (module docstring), custom metrics at 1; if
    none, one line listing the fields found and the --set that chooses the metrics."""
    rows = [row for _, row in read_rows(path)]
    seen: dict[str, int] = {}
    for row in rows:
        for field in row:
            seen[field] = seen.get(field, 0) + 1
    names: list[str] = []
    if "answer" in seen:
        answers = [r["answer"] for r in rows if "answer" in r]
        names += ["math_answer"] if all(_numeric(a) for a in answers) else ["answer_f1", "exact"]
    names += [m.name for m in METRICS.values() if m.fed_by not in ("", "answer") and m.fed_by in seen]
    weights = {m: METRICS[m].weight for m in names}
    weights.update({m: 1.0 for m in (custom or {}) if m not in weights})
    if weights:
        return weights
    found = ", ".join(f"{f} ({k} of {len(rows)} rows)" for f, k in seen.items())
    raise ConfigError(f"{Path(path).name}: no built-in metric can score these rows (fields found: {found}); "
                      "add an 'answer' to each row (math_answer, exact and answer_f1 read it), or choose the metrics: "
                      "--set 'reward.weights={json_valid = 1.0}' (built-in: " + ", ".join(BUILTIN) +
                      ") or your own: --set reward.custom.mine=my_module:score")


class JsonlTask(Task):
    name = "jsonl"
    levels = 1

    def __init__(self, path: str, metric_names: list[str], custom: set[str] = frozenset(), seed: int = 0):
        super().__init__(1, seed)
        self.path = str(path)
        self.rows = load_rows(path, metric_names, set(custom))
        p = Path(path).expanduser()
        self.digest = (datasets_source.digest(self.rows) if datasets_source.is_datasets_source(p)
                       else hashlib.sha256(p.read_bytes()).hexdigest()[:16])
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
