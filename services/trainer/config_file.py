"""The run config as a TOML file: read one (plus `key=value` overrides from the command line), validate it as a
`RunConfig`, and write one back with every field's description as a comment (`--print-config`)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from services.trainer.run_state import RunConfig


def parse_override(text: str) -> tuple[list[str], Any]:
    """`algo.beta=0.02` -> (["algo", "beta"], 0.02). The value is read as TOML (numbers, true/false, quoted
    strings, arrays); anything else is taken as a bare string, so `dataset=nq` works unquoted."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} is not KEY=VALUE (e.g. algo.beta=0.02)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return [part.strip().replace("-", "_") for part in key.split(".")], value


def merge(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"{'.'.join(path)}: {part} is not a table")
    node[path[-1]] = value


def load_run_config(path: Path | None = None, overrides: Iterable[tuple[list[str], Any]] = ()) -> RunConfig:
    """Defaults < the file < overrides, in order ((key path, value) pairs, as `parse_override` gives); validated
    once at the end, so an unknown key or a bad value fails here with the field's name."""
    data: dict[str, Any] = tomllib.loads(path.read_text()) if path is not None else {}
    for key, value in overrides:
        merge(data, key, value)
    return RunConfig.model_validate(data)


def _toml_value(value: Any) -> str:
    return json.dumps(value, default=str)  # JSON strings, numbers, booleans and arrays are valid TOML; paths as strings


def _table(model: BaseModel, lines: list[str]) -> list[tuple[str, BaseModel]]:
    nested = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            nested.append((name, value))
            continue
        if field.description:
            lines.append(f"# {field.description}")
        lines.append(f"# {name} =  (unset)" if value is None else f"{name} = {_toml_value(value)}")
    return nested


def to_toml(config: RunConfig) -> str:
    lines: list[str] = []
    for name, model in _table(config, lines):
        lines += ["", f"[{name}]"]
        _table(model, lines)
    return "\n".join(lines) + "\n"
