"""TRL at scale: a real TRL GRPOTrainer (CPU, no vLLM, a tiny Llama built here) with
GRPOHealthCallback writes the same store as our trainer, agrees with TRL's own logged
numbers step by step, applies weight requests to TRL's reward_weights mid-run, and does
so across two processes (accelerate launch). Its trainer_state.json and W&B run import
back with the right ratio per step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers_dashboard import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FNS = ["has_e", "length"]
W0 = [1.0, 1.0]
W1 = {"has_e": 1.0, "length": 0.0}  # sent after step 3: from step 4 the total is has_e alone


def build_tiny_model(path: Path) -> Path:
    """The built-in char-level tokenizer and a 1-layer Llama, saved like any hub model."""
    from grpo_core.runs.config import ModelConfig
    from grpo_core.train.models import build_tiny_model as build
    from grpo_core.train.models import build_tokenizer, save_pretrained
    tok = build_tokenizer()
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    save_pretrained(build(cfg, tok, seed=0), tok, path)
    return path


# The reward functions and the run, as text: the two-process test runs the same code
# under `accelerate launch`.
RUN_SCRIPT = textwrap.dedent('''
    import json, os, sys
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from grpo_core.runs import requests
    from grpo_core.integrations.trl import GRPOHealthCallback

    def has_e(completions, **kw):  # binary: often the same for a whole group
        return [float("e" in c) for c in completions]

    def length(completions, **kw):  # continuous, but most completions hit the length cap
        return [len(c) / 8 for c in completions]

    def run(model_dir, runs, out, run_id, per_device, steps, send_at, weights, report_to="none"):
        ds = Dataset.from_list([{"prompt": f"q{i}:", "prompt_id": f"p{i}"} for i in range(256)])
        args = GRPOConfig(output_dir=os.path.join(out, "trl"), per_device_train_batch_size=per_device,
                          num_generations=4, max_completion_length=8, max_steps=steps, logging_steps=1,
                          report_to=report_to, use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3,
                          reward_weights=[1.0, 1.0], disable_tqdm=True, dataloader_num_workers=0)
        class SendWeights(TrainerCallback):  # what the dashboard does mid-run
            def on_step_end(self, args, state, ctl, **kw):
                if state.global_step == send_at and state.is_world_process_zero:
                    requests.send(os.path.join(runs, run_id), "set_weights", {"weights": weights}, source="test")

        cb = GRPOHealthCallback(run_id=run_id, root=runs)  # as TRL users add callbacks
        trainer = GRPOTrainer(model=model_dir, reward_funcs=[has_e, length], args=args, train_dataset=ds,
                              processing_class=AutoTokenizer.from_pretrained(model_dir),
                              callbacks=[cb, SendWeights()])
        trainer.train()
        rank = trainer.accelerator.process_index
        trainer.state.save_to_json(os.path.join(out, f"trainer_state_rank{rank}.json"))
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "pid": os.getpid(), "weights": trainer.reward_weights.tolist(),
                       "num_processes": trainer.accelerator.num_processes}, f)
        return trainer, cb

    if __name__ == "__main__":
        model_dir, runs, out, run_id = sys.argv[1:5]
        run(model_dir, runs, out, run_id, per_device=6, steps=4, send_at=2, weights=json.loads(sys.argv[5]))
''')


def _logged(history: list[dict]) -> dict[int, dict]:
    """TRL's per-step training logs (the final summary entry left out)."""
    return {e["step"]: e for e in history if "frac_reward_zero_std" in e}


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """One real single-process TRL run with the callback, W&B offline through TRL's own
    report_to, a weight request sent after step 3."""
    tmp = tmp_path_factory.mktemp("trl")
    model_dir = build_tiny_model(tmp / "model")
    script = tmp / "run_trl.py"
    script.write_text(RUN_SCRIPT)
    sys.path.insert(0, str(tmp))
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DIR", str(tmp))
    mp.setenv("WANDB_PROJECT", "grpo-health-test")
    mp.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp / "runs"))
    try:
        import run_trl
        trainer, cb = run_trl.run(str(model_dir), str(tmp / "runs"), str(tmp), "trl-run", per_device=12, steps=6,
                                  send_at=3, weights=W1, report_to="wandb")
        import time

        import wandb

        from grpo_core.integrations.wandb_file import wandb_file_finished
        sync_file = wandb.run.settings.sync_file
        wandb.finish()  # transformers' WandbCallback leaves the run open until the process exits
        deadline = time.monotonic() + 10  # wandb-core writes the file's end just after finish()
        while not wandb_file_finished(sync_file) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        mp.undo()
        sys.path.remove(str(tmp))
    from grpo_core.runs.store import RunStore
    store = RunStore.open(tmp / "runs" / "trl-run", readonly=True)
    # The run file wandb wrote (where: its own settings; WANDB_DIR is read once per process, so an
    # earlier test's in-process wandb may have fixed the folder).
    yield {"tmp": tmp, "store": store, "history": trainer.state.log_history, "trainer": trainer, "cb": cb,
           "model_dir": model_dir, "wandb_file": Path(sync_file)}
    store.close()


