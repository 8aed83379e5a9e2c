"""Hugging Face `datasets` data as a JSONL task's rows: what a TRL user's dataset already is.

task.dataset may name, besides a JSONL file:
  - a folder `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`) wrote: read with
    `datasets.load_from_disk`;
  - a parquet file, or a folder of parquet/JSON/CSV files (a Hub dataset's layout, `data/train-*.parquet`):
    read with `datasets.load_dataset`, which finds the splits from the file names;
  - a .json file holding a JSON array of objects (`datasets.load_dataset("json", ...)`; a .json
    of JSON Lines stays with the JSONL reader, which names a bad row's line).
A dataset with splits gives its "train" split, or its only one; otherwise the error names the
splits and the folder to give instead. The columns are TRL's: `prompt` (a string, or a list of
chat messages), plus any others, which the metrics and TRL-style reward functions read. A null
in a column is that row lacking the field, as a key absent from a JSONL row. `datasets` is an
optional dependency (`pip install datasets`, in the trl extra): without it, one line says so.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from grpo_core.errors import ConfigError

DATA_SUFFIXES = (".parquet", ".arrow")
SPLIT = "train"


def is_datasets_source(path: Path) -> bool:
    """A folder, a parquet/arrow file, or a .json file whose first character opens an array."""
    if path.is_dir() or path.suffix in DATA_SUFFIXES:
        return True
    if path.suffix == ".json" and path.is_file():
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.read(4096).lstrip().startswith("[")
    return False


def _datasets(path: Path):
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"task.dataset {str(path)!r}: reading a datasets folder, parquet or JSON-array file needs "
                          "the datasets package: pip install datasets (or give the rows as a JSONL file)") from None
    return datasets


def _one_split(data, path: Path):
    """A Dataset from a Dataset or a DatasetDict (its train split, or its only one)."""
    if not hasattr(data, "keys"):
        return data
    splits = list(data.keys())
    if SPLIT in splits or len(splits) == 1:
        return data[SPLIT if SPLIT in splits else splits[0]]
    raise ConfigError(f"task.dataset {str(path)!r} has the splits {', '.join(splits)} and no {SPLIT!r}: name the "
                      f"split's folder or file instead (e.g. {path / splits[0]})")


def load(path: Path):
    """The dataset at `path` (one split), read by the datasets package."""
    datasets = _datasets(path)
    try:
        if path.is_dir() and any((path / f).is_file() for f in ("state.json", "dataset_dict.json")):
            data = datasets.load_from_disk(str(path))
        elif path.is_dir():
            data = datasets.load_dataset(str(path))
        else:
            builder = "json" if path.suffix == ".json" else path.suffix.lstrip(".")
            data = datasets.load_dataset(builder, data_files=str(path))
    except ConfigError:
        raise
    except Exception as e:  # a corrupt or unreadable folder: one line naming it
        why = (str(e).splitlines() or [""])[0][:200]
        raise ConfigError(f"task.dataset {str(path)!r}: the datasets package cannot read it ({type(e).__name__}: "
                          f"{why}); give a folder Dataset.save_to_disk wrote, a parquet file or folder, "
                          "or JSONL") from None
    return _one_split(data, path)


def read(path: Path) -> list[tuple[str, dict]]:
    """(where, row) for every row: where is '<name> row N', N from 1; nulls dropped from the rows."""
    data = load(path)
    rows = [{k: v for k, v in row.items() if v is not None} for row in data.to_list()]
    return [(f"{path.name} row {n}", row) for n, row in enumerate(rows, 1)]


def digest(rows: list[dict]) -> str:
    """A content digest of the rows (the warm-start cache's key), whatever files hold them."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
