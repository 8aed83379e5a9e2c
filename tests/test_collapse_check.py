"""The template-collapse check (train/collapse_check.py) on the built-in model: a policy that
echoes its prompt is retrieved, completions that ignore their prompt sit at chance (1/N); in
the real trainer the scalars land every health.collapse_every steps, the chart draws them, and
the alert fires on a run whose policy ignores its prompt and not on one that echoes it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from grpo_core.analysis import charts, health
from grpo_core.errors import ConfigError
from grpo_core.runs import names
from grpo_core.runs.config import ModelConfig
from grpo_core.runs.store import EV_ALERT, RunStore
from grpo_core.tasks.demo import DemoTask
from grpo_core.tasks.loading import load_config
from grpo_core.train import collapse_check, grpo, models, native_sampling
from grpo_core.train.trainer import Trainer

SIZES = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TINY = [f"model.{k}={v}" for k, v in SIZES.items()] + [
    "model.warm_start_steps=0", "grpo.prompts_per_step=4", "grpo.group_size=2", "grpo.max_new_tokens=8",
    "log.progress=false", "log.checkpoint_every=0", "grpo.steps=5"]
N = 8


def asked(prompt: str) -> str:
    """The demo prompt's question key: 'Q: ice? sun=hot [S1] ice=red [S2] A:' -> 'ice'."""
    return prompt.split("?")[0].removeprefix("Q: ")


@pytest.fixture(scope="module")
def echo():
    """The built-in model (architecture and character tokenizer) trained to answer a demo prompt with
    its question key: a policy whose completions depend on the prompt."""
    torch.manual_seed(0)
    tok = models.build_tokenizer()
    model = models.build_tiny_model(ModelConfig(**SIZES), tok, seed=0)
    task, opt = DemoTask(level=1, seed=0), torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        exs = task.batch(32)
        batch = models.sft_batch(tok, [e["prompt"] for e in exs], [" " + asked(e["prompt"]) for e in exs], "cpu")
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5  # it learned the echo
    return model.eval(), tok


def distinct_prompts(n: int = N) -> list[dict]:
    """n level-1 demo prompts with n different question keys (two prompts asking the same key
    would be told apart by no policy)."""
    out, seen = [], set()
    for e in DemoTask(level=1, seed=7).batch(200):
        if asked(e["prompt"]) not in seen:
            seen.add(asked(e["prompt"]))
            out.append(e)
    return out[:n]


def with_completions(roll: native_sampling.Rollouts, completions: native_sampling.Rollouts):
    """roll's prompts, followed by the completions of `completions` (same row count)."""
    lp, cp = roll.prompt_len, completions.prompt_len
    ids = torch.cat([roll.input_ids[:, :lp], completions.input_ids[:, cp:]], 1)
    attn = torch.cat([roll.attention_mask[:, :lp], completions.attention_mask[:, cp:]], 1)
    return native_sampling.Rollouts(ids, attn, lp, completions.texts, roll.examples, roll.num_prompts,
                                    roll.group_size, roll.prompts)


def check(model, roll, per: int = 3) -> dict:
    batch = collapse_check.pairs(roll, collapse_check.sample_rows(roll, N))
    return collapse_check.retrieval(collapse_check.pair_scores(model, batch, prompts_per_forward=per))


def test_each_score_is_the_completions_log_likelihood_under_that_prompt(echo):
    model, tok = echo
    roll = native_sampling.rollout(model, tok, distinct_prompts(4), 2, max_new_tokens=6, seeds=[1, 2, 3, 4])
    rows = collapse_check.sample_rows(roll, 4)
    assert rows == [0, 2, 4, 6]  # the first completion of each group
    scores = collapse_check.pair_scores(model, collapse_check.pairs(roll, rows), prompts_per_forward=3)
    lp = roll.prompt_len
    for i, ri in enumerate(rows):
        for j, rj in enumerate(rows):  # prompt j then completion i, one row, no shared forward
            ids = torch.cat([roll.input_ids[rj, :lp], roll.input_ids[ri, lp:]])[None]
            attn = torch.cat([roll.attention_mask[rj, :lp], roll.attention_mask[ri, lp:]])[None]
            with torch.no_grad():
                logp, _ = grpo.token_logprobs(model, ids, attn, lp)
            assert scores[i, j] == pytest.approx(float(logp.sum()), abs=1e-4)