def test_store_ratio_equals_one_minus_trl_frac_every_step(trl_run):
    s, logged = trl_run["store"], _logged(trl_run["history"])
    wide = s.scalars_wide()
    assert sorted(logged) == list(range(1, 7)) == wide.index.tolist()
    fracs = [logged[k]["frac_reward_zero_std"] for k in range(1, 7)]
    assert 0 < np.mean(fracs) < 1, f"the run should mix trainable and untrainable groups, got {fracs}"
    for step, e in logged.items():
        assert wide.loc[step, "health/trainable_ratio"] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-6)
        assert wide.loc[step, "frac_reward_zero_std"] == pytest.approx(e["frac_reward_zero_std"], abs=1e-6)
        assert wide.loc[step, "trl/frac_reward_zero_std"] == pytest.approx(e["frac_reward_zero_std"], abs=1e-6)
        assert wide.loc[step, "data/step_num_groups_submitted"] == 3
    assert s.get_meta()["status"] == "finished"
    assert wide["data/cum/num_groups_submitted"].iloc[-1] == 18


def test_groups_and_rollouts_hold_every_completion_with_its_scores(trl_run):
    s, logged = trl_run["store"], _logged(trl_run["history"])
    groups, rollouts = s.groups(), s.rollouts()
    assert len(groups) == 6 * 3 and len(rollouts) == 6 * 12
    assert (rollouts.groupby(["step", "group"]).size() == 4).all()
    for step, e in logged.items():
        r = rollouts[rollouts["step"] == step]
        for fn in FNS:  # TRL's own mean of each function = the mean of the scores we stored
            assert r[fn].mean() == pytest.approx(e[f"rewards/{fn}/mean"], abs=1e-6)
        assert r["total"].mean() == pytest.approx(e["reward"], abs=1e-6)
        g = groups[groups["step"] == step]
        assert g["prompt_id"].nunique() == 3  # three prompts, one group each
        std = r.groupby("group")["total"].std(ddof=0).to_numpy()
        np.testing.assert_allclose(g["reward_std"].to_numpy(), std, atol=1e-9)
    assert rollouts["completion"].notna().all()


def test_weight_request_changes_trl_reward_weights_and_logged_rewards(trl_run):
    s, logged, trainer = trl_run["store"], _logged(trl_run["history"]), trl_run["trainer"]
    assert trainer.reward_weights.tolist() == [W1[f] for f in FNS]
    changes = s.changes()
    assert len(changes) == 1 and changes["step"].iloc[0] == 4 and changes["request"].iloc[0]["weights"] == W1
    assert s.control()["status"].tolist() == ["applied"]
    wide = s.scalars_wide()
    for step, e in logged.items():
        w = W0 if step < 4 else [W1[f] for f in FNS]
        # TRL's logged reward is computed with the weights in force: the old ones, then the new
        assert e["reward"] == pytest.approx(sum(wk * e[f"rewards/{f}/mean"] for wk, f in zip(w, FNS)), abs=1e-5)
        assert [wide.loc[step, f"reward/{f}/weight"] for f in FNS] == w
    late = [e for k, e in logged.items() if k >= 4]
    assert any(abs(e["reward"] - e["rewards/has_e/mean"] - e["rewards/length/mean"]) > 1e-3 for e in late), \
        "the weight change must visibly change TRL's logged reward"


