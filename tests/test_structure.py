"""The house's shape (issue 27): layers point one way, and no package is an import circle
(tools/structure.py reads both from the source)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import structure


def test_no_module_imports_trios_internals() -> None:
    assert structure.private_trio_imports() == []


def test_layers_point_one_way() -> None:
    assert structure.upward(structure.graph(all_imports=True)) == []


@pytest.mark.parametrize("layer", structure.LAYERS)
def test_no_package_is_an_import_circle(layer: str) -> None:
    circles = [c for c in structure.circles(structure.graph()) if structure.layer_of(c[0]) == layer]
    assert circles == []


@pytest.mark.slow
def test_each_module_type_checks_strictly_alone() -> None:
    """mypy --strict over every module by itself (tools/typecheck --each), so that no object
    type-checks only through another's (a room's `cast("Session", self)`)."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["bash", "tools/typecheck", "--each"], cwd=repo, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
