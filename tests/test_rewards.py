"""Built-in metrics on hand cases; the composite reward's totals, weights and scoring errors."""
import math

import numpy as np
import pytest

from grpo_core.errors import ConfigError
from grpo_core.tasks import metrics, rewards

EX = {"answer": "Paris", "source": "S2"}
DEMO = {m: metrics.BUILTIN[m] for m in ("answer_f1", "exact", "citation", "format", "length")}  # the demo's five


@pytest.mark.parametrize("completion,example,want", [
    ("Paris [S2]", EX, 1.0),  # the citation is not part of the answer
    ("paris", EX, 1.0),
    ("the city of Paris", EX, 0.4),  # P = 1/4, R = 1 -> 2PR/(P+R) = 0.4
    ("Lyon [S2]", EX, 0.0),
    ("", EX, 0.0),
    ("", {"answer": ""}, 1.0),
    ("new york city", {"answer": "New York"}, 0.8),  # P = 2/3, R = 1
    ("york new york", {"answer": "new york"}, 0.8),  # counts clipped: common = 2, P = 2/3
])
def test_token_f1(completion, example, want):
    assert rewards.token_f1(completion, example) == pytest.approx(want)


@pytest.mark.parametrize("completion,want", [
    ("  paris [S2] ", 1.0), ("PARIS", 1.0), ("Paris France", 0.0), ("Pari", 0.0), ("[S2]", 0.0)])
def test_exact_match(completion, want):
    assert rewards.exact_match(completion, EX) == want


@pytest.mark.parametrize("completion,want", [
    ("Paris [S2]", 1.0), ("Paris [S3]", 0.0), ("Paris [S2] [S3]", 0.0), ("Paris", 0.0), ("Paris [2]", 0.0)])
def test_citation(completion, want):
    assert rewards.citation(completion, EX) == want


def test_format_check_default_and_custom():
    assert rewards.format_check("Paris [S2]", EX) == 1.0
    assert rewards.format_check("New York [S12]  ", EX) == 1.0
    assert rewards.format_check("Paris", EX) == 0.0
    assert rewards.format_check("Paris [S2] because", EX) == 0.0
    assert rewards.format_check("ANSWER: 42", {"format": r"ANSWER: \d+"}) == 1.0
    assert rewards.format_check("ANSWER: x", {"format": r"ANSWER: \d+"}) == 0.0


def test_length_penalty_is_graduated():
    assert rewards.length_penalty("Paris [S2]", EX) == 0.0  # 10 chars <= 12
    assert rewards.length_penalty("x" * 12, EX) == 0.0
    assert rewards.length_penalty("x" * 15, EX) == pytest.approx(-0.3)
    assert rewards.length_penalty("x" * 40, EX) == -1.0  # capped
    assert rewards.length_penalty("  " + "x" * 12 + "  ", EX) == 0.0  # surrounding space is free
    assert rewards.length_penalty("x" * 7, {"max_len": 5}) == pytest.approx(-0.2)
    assert rewards.length_penalty("x" * 14, EX) < rewards.length_penalty("x" * 13, EX) < 0


@pytest.mark.parametrize("completion,answer,want", [
    ("so the answer is \\boxed{\\frac{3}{4}}", 0.75, 1.0),
    ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
    ("The total is 1,000.", "1000", 1.0),
    ("The total is 1,000.", 1000.0, 1.0),
    ("2 + 3 = 5", 5, 1.0),  # the last number
    ("5 apples, then 2 more: 7", "7", 1.0),
    ("5 apples, then 2 more: 7", "5", 0.0),
    ("work...\n#### 42\n", "Natalia sold 48/2 = 24 clips.\n#### 42", 1.0),  # GSM8K on both sides
    ("\\boxed{4} but then 5", "4", 1.0),  # a boxed answer wins over later numbers
    ("\\boxed{x^{2}+1}", "x^{2} + 1", 1.0),  # nested braces, compared as text
    ("\\boxed{x+2}", "x + 1", 0.0),
    ("-7", "-7.0", 1.0),
    ("50%", "50", 1.0),
    ("no number here", "3", 0.0),
    ("", "3", 0.0),
    ("3", "three", 0.0),
])
def test_math_answer_is_a_final_number_or_boxed_match(completion, answer, want):
    assert rewards.math_answer(completion, {"answer": answer}) == want


