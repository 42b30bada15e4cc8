"""Command-line options derived from the config models, so a choice, a bound or a field's meaning is written once
(in the model) and the flag follows it: `choices` turns a field's Literal into the Enum typer needs for a choice,
`option` takes a field's description and bounds as the flag's help and limits."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, get_args

import annotated_types
import typer
from pydantic import BaseModel


def choices(model: type[BaseModel], field: str, name: str) -> type[StrEnum]:
    """The values of `model.field`'s Literal (optional or not) as a StrEnum named `name`."""
    annotation = model.model_fields[field].annotation
    values = [v for arg in (get_args(annotation) or (annotation,)) for v in (get_args(arg) or (arg,))]
    values = [v for v in values if isinstance(v, str)]
    if not values:
        raise TypeError(f"{model.__name__}.{field} is not a Literal of strings")
    return StrEnum(name, {v.replace("-", "_"): v for v in values})


def option(model: type[BaseModel], field: str, *param_decls: str, **overrides: Any) -> Any:
    """A typer.Option for `model.field`: its description as the help, its ge/le as min/max (a strict gt/lt bound is
    left to the model, which refuses the value with the field's name when the config is built)."""
    info = model.model_fields[field]
    limits: dict[str, Any] = {}
    for rule in info.metadata:
        if isinstance(rule, annotated_types.Ge):
            limits["min"] = rule.ge
        elif isinstance(rule, annotated_types.Le):
            limits["max"] = rule.le
    return typer.Option(*param_decls, **{"help": info.description, **limits, **overrides})
