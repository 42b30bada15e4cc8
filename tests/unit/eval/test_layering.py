"""The evaluation sits below the trainer: nothing under services/eval imports services.trainer, at module level or
inside a function (the trainer imports the evaluation's split and scoring, never the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

EVAL = Path(__file__).resolve().parents[3] / "services" / "eval"


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from services import trainer` names the package in the alias, not in the module
            modules.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
    return modules


def test_no_eval_module_imports_the_trainer():
    sources = sorted(EVAL.rglob("*.py"))
    assert sources, EVAL
    upward = {
        str(path.relative_to(EVAL)): sorted(m for m in imported_modules(path) if m.startswith("services.trainer"))
        for path in sources
    }
    assert {name: mods for name, mods in upward.items() if mods} == {}
