"""The step_scores codec: a step's rollout numbers packed into one row of arrays, and read back.

A rollout's numbers are stored once, in step_scores: one row per step with the step's rollouts
as arrays in (group, idx) order: grp/idx little-endian int32, total and the scores float64 (exact:
what-if under the recorded weights must give the recorded ratio; NaN: a failed metric or a
non-finite total), metric names once (JSON list), errors as JSON [position, text] pairs.
`rollouts` keeps one row per rollout with its text (NULL: not kept). Why this form and not the
scores as JSON in `rollouts` (version 1 kept both): the reads that need every score of a step
range (what-if, bottlenecks, the autopilot) take one row per step instead of one row and one
JSON object per rollout (docs/benchmarks.md, "Store at scale").
"""
from __future__ import annotations

import functools
import itertools
import json
import operator
import sqlite3

import numpy as np
import pandas as pd

from grpo_core.errors import StoreError
from grpo_core.runs.step_columns import StepRollouts


def _score_row(scores: dict, names: list[str], where: str) -> list[float]:
    try:  # None (a metric that failed) -> NaN, as the JSON null reads back
        return [np.nan if (v := scores.get(n)) is None else float(v) for n in names]
    except (TypeError, ValueError):
        bad = next(n for n in names if not isinstance(scores.get(n), (int, float, np.number, type(None))))
        raise StoreError(f"score {bad!r} of {where} is {scores[bad]!r}: a metric's score must be a number "
                         "(or None when the metric failed)") from None


def write_step_scores(c: sqlite3.Connection, step: int, rollouts: list[tuple]):
    """One step's rollouts (tuples as log_step takes them) as arrays into step_scores, rows in
    (group, idx) order. A step written twice (TRL logs a step per generation batch) merges as
    INSERT OR REPLACE does in `rollouts`: the later write of a (group, idx) wins. A score that is
    None or not finite is stored as NaN (a failed metric), as StepRollouts' are."""
    old = c.execute("SELECT metrics, grp, idx, total, scores, errors FROM step_scores WHERE step = ?",
                    (step,)).fetchone()
    merged = _decode_step(*old) if old is not None else {}
    merged.update({(int(r[0]), int(r[1])): r for r in rollouts})
    rollouts = [merged[k] for k in sorted(merged)]
    dicts = [r[3] for r in rollouts]
    names = list(dicts[0])
    try:  # the trainer's case, at C speed: every rollout has the same metrics; None -> NaN
        if any(len(d) != len(names) for d in dicts):
            raise KeyError
        get = operator.itemgetter(*names) if names else (lambda d: ())  # one name: a value, the reshape copes
        scores = np.array(list(map(get, dicts)), np.float64).reshape(len(dicts), len(names))
    except (KeyError, TypeError, ValueError):
        names = list(dict.fromkeys(n for d in dicts for n in d))
        scores = np.array([_score_row(r[3], names, f"rollout (group {int(r[0])}, idx {int(r[1])}) of step {step}")
                           for r in rollouts], np.float64).reshape(len(dicts), len(names))
    if not np.isfinite(scores).all():
        scores[~np.isfinite(scores)] = np.nan
    total = np.array([np.nan if r[2] is None else r[2] for r in rollouts], np.float64)
    total[~np.isfinite(total)] = np.nan
    errors = [[pos, r[5]] for pos, r in enumerate(rollouts) if r[5] is not None]
    c.execute("INSERT OR REPLACE INTO step_scores VALUES (?, ?, ?, ?, ?, ?, ?)",
              (step, json.dumps(names), np.array([r[0] for r in rollouts], "<i4").tobytes(),
               np.array([r[1] for r in rollouts], "<i4").tobytes(), total.astype("<f8").tobytes(),
               scores.astype("<f8").tobytes(), json.dumps(errors) if errors else None))


def insert_step_scores(c: sqlite3.Connection, step: int, r: StepRollouts):
    """StepRollouts into step_scores straight from its arrays, in few numpy calls (each call has
    a fixed cost, larger on the cold caches after a backward pass). A step already there (a resumed or
    TRL run writing a step twice) merges through write_step_scores, as tuples would."""
    # Rows in (group, idx) order, as write_step_scores keeps them (the trainer's already are).
    key = r.group * (int(r.idx.max(initial=0)) + 1) + r.idx
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        order = np.lexsort((r.idx, r.group))
        r = StepRollouts(r.names, r.group[order], r.idx[order], r.total[order], r.scores[order],
                         [r.texts[k] for k in order], [r.errors[k] for k in order])
    total = r.total if np.isfinite(r.total).all() else np.where(np.isfinite(r.total), r.total, np.nan)
    scores = r.scores if np.isfinite(r.scores).all() else np.where(np.isfinite(r.scores), r.scores, np.nan)
    errors = [[pos, e] for pos, e in enumerate(r.errors) if e is not None]
    f8 = np.dtype("<f8")  # float64 arrays are stored as they are on a little-endian machine (no copy)
    try:
        c.execute("INSERT INTO step_scores VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (step, _names_json(tuple(r.names)), r.group.astype("<i4").tobytes(), r.idx.astype("<i4").tobytes(),
                   total.astype(f8, copy=False).tobytes(), scores.astype(f8, copy=False).tobytes(),
                   json.dumps(errors) if errors else None))
    except sqlite3.IntegrityError:  # the step is there: merge (the later write of a (group, idx) wins)
        write_step_scores(c, step, list(r))


@functools.lru_cache(maxsize=64)
def _names_json(names: tuple) -> str:
    return json.dumps(list(names))


