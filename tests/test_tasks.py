"""Tasks: the demo's seeded stream, levels and metrics; the JSONL loader's row checks."""
import json
import re

import numpy as np
import pytest

from grpo_core.errors import ConfigError
from grpo_core.runs.config import DEMO_WEIGHTS
from grpo_core.tasks import build_metrics, make_task
from grpo_core.tasks.demo import LEVELS, NEAR, DemoTask
from grpo_core.tasks.jsonl import JsonlTask, load_rows
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.metrics import BUILTIN
from grpo_core.tasks.rewards import CompositeReward


def _reward():
    fns, _ = build_metrics(list(DEMO_WEIGHTS), {})
    return CompositeReward(fns, DEMO_WEIGHTS)


def test_demo_examples_are_answerable_from_their_prompt():
    task = DemoTask(level=1, seed=0)
    for level in range(1, task.levels + 1):
        task.set_level(level)
        for ex in task.batch(50):
            q, facts = re.fullmatch(r"Q: (\w+)\? (.*) A: ", ex["prompt"]).groups()
            found = dict((k, (v, s)) for k, v, s in re.findall(r"(\w+)=([\w ]+?) \[(S\d+)\]", facts))
            assert len(found) == LEVELS[level]["sources"]
            assert found[q] == (ex["answer"], ex["source"])  # the asked key's value and its source id
            assert ex["level"] == level and ex["prompt_id"]


def test_demo_target_scores_full_marks_and_a_wrong_answer_does_not():
    task, reward = DemoTask(level=2, seed=1), _reward()
    exs = task.batch(20)
    right = reward.score([task.target(e) for e in exs], exs)
    assert np.allclose(right.totals, sum(w for m, w in DEMO_WEIGHTS.items() if m != "length"))
    assert right.num_errors == 0
    wrong = reward.score(["zzz [S9]"] * len(exs), exs)
    raw = dict(zip(reward.names, wrong.raw.T))
    assert (raw["exact"] == 0).all() and (raw["citation"] == 0).all() and (raw["format"] == 1).all()


def test_demo_stream_is_seeded_and_resumable():
    a, b = DemoTask(1, seed=7), DemoTask(1, seed=7)
    assert [e["prompt"] for e in a.batch(10)] == [e["prompt"] for e in b.batch(10)]
    assert DemoTask(1, seed=8).batch(1)[0]["prompt"] != DemoTask(1, seed=7).batch(1)[0]["prompt"]
    a.set_level(3)
    state = json.loads(json.dumps(a.state_dict()))  # survives a round trip through plain data
    expected = [e["prompt"] for e in a.batch(5)]
    c = DemoTask(1, seed=0)
    c.load_state_dict(state)
    assert c.level == 3 and [e["prompt"] for e in c.batch(5)] == expected


def test_demo_warm_stream_does_not_shift_the_prompt_stream():
    a, b = DemoTask(1, seed=3), DemoTask(1, seed=3)
    a.warm_batch(64)
    assert a.batch(3) == b.batch(3)


def test_demo_levels_get_harder():
    task = DemoTask(1, seed=0)
    lengths = []
    for level in range(1, 5):
        task.set_level(level)
        lengths.append(np.mean([len(e["prompt"]) for e in task.batch(50)]))
    assert lengths == sorted(lengths)
    task.set_level(4)
    for ex in task.batch(20):  # distractor keys that share their first letters with the asked one
        q = ex["prompt"].split("?")[0][3:]
        assert q in NEAR and any(f"{n}=" in ex["prompt"] for n in NEAR[q])
    with pytest.raises(ConfigError, match="level must be an integer from 1 to 4"):
        task.set_level(5)


def test_make_task_from_config(tmp_path):
    assert isinstance(make_task(load_config(None, ["task.level=2"])), DemoTask)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = {json.dumps(str(data))}\n[reward.weights]\nexact = 1.0\n")
    cfg = load_config(toml)
    t = make_task(cfg)
    assert isinstance(t, JsonlTask) and t.batch(1)[0]["answer"] == "4"


# ---- JSONL ---------------------------------------------------------------------------------------
def _write(tmp_path, lines):
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_jsonl_loads_rows_and_streams_every_row_each_epoch(tmp_path):
    rows = [json.dumps({"prompt": f"q{i}", "answer": f"a{i}", "source": "S1"}) for i in range(5)]
    p = _write(tmp_path, rows[:2] + [""] + rows[2:])  # a blank line is skipped
    task = JsonlTask(str(p), list(DEMO_WEIGHTS), seed=0)
    assert len(task.rows) == 5
    first, second = task.batch(5), task.batch(5)
    assert sorted(e["prompt"] for e in first) == sorted(e["prompt"] for e in second) == [f"q{i}" for i in range(5)]
    assert all(e["prompt_id"] for e in first)
    again = JsonlTask(str(p), list(DEMO_WEIGHTS), seed=0)
    again.batch(3)
    state = again.state_dict()
    rest = again.batch(4)
    resumed = JsonlTask(str(p), list(DEMO_WEIGHTS), seed=0)
    resumed.load_state_dict(state)
    assert resumed.batch(4) == rest
    assert task.target({"answer": "x", "source": "S2"}) == "x [S2]"


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a", "answer": "b", "source": "S1"}', '{"prompt": "a", "answer": }'],
     r"data.jsonl line 2: not valid JSON"),
    (['{"prompt": "a", "source": "S1"}'], r"data.jsonl line 1: field 'answer' \(needed by metrics answer_f1, exact\) is missing; add it to every row, "
     r"or drop the metrics: --set reward.weights.answer_f1=0 --set reward.weights.exact=0$"),
    (['{"answer": "b", "source": "S1"}'], r"line 1: field 'prompt' \(needed by every task\) is missing"),
    (['{"prompt": "a", "answer": 4, "source": "S1"}'], r"line 1: field 'answer' must be a string, got int 4"),
    (['{"prompt": "a", "answer": "b", "source": "S1", "max_len": "12"}'], r"field 'max_len' must be an integer"),
    (['{"prompt": "a", "answer": "b", "source": "S1", "format": "("}'], r"field 'format' is not a valid regex"),
    (['["prompt"]'], r"line 1: expected a JSON object"),
    (['{"prompt": "  ", "answer": "b", "source": "S1"}'], r"line 1: field 'prompt' is empty"),
])
def test_jsonl_bad_rows_name_line_and_field(tmp_path, lines, message):
    p = _write(tmp_path, lines)
    with pytest.raises(ConfigError, match=message):
        load_rows(p, list(DEMO_WEIGHTS))


