"""`watch` reads only what is new (source_tail.py): a TensorBoard event file written by the
writer transformers uses (torch's SummaryWriter) and a W&B run file, each growing while it is
polled. The followed run has every step once and equals a one-shot `import` of the finished
file (TRL's cumulative ratio carries across pieces); a poll with nothing new reads no byte; a
new step costs its own bytes (and the probe before the offset), not the old ones. verl's case
is in tests/test_verl.py."""
from __future__ import annotations

import os

import pytest

from grpo_core.integrations import follow, source_tail, tensorboard_logs, wandb_file
from grpo_core.runs import names
from grpo_core.runs.store import RunStore
from tests.test_importers import history_record, wandb_log


def frac(step: int) -> float:
    return [0.0, 0.5, 0.25, 1.0][step % 4]


def follow_loop(tail, store):
    """follow.follow's loop body, one poll at a time."""
    grouped: set = set()

    def poll():
        grew = tail.poll()
        if grew:
            follow.write_new(store, tail, tail.run(), grouped)
        return grew
    return poll


def check_growth(tail, store, grow, steps: range, file_size):
    poll = follow_loop(tail, store)
    for step in steps:
        size, before = file_size(), tail.reads.bytes
        grow(step)
        assert poll()
        if step > steps.start:
            assert tail.reads.bytes - before == file_size() - size + min(size, source_tail.PROBE)
        before = tail.reads.bytes
        poll()  # quiet: the newest step, held for its other values, is finished now
        assert not poll() and tail.reads.bytes == before  # nothing new: no byte read
        assert store.scalars_wide().index.tolist() == list(range(1, step + 1))


def test_a_growing_tensorboard_file_is_read_once_and_equals_its_import(tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    logdir = tmp_path / "runs" / "Jan01_host"
    writer = SummaryWriter(str(logdir))
    store = RunStore.create("tb", {}, root=tmp_path / "store", kind="watch")

    def grow(step):
        writer.add_scalar("train/reward", step / 10, step)
        writer.add_scalar("train/frac_reward_zero_std", frac(step), step)
        writer.flush()

    grow(1)  # the writer's file exists from the first event on
    tail = tensorboard_logs.EventsReader(tmp_path / "runs")
    event_file = next(logdir.glob("*tfevents*"))
    check_growth(tail, store, grow, range(2, 9), lambda: event_file.stat().st_size)
    writer.close()
    whole = tensorboard_logs.parse_logdir(tmp_path / "runs")
    wide = store.scalars_wide()
    for step, row in whole.scalars.items():
        for name in (names.REWARD, names.TRAINABLE_RATIO, names.CUM_TRAINABLE_RATIO):
            assert wide.loc[step, name] == pytest.approx(row[name])
    assert tail.run().scalars == whole.scalars
    store.close()


def test_a_growing_wandb_file_is_read_once_and_ends_on_its_exit_record(tmp_path):
    from wandb.proto import wandb_internal_pb2
    records = [history_record(s, {"train/reward": s / 10, "train/frac_reward_zero_std": frac(s),
                                  "train/global_step": s, "_step": s}) for s in range(1, 9)]
    path = tmp_path / "run-x.wandb"
    path.write_bytes(wandb_log(records[:1]))
    store = RunStore.create("w", {}, root=tmp_path / "store", kind="watch")
    tail = wandb_file.WandbReader(path)

    def grow(step):  # the transaction log only grows: each longer log starts with the shorter one
        path.write_bytes(wandb_log(records[:step]))

    check_growth(tail, store, grow, range(2, 9), lambda: path.stat().st_size)
    assert not tail.run().ended
    exit_record = wandb_internal_pb2.Record()
    exit_record.exit.exit_code = 0
    path.write_bytes(wandb_log(records + [exit_record.SerializeToString()]))
    assert tail.poll() and tail.run().ended and tail.run().finished
    whole = wandb_file.parse_wandb_run(path.read_bytes(), str(path))
    assert tail.run().scalars == whole.scalars and whole.scalars[8][names.CUM_TRAINABLE_RATIO] == pytest.approx(
        sum(1 - frac(s) for s in range(1, 9)) / 8)
    store.close()


def test_a_rewritten_file_is_read_again_from_its_start(tmp_path):
    """verl's file logger reopens its file with "wb" when a job resumes: same size or not, the
    bytes before the offset differ, and the file is read from its start."""
    path, reads = tmp_path / "x.jsonl", source_tail.Reads()
    path.write_bytes(b"a" * 100 + b"\n")
    tail = source_tail.FileTail(path, reads)
    data, restarted = tail.read()
    tail.consumed(data, len(data))
    assert not restarted and tail.read() == (b"", False)
    path.write_bytes(b"b" * 100 + b"\n")
    data, restarted = tail.read()
    assert restarted and data == b"b" * 100 + b"\n"
    tail.consumed(data, len(data))
    path.write_bytes(b"b" * 100 + b"\nmore\n")  # appended: only the new bytes (and the probe)
    before = reads.bytes
    assert tail.read() == (b"more\n", False) and reads.bytes - before == len(b"more\n") + source_tail.PROBE


def test_numbered_files_are_found_by_probing_not_by_listing_a_growing_folder(tmp_path):
    """TRL's completions folder: one file per logging step. After the first listing each new
    file is found by probing the next names; a file out of sequence lists the folder again."""
    folder, reads = tmp_path / "completions", source_tail.Reads()
    folder.mkdir()

    def write(step: int):
        (folder / f"completions_{step:05d}.parquet").write_bytes(b"x")
        os.utime(folder, ns=(step * 10**9, step * 10**9))  # the folder's mtime moves, as on a real write

    files = source_tail.NumberedFiles(folder, reads, r"completions_(\d+)\.parquet", lambda s: f"completions_{s:05d}.parquet")
    for step in (5, 10):
        write(step)
    assert [p.name for p in files.poll()] == ["completions_00005.parquet", "completions_00010.parquet"]
    assert reads.listings == 1 and files.poll() == []  # nothing new: not even a probe
    for step in range(15, 105, 5):
        write(step)
        assert [p.name for p in files.poll()] == [f"completions_{step:05d}.parquet"]
    assert reads.listings == 1  # every later file found by probing
    write(1000)  # far out of sequence: the probe misses it, the folder is listed again
    assert [p.name for p in files.poll()] == ["completions_01000.parquet"] and reads.listings == 2