# Multi-row INSERT statements: one statement step inserts many rows, where executemany steps a
# one-row statement per row (cheaper for a step's rollouts, which share pages; not for the scalars,
# whose rows land on a different page each). SQLite binds at most 32766 parameters per statement.
ROWS_PER_STATEMENT = 256


@functools.lru_cache(maxsize=64)
def _insert_sql(table: str, width: int, n: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return f"INSERT OR REPLACE INTO {table} VALUES " + ", ".join([row] * n)


def insert_rows(c: sqlite3.Connection, table: str, rows: list[tuple]):
    """INSERT OR REPLACE rows into table, ROWS_PER_STATEMENT rows per statement. Rows apply in
    order, so a later row replaces an earlier one with the same key, as with executemany."""
    for k in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[k:k + ROWS_PER_STATEMENT]
        c.execute(_insert_sql(table, len(chunk[0]), len(chunk)), [v for row in chunk for v in row])


def _decode_step(metrics, grp, idx, total, scores, errors) -> dict:
    """A step_scores row back into {(group, idx): (group, idx, total, scores, None, error)}."""
    names = json.loads(metrics)
    g, i = np.frombuffer(grp, "<i4"), np.frombuffer(idx, "<i4")
    sc = np.frombuffer(scores, "<f8").reshape(len(g), len(names))
    err = dict(json.loads(errors)) if errors else {}
    return {(int(g[k]), int(i[k])): (int(g[k]), int(i[k]), float(total_k),
                                     {n: (None if np.isnan(v) else float(v)) for n, v in zip(names, sc[k])},
                                     None, err.get(k))
            for k, total_k in enumerate(np.frombuffer(total, "<f8"))}


def texts_in_order(df: pd.DataFrame, texts: list[tuple]) -> list:
    """rollouts rows (step, grp, idx, completion) -> the completion of each row of df (a
    step_scores frame). Both are in (step, group, idx) order and hold the same rollouts (one
    transaction writes both), so this is the completions as they come; should they differ,
    matched by key (None where rollouts has no row)."""
    if len(texts) == len(df):
        st, gr, ix, comp = zip(*texts)
        if (np.array_equal(df["step"].to_numpy(), st) and np.array_equal(df["group"].to_numpy(), gr)
                and np.array_equal(df["idx"].to_numpy(), ix)):
            return list(comp)
    by_key = {(s, g, i): t for s, g, i, t in texts}
    return [by_key.get(k) for k in zip(df["step"].tolist(), df["group"].tolist(), df["idx"].tolist())]


def group_only(row: tuple, group: int) -> tuple | None:
    """A step_scores row (step, metrics, grp, idx, total, scores, errors) cut to one group's
    rollouts; None when the step has none of them."""
    g = np.frombuffer(row[2], "<i4")
    keep = np.flatnonzero(g == group)
    if len(keep) == len(g):
        return row
    if not len(keep):
        return None
    scores = np.frombuffer(row[5], "<f8").reshape(len(g), len(json.loads(row[1])))
    new_pos = {int(p): n for n, p in enumerate(keep)}
    errors = [[new_pos[p], e] for p, e in json.loads(row[6]) if p in new_pos] if row[6] else []
    return (row[0], row[1], g[keep].tobytes(), np.frombuffer(row[3], "<i4")[keep].tobytes(),
            np.frombuffer(row[4], "<f8")[keep].tobytes(), scores[keep].tobytes(),
            json.dumps(errors) if errors else None)


def blob_frame(rows: list[tuple]) -> pd.DataFrame:
    """step_scores rows (step, metrics, grp, idx, total, scores, errors) -> the frame
    RunStore.rollouts(with_text=False) returns: a few concatenations, no per-rollout Python."""
    n = np.array([len(r[2]) // 4 for r in rows])
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    df = pd.DataFrame({
        "step": np.repeat(np.array([r[0] for r in rows], np.int64), n),
        "group": np.frombuffer(b"".join(r[2] for r in rows), "<i4").astype(np.int64),
        "idx": np.frombuffer(b"".join(r[3] for r in rows), "<i4").astype(np.int64),
        "total": np.frombuffer(b"".join(r[4] for r in rows), "<f8").astype(np.float64)})
    error = np.full(len(df), None, dtype=object)
    for r, s in zip(rows, start):
        if r[6]:
            for pos, msg in json.loads(r[6]):
                error[s + pos] = msg
    df["error"] = error
    metric_sets = {r[1] for r in rows}
    if len(metric_sets) == 1:  # what a trainer writes: the same metrics every step
        names = json.loads(rows[0][1])
        sc = np.frombuffer(b"".join(r[5] for r in rows), "<f8").reshape(len(df), len(names)).astype(np.float64)
    else:  # the union, in order of first appearance (as the JSON path builds it)
        per_row = [json.loads(r[1]) for r in rows]
        names = list(dict.fromkeys(m for ms in per_row for m in ms))
        sc = np.full((len(df), len(names)), np.nan)
        for r, ms, s, k in zip(rows, per_row, start, n):
            if ms:
                sc[s:s + k, [names.index(m) for m in ms]] = np.frombuffer(r[5], "<f8").reshape(k, len(ms))
    return pd.concat([df, pd.DataFrame(sc, columns=names)], axis=1)


def json_scores_to_step_scores(c: sqlite3.Connection, rows: list[tuple]):
    """Version-1 rollouts rows (step, grp, idx, total, scores JSON, error), in (step, grp, idx)
    order, into step_scores: a migration's steps, and a read-only open's TEMP table."""
    for step, rs in itertools.groupby(rows, key=operator.itemgetter(0)):
        write_step_scores(c, step, [(g, i, t, json.loads(sc) if sc else {}, None, e) for _, g, i, t, sc, e in rs])

