"""`datasets` data as a task source: folders Dataset.save_to_disk writes, parquet files and Hub-style
folders of them, JSON arrays, all written here with the real datasets package, with TRL's
column names (`prompt` a string or chat messages, other columns for the metrics)."""
from __future__ import annotations

import json
import sys

import datasets
import pytest

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.runs.store import RunStore
from grpo_core.tasks.jsonl import JsonlTask, default_weights, load_rows

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a} for a in range(4) for b in range(3)]
CHAT = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2="}], "answer": "4"},
        {"prompt": [{"role": "user", "content": "1+5="}], "answer": "6"}]


def test_a_save_to_disk_folder_is_a_task(tmp_path):
    folder = tmp_path / "sums"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder))
    task = JsonlTask(str(folder), ["math_answer"], seed=0)
    assert [{k: r[k] for k in ("prompt", "answer", "level")} for r in task.rows] == ROWS
    assert all(r["prompt_id"] for r in task.rows) and len(task.batch(5)) == 5
    assert default_weights(folder) == {"math_answer": 1.0}  # every answer a number, as for a JSONL file
    same = tmp_path / "again"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(same))
    assert JsonlTask(str(same), ["math_answer"]).cache_key() == task.cache_key()  # keyed by content


def test_chat_message_prompts_load_as_trl_writes_them(tmp_path):
    folder = tmp_path / "chat"
    datasets.Dataset.from_list(CHAT).save_to_disk(str(folder))
    rows = load_rows(folder, ["exact"])
    assert [r["prompt"] for r in rows] == [c["prompt"] for c in CHAT]


def test_a_dataset_dict_gives_its_train_split(tmp_path):
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:5]),
                          "test": datasets.Dataset.from_list(ROWS[5:])}).save_to_disk(str(folder))
    assert [r["prompt"] for r in load_rows(folder, ["exact"])] == [r["prompt"] for r in ROWS[:5]]
    assert len(load_rows(folder / "test", ["exact"])) == len(ROWS) - 5  # a split's own folder
    other = tmp_path / "no-train"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS[:2]),
                          "validation": datasets.Dataset.from_list(ROWS[2:4])}).save_to_disk(str(other))
    with pytest.raises(ConfigError, match=r"has the splits test, validation and no 'train': name the split's "
                                          r"folder or file instead \(e\.g\. .*no-train/test\)"):
        load_rows(other, ["exact"])


def test_parquet_files_and_a_hub_style_folder(tmp_path):
    single = tmp_path / "sums.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(single))
    assert [r["answer"] for r in load_rows(single, ["exact"])] == [r["answer"] for r in ROWS]
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    datasets.Dataset.from_list(ROWS[:7]).to_parquet(str(hub / "data" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[7:]).to_parquet(str(hub / "data" / "test-00000-of-00001.parquet"))
    assert [r["prompt"] for r in load_rows(hub, ["exact"])] == [r["prompt"] for r in ROWS[:7]]


def test_a_json_array_file(tmp_path):
    p = tmp_path / "sums.json"
    p.write_text(json.dumps(ROWS))
    assert len(load_rows(p, ["exact"])) == len(ROWS)
    lines = tmp_path / "lines.json"  # JSON Lines named .json: the JSONL reader, as before
    lines.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    assert len(load_rows(lines, ["exact"])) == 2


def test_a_bad_row_names_the_row_and_the_fix(tmp_path):
    rows = [dict(r) for r in ROWS[:3]]
    rows[2]["answer"] = None  # arrow's null: the row lacks the field
    path = tmp_path / "gap.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(ConfigError, match=r"^gap.parquet row 3: field 'answer' \(needed by metric exact\) is "
                                          r"missing; add it to every row, or drop the metric"):
        load_rows(path, ["exact"])


def test_without_datasets_or_with_a_broken_folder_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "sums"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: import raises ImportError
    with pytest.raises(ConfigError, match="needs the datasets package: pip install datasets") as e:
        load_rows(folder, ["exact"])
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    (folder / "state.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"the datasets package cannot read it \(") as e:
        load_rows(folder, ["exact"])
    assert "\n" not in str(e.value)


def test_training_on_a_parquet_file_with_a_trl_reward_function(tmp_path, runs_dir, monkeypatch):
    """The embedded trainer on a parquet file; a TRL-style function reads the `level` column."""
    path = tmp_path / "sums.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    (tmp_path / "level_rewards.py").write_text(
        "def by_level(completions, level, **kwargs):\n"
        "    assert all(isinstance(x, int) for x in level)\n"
        "    return [float(x) for x in level]\n")
    monkeypatch.delitem(sys.modules, "level_rewards", raising=False)
    assert main(["train", "--set", "task.name=jsonl", "--set", f"task.dataset={path}",
                 "--set", "reward.custom.by_level=level_rewards:by_level",
                 "--set", f"reward.custom_dirs=['{tmp_path}']",
                 "--set", "grpo.steps=1", "--set", "grpo.prompts_per_step=3", "--set", "grpo.group_size=2",
                 "--set", "grpo.max_new_tokens=4", "--set", "model.warm_start_steps=0", "--set", "log.progress=false",
                 "--run-id", "parquet"]) == 0
    with RunStore.open("parquet", readonly=True) as store:
        assert set(store.config["reward"]["weights"]) == {"math_answer", "by_level"}
        r = store.rollouts()
        assert len(r) == 6 and set(r["by_level"]) <= {0.0, 1.0, 2.0, 3.0} and r["error"].isna().all()
