"""Benchmark: the dashboard's reads on a run store at scale.

A synthetic run of 20,000 steps x 64 groups x 8 rollouts (10,240,000 rollout rows, 5 demo
metrics, a completion text per rollout), written step by step through RunStore.log_step as
the trainer writes, with a weight change every 4,000 steps. Built once and cached under
--cache (default /tmp/grpo-store-scale; the build time is recorded there and reported). A
cached store is reused only if it was built at the current store version (build.json and the
file's own meta schema_version); any other is deleted and rebuilt, never migrated (a writable
open would migrate a version-1 file in place, slowly, and the timings would be of a migrated
file, not of one written as the trainer writes now).

Measured on it (targets in brackets):
- live page first render: grpo_core.dashboard.live_view first load + cards + chart frame + figures + the
  what-if of the sliders (bench/dashboard_bench.first_render) [< 1 s]
- live page refresh after one new step (dashboard_bench.refresh) [< 100 ms]
- analysis report: report.build_report(run) [< 5 s]
- what-if on the last 50 steps, reading them from the store: RunStore.rollouts + reweighting.what_if
  [< 50 ms]; the window's read alone (without and with the texts) and the bytes per rollout of
  its step_scores arrays, as context. (Up to store version 1 this also timed the same window
  read from the rollouts' JSON scores; version 2 keeps the scores as step_scores arrays only,
  so that comparison is gone.)
- store size on disk per million rollouts, keep_text = all and = sample (a smaller store
  built the same way for each)
- every step-range read uses an index (EXPLAIN QUERY PLAN: SEARCH, never SCAN)

    .venv/bin/python bench/store_scale.py [--steps 20000] [--groups 64] [--group-size 8]
        [--size-steps 2000] [--repeats 5] [--cache DIR] [--build-only] [--no-write]

A reduced run (--steps, --groups, --group-size or --size-steps other than the defaults) says so in the section it
writes; --no-write only prints it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from perf_common import fmt_ms, machine, publish, summary, timeit  # noqa: E402

from grpo_core.analysis import reweighting, step_stats  # noqa: E402
from grpo_core.errors import StoreError  # noqa: E402
from grpo_core.runs import names  # noqa: E402
from grpo_core.runs.config import DEMO_WEIGHTS, RunConfig  # noqa: E402
from grpo_core.runs.run_meta import FINISHED  # noqa: E402
from grpo_core.runs.schema import SCHEMA_VERSION  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402

HEADING = "## Store at scale"
METRICS = list(DEMO_WEIGHTS)
VALUES = ["hot", "red", "big", "old", "wet", "dry", "tall", "cold", "dark", "blue"]
TARGETS = {"first": 1.0, "refresh": 0.1, "report": 5.0, "whatif": 0.05}
WHATIF_STEPS = 50
DEFAULTS = {"steps": 20_000, "groups": 64, "group_size": 8, "size_steps": 2_000}


def synth_scores(rng: np.random.Generator, P: int, G: int, step: int, steps: int) -> np.ndarray:
    """[P, G, 5]: f1 continuous, exact/citation/format binary, length a graduated penalty;
    success rises with the step, solved prompts give identical rewards (uniform groups)."""
    p = 0.2 + 0.6 * step / max(steps, 1)
    f1 = np.round(np.clip(rng.beta(2 + 4 * p, 3, size=(P, G)), 0, 1), 4)
    exact = (rng.random((P, G)) < p * 0.8).astype(float)
    cite = (rng.random((P, G)) < 0.5 + 0.4 * p).astype(float)
    fmt = (rng.random((P, G)) < 0.97).astype(float)
    length = -np.round(np.clip(rng.normal(0.05, 0.1, size=(P, G)), 0, 1), 1)
    out = np.stack([f1, exact, cite, fmt, length], axis=-1)
    solved = rng.random(P) < 0.2 + 0.5 * step / max(steps, 1)
    out[solved] = np.array([1.0, 1.0, 1.0, 1.0, 0.0])
    return out


def cached(path: Path) -> dict | None:
    """The build facts of a finished cached store at the current SCHEMA_VERSION, else None.
    Read-only (a read-only open never migrates), so an older store is left for build to delete."""
    try:
        facts = json.loads((path / "build.json").read_text())
        if facts.get("schema_version") != SCHEMA_VERSION:
            return None
        with RunStore.open(path, readonly=True) as s:
            ok = s.version == SCHEMA_VERSION and s.get_meta().get("schema_version") == SCHEMA_VERSION
        return facts if ok else None
    except (OSError, ValueError, StoreError, sqlite3.Error):  # no cache, a torn build.json, an unreadable store
        return None


def build(path: Path, steps: int, P: int, G: int, keep_text: str, seed: int = 0) -> dict:
    """Write the run through RunStore.log_step (as the trainer does); returns build facts."""
    facts = cached(path)
    if facts is not None:
        return facts
    shutil.rmtree(path, ignore_errors=True)  # absent, half-built, or another store version: rebuilt
    cfg = RunConfig()
    cfg.grpo.steps, cfg.grpo.prompts_per_step, cfg.grpo.group_size = steps, P, G
    cfg.log.keep_text = keep_text
    t0 = time.time()
    store = RunStore.create(path.name, cfg.to_dict(), root=path.parent)
    store.set_meta(metric_names=METRICS, metric_kinds={m: "binary" for m in METRICS}, pid=None)
    rng = np.random.default_rng(seed)
    weights = dict(DEMO_WEIGHTS)
    n_text = P if keep_text == "all" else min(P, cfg.log.text_sample_groups)
    cs = ct = 0
    for step in range(1, steps + 1):
        if step % 4000 == 0:  # a weight change, applied like the trainer applies a request
            weights = {**weights, "length": round(weights["length"] + 0.1, 3)}
            rid = store.request("set_weights", {"weights": weights}, source="bench")
            store.claim_pending()
            store.resolve_request(rid, True, step, f"applied at step {step}")
        scores = synth_scores(rng, P, G, step, steps)
        w = np.array([weights[m] for m in METRICS])
        totals = scores @ w
        stats = step_stats.group_stats(totals, scores, min_group_std=0.01)
        sc = step_stats.step_scalars(stats, scores, METRICS, weights, cs, ct)
        cs, ct = int(sc[names.CUM_GROUPS_SUBMITTED]), int(sc[names.CUM_GROUPS_TRAINABLE])
        sc.update({names.LOSS_POLICY: float(rng.normal()), names.LOSS_KL: 0.0, names.LOSS_ENTROPY: 0.5, names.GRAD_NORM: 1.0,
                   names.CLIP_RATIO: 0.0, names.COMPLETION_MEAN_LENGTH: 9.5, names.TIME_STEP: 0.2, names.TIME_GENERATE: 0.1,
                   names.TIME_SCORE: 0.001, names.TIME_TRAIN: 0.08, names.TIME_LOG: 0.002, names.THROUGHPUT_TOKENS: 3000.0,
                   names.MIN_GROUP_STD: 0.01, names.DIFFICULTY: 1.0, names.SCORING_ERRORS: 0.0, names.SAMPLING_BATCHES: 1.0})
        groups = pd.DataFrame({"group": np.arange(P), "prompt_id": [f"{step:05d}-{g:02d}" for g in range(P)],
                               "size": G, "reward_mean": stats.mean, "reward_std": stats.std,
                               "trainable": stats.trainable, "phantom": stats.phantom})
        flat, raw = totals.reshape(-1).tolist(), scores.reshape(-1, len(METRICS)).tolist()
        words = rng.integers(0, len(VALUES), P * G).tolist()
        rolls = [(i // G, i % G, flat[i], dict(zip(METRICS, raw[i])),
                  f"{VALUES[words[i]]} [S{1 + i % 3}]" if i // G < n_text else None, None) for i in range(P * G)]
        store.log_step(step, sc, groups, rolls, [])
        if step % 1000 == 0:
            print(f"  {path.name}: step {step}/{steps}, {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    store.set_status(FINISHED)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    facts = {"steps": steps, "groups": P, "group_size": G, "rollouts": steps * P * G, "keep_text": keep_text,
             "build_s": time.time() - t0, "bytes": os.path.getsize(path / "run.db"),
             "built": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "schema_version": SCHEMA_VERSION}
    (path / "build.json").write_text(json.dumps(facts))
    return facts


# ---- index checks -------------------------------------------------------------------------
RANGE_QUERIES = {
    "scalars_wide: one name's steps in a range (one read per name)":
        "SELECT step, value FROM scalars WHERE name = ? AND step > ? AND step <= ? ORDER BY step",
    "scalars_wide without names: the names logged in a step range":
        "SELECT DISTINCT name FROM scalars INDEXED BY scalars_step WHERE step > ? AND step <= ?",
    "scalars(): long read by step range":
        "SELECT step, name, value FROM scalars WHERE step > ? AND step <= ?",
    "scalars binned, one name (live first load, old part)":
        "SELECT step / 16 AS bin, SUM(value), COUNT(value) FROM scalars "
        "WHERE name = 'train/reward' AND step > ? AND step <= ? GROUP BY bin",
    "groups by step range": "SELECT * FROM groups WHERE step > ? AND step <= ? ORDER BY step, grp",
    "rollouts by step range (the what-if window's texts)":
        "SELECT step, grp, idx, completion FROM rollouts WHERE step > ? AND step <= ? ORDER BY step, grp, idx",
    "step_scores by step range (the what-if window's scores)":
        "SELECT step, metrics, grp, idx, total, scores, errors FROM step_scores WHERE step > ? AND step <= ? "
        "ORDER BY step",
    "one group's texts (inspector)":
        "SELECT step, grp, idx, completion FROM rollouts WHERE step = ? AND grp = ? ORDER BY step, grp, idx",
    "one step's scores (inspector)":
        "SELECT step, metrics, grp, idx, total, scores, errors FROM step_scores WHERE step = ? ORDER BY step",
    "last step": "SELECT MAX(step) FROM scalars",
}


def index_checks(db: Path) -> list[tuple[str, str, bool]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = []
    for name, q in RANGE_QUERIES.items():
        plan = " / ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + q, [1] * q.count("?")))
        out.append((name, plan, "SCAN " not in plan))  # SEARCH ... USING (PRIMARY KEY | INDEX): an index
    conn.close()
    return out


# ---- the reads ------------------------------------------------------------------------------
def window_read(run_dir: Path, n_steps: int, repeats: int) -> dict:
    """The what-if window's read alone (RunStore.rollouts, no what-if), without and with the
    texts, and the bytes its step_scores rows take per rollout."""
    with RunStore.open(run_dir, readonly=True) as s:
        since = s.last_step() - n_steps
        frame = s.rollouts(since_step=since, with_text=False)
        t = summary(timeit(lambda: s.rollouts(since_step=since, with_text=False), repeats))
        t_text = summary(timeit(lambda: s.rollouts(since_step=since, with_text=True), repeats))
        size = s.conn.execute("SELECT SUM(length(metrics) + length(grp) + length(idx) + length(total) + "
                              "length(scores) + IFNULL(length(errors), 0)) FROM step_scores WHERE step > ?",
                              (since,)).fetchone()[0]
    return {"read": t, "read_text": t_text, "rows": len(frame), "bytes_per_rollout": size / len(frame)}


def measure(run_dir: Path, repeats: int, P: int, G: int) -> dict:
    from dashboard_bench import first_render, refresh

    from grpo_core.analysis import report
    res = {}
    res["first"] = timeit(lambda: first_render(run_dir), repeats)
    st, _ = first_render(run_dir)
    store = RunStore.open(run_dir)
    last = store.last_step()
    refresh_s = []
    try:  # one new step per refresh, as a live run adds them; removed again afterwards
        rng = np.random.default_rng(1)
        for k in range(repeats * 2):
            scores = synth_scores(rng, P, G, last, last)
            rolls = [(g, i, float(scores[g, i] @ np.array(list(DEMO_WEIGHTS.values()))),
                      dict(zip(METRICS, scores[g, i].tolist())), "x", None) for g in range(P) for i in range(G)]
            store.log_step(last + 1 + k, {names.REWARD: 0.5, names.TRAINABLE_RATIO: 0.5}, None, rolls, [])
            t = time.perf_counter()
            refresh(run_dir, st)
            refresh_s.append(time.perf_counter() - t)
    finally:
        store.truncate_after(last)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.close()
    res["refresh"] = refresh_s

    weights = {**DEMO_WEIGHTS, "exact": 0.1, "answer_f1": 0.6}

    def whatif():
        with RunStore.open(run_dir, readonly=True) as s:
            frame = s.rollouts(since_step=last - WHATIF_STEPS, with_text=False)
        return reweighting.what_if(frame, weights)
    res["whatif"] = timeit(whatif, repeats)
    res["report"] = timeit(lambda: report.build_report(run_dir), max(2, (repeats + 1) // 2), warmup=0)
    rep = report.build_report(run_dir)
    res["report_notes"] = [n.text for n in rep.notices]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--groups", type=int, default=DEFAULTS["groups"])
    ap.add_argument("--group-size", type=int, default=DEFAULTS["group_size"])
    ap.add_argument("--size-steps", type=int, default=DEFAULTS["size_steps"],
                    help="steps of the stores built to compare keep_text")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache", default="/tmp/grpo-store-scale")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    P, G = args.groups, args.group_size
    big = cache / f"scale-{args.steps}x{P}x{G}"
    facts = build(big, args.steps, P, G, "all")
    sizes = {kt: build(cache / f"size-{args.size_steps}x{P}x{G}-{kt}", args.size_steps, P, G, kt)
             for kt in ("all", "sample")}
    print(json.dumps({"big": facts, "sizes": sizes}, indent=1), file=sys.stderr)
    if args.build_only:
        return 0
    checks = index_checks(big / "run.db")
    res = measure(big, args.repeats, P, G)
    wr = window_read(big, WHATIF_STEPS, args.repeats)
    rows = []
    for key, label in (("first", "live page first render (data layer)"), ("refresh", "live page refresh, one new step"),
                       ("report", "analysis report: report.build_report"),
                       ("whatif", f"what-if on the last {WHATIF_STEPS} steps, read from the store + computed")):
        s = summary(res[key])
        ok = "✓" if s["median"] < TARGETS[key] else "✗"
        unit, scale = ("s", 1.0) if TARGETS[key] >= 1 else ("ms", 1000.0)
        rows.append(f"| {label} | {TARGETS[key] * scale:g} {unit} | {fmt_ms(s, unit, scale, 2 if unit == 's' else 1)}"
                    f" | {ok} |")
    per_m = {kt: f["bytes"] / f["rollouts"] * 1e6 / 2**20 for kt, f in sizes.items()}
    command = ".venv/bin/python bench/store_scale.py" + "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}" for k in DEFAULTS if getattr(args, k) != DEFAULTS[k])
    command += f" --repeats {args.repeats}" + (f" --cache {args.cache}" if args.cache != "/tmp/grpo-store-scale" else "")
    reduced = {k: getattr(args, k) for k in DEFAULTS if getattr(args, k) != DEFAULTS[k]}
    change_every = ("a weight change every 4,000 steps" if facts["steps"] >= 4000
                    else "no weight change: a weight change comes every 4,000 steps")
    lines = [
        HEADING, "",
        f"A synthetic finished run of {facts['steps']:,} steps x {P} groups x {G} rollouts = "
        f"{facts['rollouts']:,} rollout rows (5 demo metrics, a completion text for every rollout, {change_every}), "
        f"written step by step through `RunStore.log_step` as the trainer writes (store version {SCHEMA_VERSION}).",
        "",
        *([f"**Reduced run** ({', '.join(f'{k} {v:,}' for k, v in reduced.items())}; the defaults are "
           f"{', '.join(f'{k} {DEFAULTS[k]:,}' for k in reduced)}): a check that the bench runs, not the "
           "measurement at scale.", ""] if reduced else []),
        f"- Command: `{command}`",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Build (once, cached in {args.cache}): {facts['build_s'] / 60:.1f} min on {facts['machine']}; "
        f"{facts['bytes'] / 2**30:.2f} GiB on disk.",
        "",
        "| read | target | median | spread (p25-p75) | min-max | repeats | |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Store size on disk per million rollouts (same builder, " f"{args.size_steps:,} steps x {P} x {G}): "
        f"keep_text = all: **{per_m['all']:.0f} MiB**, keep_text = sample ({RunConfig().log.text_sample_groups} "
        f"groups' texts per step): **{per_m['sample']:.0f} MiB** (scores are kept for every rollout either way).",
        "",
        "Every step-range read uses an index (SQLite EXPLAIN QUERY PLAN):",
        "",
        "| read | plan | indexed |",
        "| --- | --- | --- |",
        *[f"| {n} | `{p}` | {'yes' if ok else '**NO**'} |" for n, p, ok in checks],
        "",
    ]
    lines += [
        f"The what-if window ({WHATIF_STEPS} steps, {wr['rows']:,} rollouts) is read from `step_scores`: one row per "
        "step holding the step's rollouts as arrays (group and idx int32, total and each metric's score float64, "
        "exact), written by `log_step` in the step's transaction; `rollouts` holds each rollout's text only. The "
        f"window's read alone (`RunStore.rollouts`, no what-if) takes **{wr['read']['median'] * 1000:.1f} ms** "
        f"without the texts (p25-p75 {wr['read']['p25'] * 1000:.1f}-{wr['read']['p75'] * 1000:.1f} ms) and "
        f"**{wr['read_text']['median'] * 1000:.1f} ms** with them (p25-p75 {wr['read_text']['p25'] * 1000:.1f}-"
        f"{wr['read_text']['p75'] * 1000:.1f} ms); the arrays take {wr['bytes_per_rollout']:.0f} bytes per rollout "
        "(included in the sizes above). Store version 2 keeps the scores in this form only, so the comparison "
        "with the same window read from the rollouts' JSON scores (store version 1 kept both) is no longer "
        "measured here. A version-1 file is migrated in place by the first open that may write it, and read as it "
        "is by a read-only one (`grpo_core/runs/schema.py`); this bench rebuilds a cached store of another version "
        "instead of migrating it.",
        "",
    ]
    if res.get("report_notes"):
        lines += ["Report notices on this run: " + " ".join(res["report_notes"]), ""]
    text = "\n".join(lines)
    publish(HEADING, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
