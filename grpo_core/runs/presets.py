"""Weight presets: named reward weights (+ group size and threshold) saved as TOML files.

A preset is `<runs_dir>/presets/<name>.toml`, shaped like a run config fragment so it reads
(and can be shared, diffed, edited) like one:

    [preset]
    name = "cite-less"
    note = "from run demo-... step 120 (ratio 0.18 -> 0.41)"
    source_run = "demo-20260101-120000-ab12"
    created = "2026-01-01 12:00:00"

    [reward.weights]
    answer_f1 = 0.55
    citation = 0.4

    [grpo]
    group_size = 12
    min_group_std = 0.01

Saved from the live page (the settings in force) or from a "reuse" row of the analysis
ledger; listed, loaded and deleted here; the runs page starts a run from one
(`apply_preset` puts its values into a config dict). Names are checked (no path tricks),
and a file that is not valid TOML, or holds a bad value, is a one-line PresetError that
names the file.
"""
from __future__ import annotations

import math
import os
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from grpo_core.errors import ConfigError
from grpo_core.runs.live_settings import check_weights
from grpo_core.runs.locations import runs_dir

PRESET_DIR = "presets"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
GRPO_KEYS = {"group_size": int, "min_group_std": float}


class PresetError(ConfigError):
    """A preset that cannot be saved or read; the message names the preset or file."""


@dataclass
class Preset:
    name: str
    weights: dict[str, float]
    group_size: int | None = None
    min_group_std: float | None = None
    note: str = ""
    source_run: str = ""
    created: str = ""
    path: Path | None = field(default=None, compare=False)

    def to_toml(self) -> str:
        meta = {"name": self.name, "note": self.note, "source_run": self.source_run, "created": self.created}
        data: dict = {"preset": meta, "reward": {"weights": dict(self.weights)}}
        grpo = {k: getattr(self, k) for k in GRPO_KEYS if getattr(self, k) is not None}
        if grpo:
            data["grpo"] = grpo
        return tomli_w.dumps(data)


def preset_dir(root=None) -> Path:
    return runs_dir(root) / PRESET_DIR


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise PresetError(f"preset name {name!r} is not allowed: use letters, digits, '_', '-', '.' "
                          "(at most 64, starting with a letter or digit, no '..' or '/')")
    return name


def preset_path(name: str, root=None) -> Path:
    return preset_dir(root) / f"{check_name(name)}.toml"


def _check(p: Preset, where: str) -> Preset:
    """Validate values; errors name `where` (the file or the preset)."""
    try:
        p.weights = check_weights(p.weights, None)
    except ConfigError as e:
        raise PresetError(f"{where}: {e}") from None
    if p.group_size is not None:
        if isinstance(p.group_size, bool) or not isinstance(p.group_size, (int, float)) \
                or p.group_size != int(p.group_size) or not 2 <= p.group_size <= 1024:
            raise PresetError(f"{where}: grpo.group_size must be an integer from 2 to 1024, got {p.group_size!r}")
        p.group_size = int(p.group_size)
    if p.min_group_std is not None:
        v = p.min_group_std
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1:
            raise PresetError(f"{where}: grpo.min_group_std must be a number in [0, 1), got {v!r}")
        p.min_group_std = float(v)
    return p


def save_preset(name: str, weights: dict, group_size: int | None = None, min_group_std: float | None = None, *,
                note: str = "", source_run: str = "", root=None, overwrite: bool = True) -> Path:
    """Write `<runs_dir>/presets/<name>.toml` (atomically); returns its path."""
    path = preset_path(name, root)
    if path.exists() and not overwrite:
        raise PresetError(f"preset {name!r} already exists ({path}); choose another name or overwrite it")
    p = _check(Preset(name, dict(weights or {}), group_size, min_group_std, str(note or ""), str(source_run or ""),
                      time.strftime("%Y-%m-%d %H:%M:%S")), f"preset {name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(p.to_toml())
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def read_preset_file(path: str | os.PathLike) -> Preset:
    """Parse and validate one preset file; PresetError (one line, naming the file) when bad."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise PresetError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PresetError(f"{path}: not valid TOML ({str(e).splitlines()[0]})") from None
    meta = data.get("preset") or {}
    reward = data.get("reward") or {}
    grpo = data.get("grpo") or {}
    if not isinstance(meta, dict) or not isinstance(reward, dict) or not isinstance(grpo, dict):
        raise PresetError(f"{path}: [preset], [reward] and [grpo] must be tables")
    unknown = (set(data) - {"preset", "reward", "grpo"}) | {f"reward.{k}" for k in set(reward) - {"weights"}} | \
        {f"grpo.{k}" for k in set(grpo) - set(GRPO_KEYS)}
    if unknown:
        raise PresetError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; a preset holds reward.weights, "
                          "grpo.group_size and grpo.min_group_std")
    if not isinstance(reward.get("weights"), dict):
        raise PresetError(f"{path}: [reward.weights] is missing (metric = weight pairs)")
    p = Preset(path.stem, dict(reward["weights"]), grpo.get("group_size"), grpo.get("min_group_std"),
               str(meta.get("note", "")), str(meta.get("source_run", "")), str(meta.get("created", "")), path)
    return _check(p, str(path))


def load_preset(name: str, root=None) -> Preset:
    path = preset_path(name, root)
    if not path.is_file():
        have = ", ".join(p.stem for p in sorted(preset_dir(root).glob("*.toml"))) or "none saved yet"
        raise PresetError(f"no preset {name!r} in {path.parent} (presets: {have})")
    return read_preset_file(path)


def list_presets(root=None) -> list[Preset | PresetError]:
    """Every preset file, by name; a bad file is listed as its PresetError, never skipped."""
    out: list[Preset | PresetError] = []
    d = preset_dir(root)
    for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
        try:
            out.append(read_preset_file(path))
        except PresetError as e:
            out.append(e)
    return out


def delete_preset(name: str, root=None) -> bool:
    """Remove the preset's file; False when there was none."""
    path = preset_path(name, root)
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def apply_preset(cfg: dict, preset: Preset) -> dict:
    """A config dict with the preset's weights (replacing the weights wholesale), group size and
    threshold put in; everything else unchanged."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in (cfg or {}).items()}
    out.setdefault("reward", {})["weights"] = dict(preset.weights)
    for key in GRPO_KEYS:
        if getattr(preset, key) is not None:
            out.setdefault("grpo", {})[key] = getattr(preset, key)
    return out


def form_defaults(preset: Preset) -> dict:
    """The runs page's start-form defaults for this preset."""
    out = {"weights": dict(preset.weights), "from_preset": preset.name}
    if preset.group_size is not None:
        out["group_size"] = preset.group_size
    if preset.min_group_std is not None:
        out["min_group_std"] = preset.min_group_std
    return out


def from_ledger_row(row, run_id: str = "") -> dict:
    """save_preset keyword arguments from a change_ledger row: the weights in force after a
    weight change (a 'reuse' row is the usual pick), with a note on what it did."""
    if row["kind"] != "set_weights" or not isinstance(row["new"], dict):
        raise PresetError(f"ledger row at step {row['step']} is a {row['kind']} change: only weight changes "
                          "make a preset")
    ratio = "" if row["ratio_before"] != row["ratio_before"] else \
        f" (ratio {row['ratio_before']:.2f} -> {row['ratio_after']:.2f})"
    return {"weights": dict(row["new"]), "note": f"from run {run_id} step {int(row['step'])}{ratio}",
            "source_run": run_id}