def test_an_echoing_policy_is_retrieved_and_a_template_sits_at_chance(echo):
    model, tok = echo
    prompts = distinct_prompts()
    own = native_sampling.rollout(model, tok, prompts, 2, max_new_tokens=8, seeds=list(range(N)))
    dependent = check(model, own)
    assert dependent[names.COLLAPSE_RETRIEVAL] >= 0.75 and dependent[names.COLLAPSE_CHANCE] == 1 / N
    assert dependent[names.COLLAPSE_MI] > 1.0  # nats, of at most log 8 = 2.08

    # Template collapse: every completion sampled from one prompt, whatever prompt it is logged under.
    template = native_sampling.rollout(model, tok, [prompts[0]] * N, 2, max_new_tokens=8, seeds=list(range(N)))
    collapsed = [check(model, with_completions(own, template))]
    # The same text for every prompt: one prompt scores all best (or all tie): exactly chance.
    same = native_sampling.rollout(model, tok, [prompts[3]] * N, 2, max_new_tokens=8, seeds=[5] * N)
    collapsed.append(check(model, with_completions(own, same)))
    assert collapsed[1][names.COLLAPSE_RETRIEVAL] == pytest.approx(1 / N)
    assert collapsed[1][names.COLLAPSE_SKILL] == pytest.approx(0.0)
    for c in collapsed:
        assert c[names.COLLAPSE_RETRIEVAL] <= 2 / N and c[names.COLLAPSE_MI] < 0.3
        assert c[names.COLLAPSE_SKILL] < dependent[names.COLLAPSE_SKILL] - 0.5


def test_ties_share_the_credit_and_the_bound_is_capped_by_log_n():
    assert collapse_check.retrieval(np.zeros((4, 4)))[names.COLLAPSE_RETRIEVAL] == pytest.approx(0.25)
    sure = collapse_check.retrieval(np.where(np.eye(5, dtype=bool), 0.0, -50.0))
    assert sure[names.COLLAPSE_RETRIEVAL] == 1.0 and sure[names.COLLAPSE_SKILL] == 1.0
    assert sure[names.COLLAPSE_MI] == pytest.approx(np.log(5), abs=1e-9)
    tied = np.array([[0.0, 0.0, -9.0], [-9.0, 0.0, -9.0], [-9.0, 0.0, -9.0]])  # row 0 tied between 2 prompts
    assert collapse_check.retrieval(tied)[names.COLLAPSE_RETRIEVAL] == pytest.approx((0.5 + 1 + 0) / 3)


def test_the_sample_takes_distinct_prompts_and_groups_of_any_size():
    ids = torch.zeros((7, 3), dtype=torch.long)
    roll = native_sampling.Rollouts(ids, torch.ones_like(ids), 1, [""] * 7, [{}] * 7, 5, 3, ["a", "z", "b", "a", "c"],
                                    sizes=[2, 0, 3, 1, 1])
    assert collapse_check.sample_rows(roll, 8) == [0, 2, 6]  # "z" has no rows; "a" twice: its second group left out
    assert collapse_check.sample_rows(roll, 2) == [0, 2]


