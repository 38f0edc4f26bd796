"""The rooms' one-way imports (docs/architecture.md): app > pipeline > engine, and bench above all
of them. A room imports only from its own floor or below, imports inside functions included, and
no runtime room imports bench (the tools) or tests."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"engine": 1, "pipeline": 2, "app": 3, "bench": 4}  # higher floors may import lower ones


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a project room in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FLOORS | {"tests": 0}]
    return found


def test_no_room_imports_from_a_room_above_it():
    upward, checked = [], 0
    for room, floor in FLOORS.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            for line, module in first_party_imports(path):
                checked += 1
                target = module.split(".")[0]
                if target == "tests" or FLOORS[target] > floor:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert checked > 100  # the walk really read the rooms
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_the_check_sees_a_function_level_import(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from app.config import load_config\n")
    assert first_party_imports(source) == [(2, "app.config")]
