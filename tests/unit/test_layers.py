"""Each layer imports only the layers below it (docs/decisions.md, "Where things live"), lazy
imports inside functions included; settings/ imports nothing of the project."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Lower numbers are lower layers; one number is one layer (store and kernelsrc sit side by side).
LAYERS = {"settings": 0, "attnconfig": 1, "reference": 2, "kernels": 3, "sweeps": 4, "store": 5, "kernelsrc": 5,
          "ci": 6, "workers": 7, "submit": 8, "api": 9, "cli": 10, "drills": 10}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_no_layer_imports_one_above_it_or_beside_it():
    wrong = []
    for package, rank in LAYERS.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in _imports(path):
                top = name.split(".")[0]
                if top in LAYERS and top != package and LAYERS[top] >= rank:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)