def test_math_answer_parts():
    assert rewards.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert rewards.last_boxed("\\boxed{unclosed") is None and rewards.last_boxed("none") is None
    assert rewards.as_number("1,234.5") == rewards.as_number(1234.5)
    assert rewards.as_number("1,23") is None and rewards.as_number("abc") is None and rewards.as_number(True) is None
    assert rewards.as_number("\\frac{6}{8}") == rewards.as_number("0.75") and rewards.as_number("1/0") is None


SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}}


@pytest.mark.parametrize("completion,example,want", [
    ('{"a": 1}', {}, 1.0),
    ("  [1, 2, 3]\n", {}, 1.0),
    ('```json\n{"a": 1}\n```', {}, 1.0),  # one code fence is allowed
    ("{a: 1}", {}, 0.0),
    ('Here it is: {"a": 1}', {}, 0.0),  # prose around it is not JSON
    ("", {}, 0.0),
    ('{"name": "Ada", "age": 36}', {"schema": SCHEMA}, 1.0),
    ('{"name": "Ada", "age": -1}', {"schema": SCHEMA}, 0.0),
    ('{"name": "Ada"}', {"schema": SCHEMA}, 0.0),
    ("not json", {"schema": SCHEMA}, 0.0),
])
def test_json_valid_and_schema(completion, example, want):
    assert rewards.json_valid(completion, example) == want


def test_token_length_penalty_is_graduated():
    assert rewards.count_tokens("Hello, world! 42 apples.") == 7
    assert rewards.token_length_penalty("a " * 5, {"max_tokens": 5}) == 0.0
    assert rewards.token_length_penalty("a " * 6, {"max_tokens": 5}) == pytest.approx(-0.2)
    assert rewards.token_length_penalty("a " * 9, {"max_tokens": 5}) == pytest.approx(-0.8)
    assert rewards.token_length_penalty("a " * 50, {"max_tokens": 5}) == -1.0  # capped
    assert rewards.token_length_penalty("word " * rewards.DEFAULT_MAX_TOKENS, {}) == 0.0
    assert rewards.token_length_penalty("word " * (rewards.DEFAULT_MAX_TOKENS + 64), {}) == pytest.approx(-0.25)


def test_every_builtin_is_one_complete_record():
    assert set(metrics.BUILTIN) == set(metrics.KINDS) == set(metrics.METRICS)
    assert set(metrics.KINDS.values()) <= {"binary", "continuous", "penalty"}  # what pilot/autopilot read
    assert [m for m, k in metrics.KINDS.items() if k == "binary"] == ["exact", "citation", "format", "math_answer",
                                                                        "json_valid"]
    assert metrics.KINDS["token_length"] == metrics.KINDS["length"] == metrics.KINDS["repetition"] == "penalty"
    for name, record in metrics.METRICS.items():
        v = record.fn("Paris [S2]", EX)
        assert isinstance(v, float) and math.isfinite(v), name
        assert record.weight > 0 and record.help and record.fields, name
        assert record.fed_by in ("", *(f.name for f in record.fields)), name  # it is fed by a field it reads


@pytest.mark.parametrize("completion, want", [
    ("the cat sat on the mat", 0.0),  # every 3-gram new
    ("a b c a b c", -0.25),  # 4 trigrams, 3 distinct: one repeats
    ("go go go go go", -2 / 3),  # 3 trigrams, 1 distinct
    ("too short", 0.0),  # fewer words than n: nothing to repeat
    ("Go go GO", -0.5),  # case ignored: 2 bigrams at n = 2, 1 distinct
])
def test_repetition_penalty_is_the_share_of_repeated_ngrams(completion, want):
    example = {"ngram_size": 2} if completion == "Go go GO" else {}
    assert rewards.repetition_penalty(completion, example) == pytest.approx(want)