def test_trainer_state_json_imports_with_right_ratio(trl_run, tmp_path):
    from grpo_core.integrations.importers import import_path
    from grpo_core.runs.store import RunStore
    path = trl_run["tmp"] / "trainer_state_rank0.json"
    rid = import_path("trl", path, root=tmp_path, groups_per_step=3)
    with RunStore.open(tmp_path / rid, readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
        live = trl_run["store"].scalars_wide()
    assert wide.index.tolist() == list(range(1, 7))
    np.testing.assert_allclose(wide["health/trainable_ratio"], live["health/trainable_ratio"], atol=1e-5)
    np.testing.assert_allclose(wide["data/step_num_groups_trainable"], live["data/step_num_groups_trainable"], atol=1e-5)
    np.testing.assert_allclose(wide["data/cum/num_groups_trainable"], live["data/cum/num_groups_trainable"], atol=1e-5)
    assert any(k.startswith("summary entry") for k in meta["import_report"]["skipped"])
    assert meta["lacks"] == ["groups", "rollouts"] and meta["summary"]["train_runtime"] > 0


def test_trl_wandb_run_imports_with_right_ratio(trl_run, tmp_path):
    """TRL's own W&B logging (transformers' WandbCallback, offline) read back from run-*.wandb."""
    from grpo_core.integrations.importers import import_path
    from grpo_core.runs.store import RunStore
    files = [trl_run["wandb_file"]]
    assert files[0].is_file() and files[0].name.endswith(".wandb")
    rid = import_path("wandb", files[0], root=tmp_path)
    with RunStore.open(tmp_path / rid, readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    logged = _logged(trl_run["history"])
    assert meta["config"]["wandb"]["style"] == "trl"
    # TRL's profiling timers are logged before global_step moves on: step 0 has only those
    assert wide["health/trainable_ratio"].dropna().index.tolist() == sorted(logged)
    for step, e in logged.items():
        assert wide.loc[step, "health/trainable_ratio"] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-6)
        assert wide.loc[step, "train/reward"] == pytest.approx(e["reward"], abs=1e-6)
        assert wide.loc[step, "trl/reward_std"] == pytest.approx(e["reward_std"], abs=1e-6)
    assert "train/reward_std" not in wide  # TRL's batch std is not our within-group std
    # the W&B config holds TRL's arguments: 12 completions / 4 generations = 3 groups per step
    live = trl_run["store"].scalars_wide()
    for name in ("data/step_num_groups_submitted", "data/step_num_groups_trainable", "data/cum/num_groups_trainable"):
        np.testing.assert_allclose(wide.loc[1:, name], live[name], atol=1e-5)
    assert meta["config"]["grpo"]["prompts_per_step"] == 3 and meta["config"]["reward"]["metrics"] == sorted(FNS)



def test_two_processes_one_store_groups_cover_both(tmp_path):
    """Two processes on CPU (gloo): 6 completions per process, groups of 4, so the middle
    group of every step spans both processes."""
    model_dir = build_tiny_model(tmp_path / "model")
    (tmp_path / "run_trl.py").write_text(RUN_SCRIPT)
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "GRPO_HEALTH_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "ACCELERATE_USE_CPU": "true"}
    # torchrun, which accelerate's multi-GPU launcher wraps: `accelerate launch --cpu
    # --num_processes 2` starts ONE process unless given an mpirun hostfile (accelerate 1.15,
    # commands/launch.py: launch_command -> simple_launcher). Accelerate sees the torchrun
    # environment and runs MULTI_CPU over gloo.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(tmp_path / "run_trl.py"),
           str(model_dir), str(runs), str(tmp_path), "ddp", json.dumps(W1)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    assert all(r["weights"] == [W1[f] for f in FNS] for r in ranks), "both processes must apply the request"
    from grpo_core.runs.run_index import list_runs
    from grpo_core.runs.store import RunStore
    assert list_runs(runs)["run_id"].tolist() == ["ddp"]  # one store
    history = json.loads((tmp_path / "trainer_state_rank0.json").read_text())["log_history"]
    logged = _logged(history)
    with RunStore.open(runs / "ddp", readonly=True) as s:
        meta, wide, groups, rollouts = s.get_meta(), s.scalars_wide(), s.groups(), s.rollouts()
        changes = s.changes()
    assert meta["pid"] == ranks[0]["pid"] and meta["status"] == "finished"
    assert meta["ranks"] == 2
    assert sorted(logged) == wide.index.tolist() == [1, 2, 3, 4]
    assert (groups.groupby("step").size() == 3).all() and (rollouts.groupby("step").size() == 12).all()
    assert (groups.groupby("step")["prompt_id"].nunique() == 3).all()  # no prompt counted twice
    assert changes["step"].tolist() == [3]
    for step, e in logged.items():  # TRL's numbers over both processes = ours
        assert wide.loc[step, "health/trainable_ratio"] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-6)
        r = rollouts[rollouts["step"] == step]
        for fn in FNS:
            assert r[fn].mean() == pytest.approx(e[f"rewards/{fn}/mean"], abs=1e-6)