def run(tmp_path, run_id, extra=(), prepare=None):
    cfg = load_config(None, TINY + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    if prepare is not None:
        prepare(tr)
    assert tr.run() == "finished"
    return tr, store


def test_the_trainer_stores_the_check_every_collapse_every_steps_and_not_when_off(tmp_path):
    _, store = run(tmp_path, "on", ["health.collapse_every=2"])
    wide = store.scalars_wide()
    for name in (names.COLLAPSE_RETRIEVAL, names.COLLAPSE_CHANCE, names.COLLAPSE_SKILL, names.COLLAPSE_MI,
                 names.TIME_COLLAPSE):
        assert wide[name].dropna().index.tolist() == [2, 4], name
    prompts = store.groups()  # the demo can draw one prompt twice in a step: N counts distinct ones
    distinct = prompts[prompts["step"].isin([2, 4])].groupby("step")["prompt_id"].nunique()
    assert wide[names.COLLAPSE_CHANCE].dropna().tolist() == pytest.approx((1 / distinct).tolist())
    assert wide[names.COLLAPSE_RETRIEVAL].dropna().between(0, 1).all()
    fig = charts.collapse_chart(wide)
    assert fig.data[0].name == "retrieval accuracy" and list(fig.data[0].x) == [2, 4]

    _, plain = run(tmp_path, "off", ["health.collapse_every=0"])
    assert names.COLLAPSE_RETRIEVAL not in plain.scalars_wide().columns
    assert charts.collapse_chart(plain.scalars_wide()) is None
    train = [names.REWARD, names.TRAINABLE_RATIO, names.LOSS_POLICY]  # the check never shifts the training stream
    assert np.allclose(wide[train].to_numpy(), plain.scalars_wide()[train].to_numpy(), equal_nan=True)


def ignore_the_prompt(tr):
    """Every token's embedding 0 and frozen (the tied head with it): the logits are the same at every
    position whatever the prompt, so the policy's completions no longer depend on it."""
    emb = tr.model.get_input_embeddings().weight
    with torch.no_grad():
        emb.zero_()
    emb.requires_grad_(False)


def test_the_alert_fires_on_a_run_that_ignores_its_prompt_and_not_on_one_that_echoes_it(tmp_path, echo):
    every = ["health.collapse_every=2", "grpo.prompts_per_step=6", "grpo.steps=6"]
    _, collapsed = run(tmp_path, "collapsed", every, prepare=ignore_the_prompt)
    wide = collapsed.scalars_wide()
    assert wide[names.COLLAPSE_SKILL].dropna().abs().max() < 1e-9  # every check exactly at chance
    alerts = [e for e in collapsed.events(kinds=[EV_ALERT])["payload"] if e["kind"] == "template_collapse"]
    assert len(alerts) == 1 and alerts[0]["step"] == 2  # raised at the first check, one episode
    assert "template collapse" in alerts[0]["message"] and "grpo.beta" in alerts[0]["message"]
    h = load_config(None, TINY).health
    assert "template_collapse" in {a.kind for a in health.alerts(wide, h)}  # the pages' view of the store

    folder = tmp_path / "echo-model"
    models.save_pretrained(*echo, folder)
    _, echoing = run(tmp_path, "echoing", every + [f"model.path={folder}", "task.level=1"])
    wide = echoing.scalars_wide()
    assert wide[names.COLLAPSE_SKILL].dropna().mean() > 0.5
    assert "template_collapse" not in {e["kind"] for e in echoing.events(kinds=[EV_ALERT])["payload"]}
    assert "template_collapse" not in {a.kind for a in health.alerts(wide, h)}


def test_bad_knobs_are_one_line_each():
    with pytest.raises(ConfigError, match=r"health.collapse_prompts must be >= 2"):
        load_config(None, ["health.collapse_prompts=1"])
    with pytest.raises(ConfigError, match=r"health.collapse_every must be >= 0 \(0 = off\)"):
        load_config(None, ["health.collapse_every=-1"])
    with pytest.raises(ConfigError, match=r"health.collapse_min_skill must be in \[0, 1\]"):
        load_config(None, ["health.collapse_min_skill=2"])


def test_the_chart_is_on_the_live_page_list_with_its_help(monkeypatch):
    monkeypatch.setattr(charts, "VALIDATE", True)  # plotly's validators check every property
    wide = pd.DataFrame({names.COLLAPSE_RETRIEVAL: [np.nan, 0.9, np.nan, 0.2],
                         names.COLLAPSE_CHANCE: [np.nan, 0.125, np.nan, 0.25]}, index=pd.Index([1, 2, 3, 4], name="step"))
    figs = dict(charts.live_charts(wide, [], None))
    chance = figs["collapse"].data[1]
    assert list(chance.y) == [0.125, 0.25] and list(chance.x) == [2, 4] and chance.line.dash == "dash"
    assert "collapse" in charts.CHART_HELP