def test_jsonl_only_checks_fields_of_the_metrics_in_use(tmp_path):
    p = _write(tmp_path, ['{"prompt": "a", "answer": "b"}'])  # no source: fine without citation
    assert load_rows(p, ["exact", "answer_f1"])[0]["answer"] == "b"
    with pytest.raises(ConfigError, match="field 'source' \\(needed by metric citation\\)"):
        load_rows(p, ["exact", "citation"])
    assert load_rows(p, ["exact", "mine"], custom={"mine"})  # custom metrics read what they like


def test_jsonl_missing_or_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_rows(tmp_path / "nope.jsonl", ["exact"])
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="has no rows"):
        load_rows(tmp_path / "empty.jsonl", ["exact"])


def test_unknown_metric_is_a_config_error():
    with pytest.raises(ConfigError, match="reward.weights.bogus: no such metric"):
        build_metrics(["exact", "bogus"], {})
    fns, kinds = build_metrics(list(BUILTIN), {})
    assert kinds["answer_f1"] == "continuous" and kinds["length"] == "penalty"


# ---- a JSONL task's default metrics (issue 18) ----------------------------------------------------------------
@pytest.fixture
def one_more_metric():
    """A built-in metric added as one record (metrics.register); the registry as it was after."""
    from grpo_core.tasks import metrics
    tables = (metrics.METRICS, metrics.BUILTIN, metrics.KINDS)
    saved = [dict(table) for table in tables]
    record = metrics.Metric("shouts", lambda c, ex: float(c.isupper()), "binary",
                            (metrics.Field("volume", metrics.INTEGER, False, "optional"),), 0.5,
                            "the completion is in capitals", fed_by="volume")
    metrics.register(record)
    yield record
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)


def test_a_metric_added_as_one_record_is_a_metric_everywhere(one_more_metric, tmp_path):
    """The trainer's functions and kinds, a JSONL task's row checks and default weights, the
    "no such metric" error and the docs table all read the one record."""
    from grpo_core.tasks import jsonl, metrics
    fns, kinds = build_metrics(["shouts"], {})
    assert fns["shouts"]("HI", {}) == 1.0 and kinds == {"shouts": "binary"}
    p = _write(tmp_path, ['{"prompt": "a", "answer": "b", "volume": 3}'])
    assert jsonl.default_weights(p) == {"answer_f1": 0.4, "exact": 0.3, "shouts": 0.5}
    bad = _write(tmp_path, ['{"prompt": "a", "volume": "loud"}'])
    with pytest.raises(ConfigError, match="line 1: field 'volume' must be an integer"):
        JsonlTask(str(bad), ["shouts"])
    with pytest.raises(ConfigError, match=r"no such metric \(did you mean 'shouts'\?\).*shouts"):
        build_metrics(["shout"], {})
    assert "| `shouts` | binary | `volume` (optional) | the completion is in capitals |" in metrics.docs_table()


def test_default_weights_follow_the_rows_and_add_custom_metrics(tmp_path):
    from grpo_core.tasks.jsonl import default_weights
    p = _write(tmp_path, ['{"prompt": "a", "answer": "b", "format": "^b$"}', '{"prompt": "c", "answer": "d"}'])
    assert default_weights(p) == {"answer_f1": 0.4, "exact": 0.3, "format": 0.1}  # an optional field in one row is enough
    p = _write(tmp_path, ['{"prompt": "a"}'])
    assert default_weights(p, {"mine": "m:f"}) == {"mine": 1.0}
    with pytest.raises(ConfigError, match=r"data.jsonl: no built-in metric can score these rows \(fields found: prompt"):
        default_weights(p)


def test_a_row_missing_a_default_metric_field_is_named(tmp_path):
    """The field appears in some rows only: the metrics it feeds are the defaults, and the rows
    without it are errors by line (not a metric silently left out)."""
    p = _write(tmp_path, ['{"prompt": "a", "answer": "1"}', '{"prompt": "b"}'])
    cfg = load_config(None, ["task.name=jsonl", f"task.dataset={p}"])
    assert cfg.reward.weights == {"math_answer": 1.0}
    with pytest.raises(ConfigError, match=r"data.jsonl line 2: field 'answer' \(needed by metric math_answer\) is "
                                          r"missing; add it to every row, or drop the metric: --set reward.weights.math_answer=0"):
        make_task(cfg)


def test_math_and_exact_on_one_field_take_the_stricter_type(tmp_path):
    p = _write(tmp_path, ['{"prompt": "a", "answer": 4}'])
    assert load_rows(p, ["math_answer"])[0]["answer"] == 4
    with pytest.raises(ConfigError, match="field 'answer' must be a string, got int 4"):
        load_rows(p, ["math_answer", "exact"])
