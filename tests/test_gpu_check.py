"""bench/gpu_check.py runs here too: `--smoke` is the same script (the trainer's loop, both
variants, the memory model's estimate, the parameters-moved check; the sampling-only variants,
generate with a static cache and the vLLM engine; the same run on 1 rank and on 2 under
torchrun) on a tiny Qwen2 on CPU, so the prepared GPU check is known to work before a GPU is
lent for it."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_smoke_run_writes_sane_figures_for_both_variants(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_HEALTH_TORCH_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu (smoke)" and res["model"]["vocab_size"] > 2048  # past the tokenizer's vocabulary
    full, lora, static, vllm, ranks = res["variants"]
    assert [v["variant"] for v in res["variants"]] == ["full", "lora", "generate-static", "vllm", "ranks"]
    batch = res["batch"]
    for v in (full, lora):
        assert v["status"] == "finished" and v["steps_timed"] == 2
        assert v["rows_per_step"] == batch["prompts"] * batch["group_size"]
        assert 0 < v["completion_tokens_per_step"] <= v["rows_per_step"] * batch["max_new_tokens"]
        assert v["train_tokens_per_step"] > v["completion_tokens_per_step"]
        assert v["generation_tokens_per_s"] > 0 and v["training_tokens_per_s"] > 0
        assert v["weight_dtype"] == "torch.float32" and v["max_memory_allocated_gib"] is None  # no CUDA here
        assert v["params_moved_fraction"] > 0.9 and v["tensors_unmoved"] == 0
        mem = v["memory_model_gib"]
        assert mem["peak"] >= mem["train_peak"] > mem["weights"] > 0
    assert full["params_trained"] == full["params"]
    assert 0 < lora["params_trained"] < 0.1 * lora["params"] and lora["memory_model_gib"]["optimizer"] < \
        0.1 * full["memory_model_gib"]["optimizer"]
    for v in (static, vllm) if importlib.util.find_spec("vllm") else (static,):
        assert v["status"] == "finished" and v["steps_timed"] == 2
        assert v["rows_per_step"] == batch["prompts"] * batch["group_size"]
        assert 0 < v["completion_tokens_per_step"] <= v["rows_per_step"] * batch["max_new_tokens"]
        assert v["generation_tokens_per_s"] > 0
    if importlib.util.find_spec("vllm") is None:
        assert vllm == {"variant": "vllm", "status": "skipped: vllm not installed"}
    else:  # the engine follows the trainer's weights only through the sync
        assert vllm["logprob_gap_synced"] < 1e-4 < vllm["logprob_gap_unsynced"] and vllm["sync_s_median"] > 0
    # The same run as a 1-rank CLI job and a 2-rank torchrun job: both finish, train the same groups.
    assert ranks["status"] == "finished", ranks["status"]
    for arm in (ranks["rank_1"], ranks["rank_2"]):
        assert arm["status"] == "finished" and arm["steps"] == 3 and arm["wall_steps_per_s"] > 0
        assert arm["submitted"] == [batch["prompts"]] * 3
    assert ranks["same_trainable_groups"] and sum(ranks["rank_1"]["trainable"]) > 0