def test_composite_totals_are_raw_at_weights():
    weights = {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2, "format": 0.1, "length": 0.5}
    comp = rewards.CompositeReward(DEMO, weights)
    completions = ["Paris [S2]", "paris", "the city of Paris [S3]", "Lyon", "Paris [S2] is the answer here"]
    scored = comp.score(completions, [EX] * len(completions))
    assert scored.raw.shape == (5, 5) and scored.num_errors == 0
    w = np.array([weights[n] for n in comp.names])
    assert scored.totals == pytest.approx(scored.raw @ w)
    # each column is the metric itself
    for j, name in enumerate(comp.names):
        assert scored.raw[:, j].tolist() == [metrics.BUILTIN[name](c, EX) for c in completions]
    assert scored.totals[0] == pytest.approx(0.4 + 0.3 + 0.2 + 0.1)
    # totals under other weights without changing the composite
    assert comp.totals(scored.raw, {"exact": 1.0}) == pytest.approx(scored.raw[:, comp.names.index("exact")])


def test_set_weights_validation_and_unnamed_metrics_get_zero():
    comp = rewards.CompositeReward(DEMO, {"exact": 1.0})
    assert comp.weights == {"answer_f1": 0.0, "exact": 1.0, "citation": 0.0, "format": 0.0, "length": 0.0}
    new = comp.set_weights({"answer_f1": 0.5, "exact": 0.5})
    assert new["answer_f1"] == 0.5 and comp.w.sum() == 1.0
    for bad, msg in [({"exact": math.nan}, "reward.weights.exact must be finite"),
                     ({"exact": -1.0}, "reward.weights.exact must be >= 0"),
                     ({"exact": 0.0, "format": 0.0}, "all zero"),
                     ({"exakt": 1.0}, "unknown metric \\(did you mean 'exact'\\?\\)"),
                     ({}, "at least one metric")]:
        with pytest.raises(ConfigError, match=msg):
            comp.set_weights(bad)
        assert comp.weights["answer_f1"] == 0.5  # a rejected change leaves the weights as they were
    with pytest.raises(ConfigError, match="at least one metric"):
        rewards.CompositeReward({}, {"exact": 1.0})


def test_bad_metric_outputs_are_that_rollouts_error():
    def picky(completion, example):
        if completion == "boom":
            raise RuntimeError("parser died")
        return {"nan": math.nan, "inf": math.inf, "str": "0.5"}.get(completion, 1.0)

    comp = rewards.CompositeReward({"exact": rewards.exact_match, "picky": picky}, {"exact": 1.0, "picky": 0.5})
    completions = ["Paris", "boom", "nan", "inf", "str", "ok"]
    scored = comp.score(completions, [EX] * 6)
    assert scored.num_errors == 4
    assert scored.errors[0] is None and scored.errors[5] is None
    assert scored.errors[1].startswith("picky: RuntimeError: parser died")
    assert "returned nan" in scored.errors[2] and "returned inf" in scored.errors[3]
    assert "returned str" in scored.errors[4] and "expected a number" in scored.errors[4]
    assert scored.raw[1:5, 1].tolist() == [0.0] * 4  # a failed metric scores 0 ...
    assert scored.raw[:, 0].tolist() == [1.0, 0, 0, 0, 0, 0]  # ... and the other metric is untouched
    assert scored.totals.tolist() == pytest.approx([1.5, 0, 0, 0, 0, 0.5])
    assert np.isfinite(scored.totals).all()


def test_two_failing_metrics_both_recorded():
    def bad_a(c, e):
        raise ValueError("a broke")

    def bad_b(c, e):
        return None

    comp = rewards.CompositeReward({"a": bad_a, "b": bad_b, "ok": lambda c, e: True}, {"a": 1, "b": 1, "ok": 1})
    scored = comp.score(["x"], [{}])
    assert "a: ValueError: a broke" in scored.errors[0] and "b: TypeError" in scored.errors[0]
    assert scored.raw.tolist() == [[0.0, 0.0, 1.0]]


def test_load_metric():
    assert rewards.load_metric("math:sqrt")(4) == 2.0
    assert rewards.load_metric("grpo_core.tasks.rewards:token_f1") is rewards.token_f1
    for bad, msg in [("math.sqrt", "must be 'module:function'"), ("no_such_mod:f", "cannot be loaded"),
                     ("math:nothing", "cannot be loaded"), ("math:pi", "not callable")]:
        with pytest.raises(ConfigError, match=msg):
            rewards.load_metric(bad)
