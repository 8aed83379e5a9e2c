"""RunReads: a run store's reads, incremental and bounded.

Incremental: "what changed since step N". Bounded: index ranges a long run's pages can afford.
RunStore (store.py) adds the writes."""
from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager

import numpy as np
import pandas as pd

from grpo_core.runs.schema import SCHEMA_VERSION, STEP_SCORES_TABLE
from grpo_core.runs.step_scores import blob_frame, group_only, json_scores_to_step_scores, texts_in_order


class RunReads:
    """The read queries of one run's SQLite file (its connection: `conn`)."""

    conn: sqlite3.Connection
    version: int  # 1: a version-1 file opened without migrating it (RunStore checks the file)
    scores_from_json: bool  # such a file made before step_scores: its scores are read from the JSON

    def tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}

    def rollout_columns(self) -> list[str]:
        return [r[1] for r in self.conn.execute("PRAGMA main.table_info(rollouts)")]

    def last_step(self) -> int | None:
        row = self.conn.execute("SELECT MAX(step) FROM scalars").fetchone()
        return row[0]

    def scalars(self, since_step: int = -1, names: list[str] | None = None,
                until_step: int | None = None) -> pd.DataFrame:
        """Long frame (step, name, value) for steps > since_step."""
        q = "SELECT step, name, value FROM scalars WHERE step > ?"
        args: list = [since_step]
        if until_step is not None:
            q += " AND step <= ?"
            args.append(until_step)
        if names:
            q += f" AND name IN ({','.join('?' * len(names))})"
            args += list(names)
        return pd.read_sql_query(q + " ORDER BY step", self.conn, params=args)

    def scalars_wide(self, since_step: int = -1, names: list[str] | None = None,
                     until_step: int | None = None) -> pd.DataFrame:
        """One row per step, one column per metric name (index: step). One index range read per
        name (the (name, step) key): numbers only reach Python, never a name string per row,
        and no pivot (faster than a long read + pivot for a live page's reads: docs/benchmarks.md)."""
        rng, args = "step > ?", [since_step]
        if until_step is not None:
            rng += " AND step <= ?"
            args.append(until_step)
        if not names:  # every name (as scalars()); a bounded range: from the step index, not a pass over all
            src = "scalars" if since_step < 0 and until_step is None else "scalars INDEXED BY scalars_step"
            names = [r[0] for r in self.conn.execute(f"SELECT DISTINCT name FROM {src} WHERE {rng}", args)]
        parts = []
        for name in sorted(set(names)):
            rows = self.conn.execute(f"SELECT step, value FROM scalars WHERE name = ? AND {rng} ORDER BY step",
                                     [name, *args]).fetchall()
            if rows:
                st, v = zip(*rows)
                parts.append((name, np.array(st, np.int64), np.array(v, np.float64)))
        if not parts:
            return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
        index = np.unique(np.concatenate([p[1] for p in parts]))
        cols = {}
        for name, st, v in parts:
            cols[name] = np.full(len(index), np.nan)
            cols[name][np.searchsorted(index, st)] = v
        df = pd.DataFrame(cols, index=pd.Index(index, name="step"))
        df.columns.name = "name"  # as the pivot it replaces
        return df

    def groups(self, since_step: int = -1, until_step: int | None = None,
               steps: list[int] | None = None) -> pd.DataFrame:
        """steps: only these steps (an index lookup per step; a large run's report reads a sample)."""
        with_outcome = "group_outcomes" in self.tables()
        q = ('SELECT g.step, g.grp AS "group", prompt_id, size, reward_mean, reward_std, trainable, phantom'
             + (", o.outcome FROM groups g LEFT JOIN group_outcomes o ON o.step = g.step AND o.grp = g.grp"
                if with_outcome else ", NULL AS outcome FROM groups g") + " WHERE g.step > ?")
        args: list = [since_step]
        if until_step is not None:
            q += " AND g.step <= ?"
            args.append(until_step)
        if steps is not None:
            q += f" AND g.step IN ({','.join('?' * len(steps))})"
            args += [int(x) for x in steps]
        df = pd.read_sql_query(q + " ORDER BY g.step, g.grp", self.conn, params=args)
        df["trainable"] = df["trainable"].astype(bool)
        df["phantom"] = df["phantom"].astype(bool)
        return df

    def prompt_texts(self, prompt_ids: list[str]) -> dict[str, str]:
        """prompt id -> the text the model was prompted with (a store from before the prompts
        table, or a trainer that logs none: {})."""
        if "prompts" not in self.tables() or not prompt_ids:
            return {}
        marks = ",".join("?" * len(prompt_ids))
        return dict(self.conn.execute(f"SELECT prompt_id, text FROM prompts WHERE prompt_id IN ({marks})",
                                      [str(p) for p in prompt_ids]).fetchall())

    def rollouts(self, since_step: int = -1, until_step: int | None = None,
                 step: int | None = None, group: int | None = None, with_text: bool = True,
                 steps: list[int] | None = None) -> pd.DataFrame:
        """Frame (step, group, idx, total, error[, completion], <metric>...), rows in (step, group,
        idx) order, one float column per metric (NaN: a failed metric, or one a rollout lacks):
        the numbers from step_scores (one row per step), the texts from rollouts. steps: only
        these steps (index lookups); group: that group's rows."""
        where, args = "step > ?", [since_step]
        for cond, val in (("step <= ?", until_step), ("step = ?", step)):
            if val is not None:
                where += f" AND {cond}"
                args.append(val)
        if steps is not None:
            where += f" AND step IN ({','.join('?' * len(steps))})"
            args += [int(x) for x in steps]
        with self.snapshot():  # the numbers and the texts of the same commit
            if self.scores_from_json:
                self._temp_step_scores(where, args)
            rows = self.conn.execute("SELECT step, metrics, grp, idx, total, scores, errors FROM step_scores "
                                     f"WHERE {where} ORDER BY step", args).fetchall()
            texts = self.conn.execute(f"SELECT step, grp, idx, completion FROM rollouts WHERE {where}"
                                      + (" AND grp = ?" if group is not None else "") + " ORDER BY step, grp, idx",
                                      args + ([group] if group is not None else [])).fetchall() if with_text else []
        if group is not None:  # the frame is built from the group's rollouts only (its metrics, its errors)
            rows = [r for r in (group_only(r, group) for r in rows) if r is not None]
        df = blob_frame(rows) if rows else None
        if df is None or df.empty:
            cols = ("step", "group", "idx", "total", "error") + (("completion",) if with_text else ())
            return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("step", "group", "idx") else
                                              "float64" if c == "total" else object) for c in cols})
        if with_text:
            df.insert(5, "completion", texts_in_order(df, texts))
        return df

    @contextmanager
    def snapshot(self):
        """Reads inside one read transaction (WAL: one commit's view, no lock on writers)."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")

    def _temp_step_scores(self, where: str, args: list):
        """A version-1 store made before step_scores, opened without migrating (read-only): the
        steps of this read, from their scores JSON into a TEMP step_scores (this connection's
        only), which the read then takes as a version-2 store's. Made again for each read, so a
        step an older writer adds or completes meanwhile is read as it is now."""
        c = self.conn
        if "scores" not in self.rollout_columns():  # a writer migrated the file meanwhile: its step_scores
            c.execute("DROP TABLE IF EXISTS temp.step_scores")
            self.scores_from_json, self.version = False, SCHEMA_VERSION
            return
        c.execute(STEP_SCORES_TABLE.replace("step_scores", "temp.step_scores", 1))
        c.execute("DELETE FROM temp.step_scores")
        json_scores_to_step_scores(c, c.execute("SELECT step, grp, idx, total, scores, error FROM rollouts "
                                                f"WHERE {where} ORDER BY step, grp, idx", args).fetchall())

    def rollout_extent(self) -> tuple[int | None, int | None, int]:
        """(first step, last step, rollouts at the last step) from the primary key alone:
        how big a run's rollouts are, without counting ten million rows."""
        # Two queries: SQLite answers a lone MIN() or MAX() from the index, not both in one.
        lo = self.conn.execute("SELECT MIN(step) FROM rollouts").fetchone()[0]
        hi = self.conn.execute("SELECT MAX(step) FROM rollouts").fetchone()[0]
        n = self.conn.execute("SELECT COUNT(*) FROM rollouts WHERE step = ?", (hi,)).fetchone()[0] if hi is not None else 0
        return lo, hi, int(n)

    def events(self, since_id: int = 0, kinds: list[str] | None = None) -> pd.DataFrame:
        q, args = "SELECT id, step, time, kind, payload FROM events WHERE id > ?", [since_id]
        if kinds:
            q += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        df = pd.read_sql_query(q + " ORDER BY id", self.conn, params=args)
        df["payload"] = [json.loads(p) if p else {} for p in df["payload"]]
        return df

    # ---- reads for long runs (dashboard): bounded, index-driven ---------------------------------
    def scalar_names(self, step: int | None = None) -> list[str]:
        """Names logged at `step` (default: the last step); uses the step index, so it
        stays cheap on a 20,000-step run where SELECT DISTINCT would scan everything."""
        step = self.last_step() if step is None else step
        if step is None:
            return []
        return [r[0] for r in self.conn.execute("SELECT name FROM scalars WHERE step = ? ORDER BY name", (step,))]

    def scalars_binned(self, names: list[str], bin_size: int, until_step: int,
                       since_step: int = -1) -> pd.DataFrame:
        """Long frame (bin, name, total, count, low, high): SUM, COUNT, MIN and MAX of non-null
        values per bin = step // bin_size over since_step < step <= until_step, one (name, step)
        index range per name. Lets a chart show a long history with bounded memory, its spikes
        kept (low, high). Per name, not one GROUP BY name, bin: SQLite sorts the groups in a temp
        b-tree either way, and many small ones cost less than one big one (docs/benchmarks.md)."""
        cols = ["bin", "name", "total", "count", "low", "high"]
        if not names:
            return pd.DataFrame(columns=cols)
        q = ("SELECT step / ? AS bin, SUM(value), COUNT(value), MIN(value), MAX(value) FROM scalars "
             "WHERE name = ? AND step > ? AND step <= ? GROUP BY bin")
        rows = [(b, name, *agg) for name in sorted(set(names))
                for b, *agg in self.conn.execute(q, (int(bin_size), name, since_step, until_step))]
        if not rows:
            return pd.DataFrame(columns=cols)
        b, name, t, c, lo, hi = zip(*rows)
        return pd.DataFrame({"bin": np.array(b, np.int64), "name": list(name), "total": np.array(t, np.float64),
                             "count": np.array(c, np.int64), "low": np.array(lo, np.float64),
                             "high": np.array(hi, np.float64)})

