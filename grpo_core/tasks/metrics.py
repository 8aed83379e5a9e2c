"""The built-in reward metrics, one record each: what a metric is, for every part that reads one.

A record holds the function, the kind, the row fields it reads, the field that adds it to a
JSONL task, its default weight and its help. Everything else is read from these records: the
trainer's metric functions and kinds (`BUILTIN`, `KINDS`), a JSONL task's row checks and default
weights (jsonl.py), the "no such metric" error, and the table of docs/trainer.md (docs/tables.py
writes it). A new metric is its
function in rewards.py and one record here.

Kinds: binary (0 or 1: the planner's 1 - p^G - (1-p)^G applies), continuous (in [0, 1]),
penalty (graduated, in [-1, 0], best 0). Custom metrics are "custom": nothing is assumed about
their range.
"""
from __future__ import annotations

from dataclasses import dataclass

from grpo_core.errors import ConfigError, suggest
from grpo_core.tasks import rewards
from grpo_core.tasks.rewards import MetricFn

TEXT, INTEGER, OBJECT, TEXT_OR_NUMBER = (str,), (int,), (dict,), (str, int, float)
TEXT_OR_MESSAGES = (str, list)  # a prompt: text, or chat messages (chat.py renders them)
TYPE_NAMES = {TEXT: "a string", INTEGER: "an integer", OBJECT: "a JSON object", TEXT_OR_NUMBER: "a string or a number",
              TEXT_OR_MESSAGES: "a string or a list of chat messages"}


@dataclass(frozen=True)
class Field:
    """A field of a dataset row that a metric reads."""
    name: str
    types: tuple  # the JSON types it may have
    required: bool  # every row must have it (else it is optional and has a default)
    shown: str = ""  # what the docs table says of it: "string", "regex, optional"


@dataclass(frozen=True)
class Metric:
    name: str
    fn: MetricFn  # (completion, example) -> float
    kind: str  # binary | continuous | penalty
    fields: tuple[Field, ...]  # the row fields it reads
    weight: float  # its weight when a JSONL task's rows feed it (no [reward.weights] table)
    help: str  # what it scores, one line (the docs table)
    fed_by: str = ""  # the row field that adds it to a JSONL task's default metrics ("" = never: give it a weight;
    # "answer": math_answer when every answer is a number, else answer_f1 and exact)

    def fields_cell(self) -> str:
        return ", ".join(f"`{f.name}`" + (f" ({f.shown})" if f.shown else "") for f in self.fields)


ANSWER = Field("answer", TEXT, True, "string")
RECORDS = (
    Metric("answer_f1", rewards.token_f1, "continuous", (ANSWER,), 0.4,
           "token F1 of the answer part (citations left out)", fed_by="answer"),
    Metric("exact", rewards.exact_match, "binary", (ANSWER,), 0.3,
           "the answer part equals `answer`, case and spaces ignored", fed_by="answer"),
    Metric("citation", rewards.citation, "binary", (Field("source", TEXT, True),), 0.2,
           "cites exactly `[source]`", fed_by="source"),
    Metric("format", rewards.format_check, "binary", (Field("format", TEXT, False, "regex, optional"),), 0.1,
           "the completion matches it (default `answer [Sn]`)", fed_by="format"),
    Metric("length", rewards.length_penalty, "penalty", (Field("max_len", INTEGER, False, "optional, 12"),), 0.1,
           "0 up to `max_len` characters, −0.1 per extra one, down to −1", fed_by="max_len"),
    Metric("math_answer", rewards.math_answer, "binary", (Field("answer", TEXT_OR_NUMBER, True, "string or number"),),
           1.0, "the final answer (last `\\boxed{}`, else after `####`, else the last number) equals `answer`'s, as "
           "numbers: `1,000` = `1000.0`, `3/4` = `0.75` = `\\frac{3}{4}`; else as text", fed_by="answer"),
    Metric("json_valid", rewards.json_valid, "binary", (Field("schema", OBJECT, False, "JSON Schema, optional"),), 1.0,
           "the completion is JSON (one ```` ``` ```` fence allowed) and valid against `schema`", fed_by="schema"),
    Metric("token_length", rewards.token_length_penalty, "penalty",
           (Field("max_tokens", INTEGER, False, "optional, 256"),), 0.1,
           "0 up to `max_tokens` tokens, then linearly down to −1 at twice that; a token is a word or a punctuation "
           "mark (a metric sees text, not the model's token ids)", fed_by="max_tokens"),
    Metric("repetition", rewards.repetition_penalty, "penalty", (Field("ngram_size", INTEGER, False, "optional, 3"),),
           0.1, "minus the share of the completion's word n-grams that repeat an earlier one (open-r1's repetition "
           "penalty, max −1); never a default: give it a weight"),
)
METRICS: dict[str, Metric] = {}
BUILTIN: dict[str, MetricFn] = {}  # name -> function, for the trainer
KINDS: dict[str, str] = {}  # name -> kind, for the planner, the autopilot and the advice


def register(metric: Metric):
    """A record made a built-in metric everywhere (a plugin or a test may add one)."""
    METRICS[metric.name], BUILTIN[metric.name], KINDS[metric.name] = metric, metric.fn, metric.kind


for record in RECORDS:
    register(record)


def unknown_metric(name: str) -> ConfigError:
    """The one line for a weight that names no metric."""
    return ConfigError(f"reward.weights.{name}: no such metric{suggest(name, BUILTIN)}; built-in metrics are "
                       f"{', '.join(BUILTIN)}, others go in reward.custom.{name} = 'module:function'")


def docs_table() -> str:
    """The built-in metrics as docs/trainer.md shows them (docs/tables.py)."""
    rows = [f"| `{m.name}` | {m.kind} | {m.fields_cell()} | {m.help} |" for m in METRICS.values()]
    return "\n".join(["| metric | kind | row fields | score |", "|---|---|---|---|", *rows])