def _trainer(model_dir, out, reward_funcs, steps=2):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    ds = Dataset.from_list([{"prompt": f"q{i}:"} for i in range(32)])
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                      max_steps=steps, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                      disable_tqdm=True)
    return GRPOTrainer(model=str(model_dir), reward_funcs=reward_funcs, args=args, train_dataset=ds)


def test_a_second_training_into_a_used_run_id_is_refused(trl_run, tmp_path):
    from grpo_core.errors import ConfigError
    from grpo_core.integrations.trl import GRPOHealthCallback
    runs = trl_run["tmp"] / "runs"

    def has_e(completions, **kw):
        return [float("e" in c) for c in completions]

    trainer = _trainer(trl_run["model_dir"], tmp_path / "out", [has_e, has_e])
    GRPOHealthCallback.attach(trainer, run_id="trl-run", root=runs)
    with pytest.raises(ConfigError, match="already has 6 steps"):
        trainer.train()
    assert trl_run["store"].get_meta()["status"] == "finished" and trl_run["store"].last_step() == 6


def test_a_crashing_reward_function_marks_the_run_failed(trl_run, tmp_path):
    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs.store import RunStore
    calls = []

    def flaky(completions, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise ZeroDivisionError("reward server down")
        return [0.0] * len(completions)

    trainer = _trainer(trl_run["model_dir"], tmp_path / "out", [flaky], steps=3)
    GRPOHealthCallback.attach(trainer, run_id="crash", root=tmp_path / "runs")
    with pytest.raises(ZeroDivisionError):
        trainer.train()
    with RunStore.open(tmp_path / "runs" / "crash", readonly=True) as s:
        meta = s.get_meta()
        assert s.last_step() == 1 and s.scalars_wide().loc[1, "health/trainable_ratio"] == 0
    assert meta["status"] == "failed" and "ZeroDivisionError: reward server down" in meta["error"]


def test_docs_snippets_run(tmp_path):
    """docs/integrations.md's Python snippets, as written (the TRL one on the built-in model)."""
    import re
    text = (REPO / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRPO_HEALTH_RUNS_DIR": str(tmp_path / "runs"), "WANDB_MODE": "disabled"}
    # The snippets name the fixture by its path in the repo, as a reader would run them from there.
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    (tmp_path / "tests" / "fixtures" / "trl").symlink_to(REPO / "tests" / "fixtures" / "trl")
    for i, code in enumerate(blocks):
        (tmp_path / f"snippet{i}.py").write_text(code)
        proc = subprocess.run([sys.executable, f"snippet{i}.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert "health/trainable_ratio" in proc.stdout and "groups per step unknown" in proc.stdout
    from grpo_core.runs.store import RunStore
    with RunStore.open(tmp_path / "runs" / "trl-demo", readonly=True) as s:
        assert s.get_meta()["status"] == "finished" and s.last_step() == 5
        assert len(s.groups()) == 5 * 2 and len(s.rollouts()) == 5 * 8


def test_control_requests_threshold_pause_resume_difficulty_stop(trl_run, tmp_path):
    """Every request kind on a TRL run: applied at a step boundary, or rejected with a reason."""
    import threading
    import time

    from transformers import TrainerCallback

    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs import requests
    from grpo_core.runs.store import RunStore
    run = tmp_path / "runs" / "ctl"

    def length(completions, **kw):
        return [len(c) / 8 for c in completions]

    trainer = _trainer(trl_run["model_dir"], tmp_path / "out", [length], steps=8)
    GRPOHealthCallback.attach(trainer, run_id="ctl", root=tmp_path / "runs")
    statuses = []

    def resume_once_paused():
        with RunStore.open(run, readonly=True) as s:
            deadline = time.monotonic() + 60
            while s.get_meta()["status"] != "paused" and time.monotonic() < deadline:
                time.sleep(0.05)
            statuses.append(s.get_meta()["status"])  # what the dashboard shows meanwhile
        time.sleep(0.5)
        requests.send(run, "resume", {}, source="test")

    class Sender(TrainerCallback):  # requests arriving while a step runs, as from the dashboard
        def on_step_begin(self, args, state, ctl, **kw):
            if state.global_step == 1:  # during step 2
                requests.send(run, "set_threshold", {"min_group_std": 0.5}, source="test")
                requests.send(run, "set_difficulty", {"level": 2}, source="test")
                requests.send(run, "pause", {}, source="test")
                threading.Thread(target=resume_once_paused).start()
            if state.global_step == 3:  # during step 4: claimed together at its end
                for kind in ("pause", "resume", "stop"):
                    requests.send(run, kind, {}, source="test")

    trainer.add_callback(Sender())
    trainer.train()
    with RunStore.open(run, readonly=True) as s:
        ctl, wide = s.control(), s.scalars_wide()
    assert statuses == ["paused"]
    assert ctl[["kind", "status", "applied_step"]].values.tolist() == [
        ["set_threshold", "applied", 3], ["set_difficulty", "rejected", 3], ["pause", "applied", 3],
        ["resume", "applied", 3], ["pause", "applied", 5], ["resume", "applied", 5], ["stop", "applied", 4]]
    assert "fixed dataset" in ctl["message"].iloc[1]
    assert wide.index.tolist() == [1, 2, 3, 4]  # stopped right after step 4, of 8
    assert wide["health/min_group_std"].tolist() == [0.0, 0.0, 0.5, 0.5]


def test_trls_edge_cases_give_trls_ratio_every_step(trl_run, tmp_path):
    """A real 3-step TRL run whose reward functions produce the three cases where float64 sums
    and the population std disagree with TRL: a completion every function returns None for,
    permuted partial credits (0.1 + 0.2 + 0.4 vs 0.1 + 0.4 + 0.2: equal in exact arithmetic,
    an ulp apart in float32, so TRL trains the group), and a 5e-8 shaping term on 1.0 (lost in
    TRL's float32 sum: TRL does not train it). Each step holds one group of each case and a
    plain one. The store's ratio must be 1 - TRL's frac_reward_zero_std at every step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs.store import RunStore
    G = 4
    credits = {"none": [(None, None, None), (1.0, 0.0, 0.0), (1.0, 0.0, 0.0), (1.0, 0.0, 0.0)],
               "permuted": [(0.1, 0.2, 0.4), (0.1, 0.4, 0.2)] * 2,
               "shaping": [(1.0, 0.0, 0.0), (1.0, 5e-8, 0.0)] * 2,
               "plain": [(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.5, 0.0, 0.0), (0.0, 0.0, 0.0)]}

    def part(k):
        def fn(completions, case, **kw):  # rows come in groups of G, one prompt each (TRL's order)
            return [credits[c][i % G][k] for i, c in enumerate(case)]
        fn.__name__ = f"part{k}"
        return fn

    ds = Dataset.from_list([{"prompt": f"q{i}:", "prompt_id": c, "case": c} for i, c in enumerate(credits)])
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(credits) * G,
                      num_generations=G, max_completion_length=8, max_steps=3, logging_steps=1, report_to="none",
                      use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=str(trl_run["model_dir"]), reward_funcs=[part(0), part(1), part(2)], args=args,
                          train_dataset=ds)
    GRPOHealthCallback.attach(trainer, run_id="edges", root=tmp_path / "runs")
    trainer.train()
    logged = _logged(trainer.state.log_history)
    with RunStore.open(tmp_path / "runs" / "edges", readonly=True) as s:
        wide, groups, rollouts = s.scalars_wide(), s.groups(), s.rollouts()
    assert sorted(logged) == wide.index.tolist() == [1, 2, 3]
    for step, e in logged.items():
        assert e["frac_reward_zero_std"] == 0.5  # none and shaping are zero-std for TRL
        assert wide.loc[step, "health/trainable_ratio"] == 1 - e["frac_reward_zero_std"]
        assert wide.loc[step, "train/reward"] == pytest.approx(e["reward"], abs=1e-6)
        assert wide.loc[step, "health/float_noise_groups"] == 1  # the permuted credits
    g = groups.set_index(["step", "prompt_id"])["trainable"]
    assert all(g[(step, "permuted")] and not g[(step, "none")] and not g[(step, "shaping")] for step in logged)
    unscorable = rollouts[rollouts["total"].isna()]
    assert len(unscorable) == 3 and unscorable["error"].str.contains("returned None").all()
