"""The layering of ``ensemble/`` as written in its package docstring, checked on the source.

Every import (module level or inside a function) is read with ``ast``; a module may import
only from layers below its own, or from its own package. Also: mpi4py only in the two MPI
modules, TensorFlow/Keras only where models are built, trained or run.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"config": 0, "runtime": 1, "task": 1, "results": 2, "train": 3, "inference": 3, "sources": 3,
          "modes": 4, "orchestrate": 5, "run": 6, "predict": 6, "simulate": 6,
          "reselect": 6, "report": 6, "status": 6, "jobscript": 6, "export": 6, "cli": 7}
#: what the packages beside ``ensemble`` may import from it
BESIDE = {"evolve": {"ensemble.config.vocabulary"}, "datafeed": set()}
#: the lowest ensemble layer that may import each neighbour package
NEIGHBOURS = {"evolve": 3, "datafeed": 3}
#: the declarations config reads from evolve: the strategy registry and the search-space keys
CONFIG_READS = {"evolve.strategies", "evolve.space"}
#: ``runtime.stage`` runs before the project can be imported (it stages the environment the project is read from)
MPI_MODULES = {"ensemble/runtime/mpi.py", "datafeed/distribute.py", "ensemble/runtime/stage.py"}
TF_PLACES = ("ensemble/train/", "ensemble/inference/", "ensemble/runtime/env.py",
             "ensemble/runtime/data_parallel.py", "ensemble/task/tasks.py", "ensemble/task/graph.py",
             "datafeed/pipeline.py", "datafeed/streaming.py")


def modules() -> list[Path]:
    return sorted(p for pkg in ("ensemble", "evolve", "datafeed") for p in (ROOT / pkg).rglob("*.py"))


@cache                                     # each file is parsed once for all the tests below
def imported(path: Path) -> set[str]:
    """Every module name ``path`` imports, resolving ``from x import y`` to ``x.y`` where y is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names
                         if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists()
                         or (ROOT / node.module.replace(".", "/") / a.name).is_dir())
    return names


def layer_of(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[0] != "ensemble" or len(parts) < 2:
        return None
    return parts[1], LAYERS[parts[1]]


def name_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_down(path):
    me = name_of(path)
    top = me.split(".")[0]
    bad = []
    for target in imported(path):
        head = target.split(".")[0]
        if top in BESIDE:
            if head == "ensemble" and target not in BESIDE[top] and target != "ensemble":
                bad.append(f"{target} (only {sorted(BESIDE[top]) or 'nothing'} may be used from ensemble)")
            continue
        if me == "ensemble":
            continue
        mine = layer_of(me)
        if head in NEIGHBOURS:
            if mine[1] < NEIGHBOURS[head] and not (mine[0] == "config" and target in CONFIG_READS | {"evolve"}):
                bad.append(f"{target} (layer {mine[1]} may not use {head})")
            continue
        theirs = layer_of(target)
        if theirs is None or theirs[0] == mine[0]:
            continue
        if theirs[1] >= mine[1]:
            bad.append(f"{target} (layer {theirs[1]} {theirs[0]}; {me} is layer {mine[1]} {mine[0]})")
    assert not bad, f"{me} imports from a layer not below its own: " + "; ".join(sorted(bad))


def test_every_ensemble_package_has_a_layer():
    packages = {p.name for p in (ROOT / "ensemble").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    entries = {p.stem for p in (ROOT / "ensemble").glob("*.py") if p.stem != "__init__"}
    assert packages | entries == set(LAYERS)


def test_the_checks_see_the_source_and_every_named_place_exists():
    """The tests above check nothing if the walk finds no files or a room names a stale path."""
    found = {str(p.relative_to(ROOT)) for p in modules()}
    assert {"ensemble/run.py", "ensemble/config/schema.py", "evolve/space.py", "datafeed/readers.py"} <= found
    for place in (*MPI_MODULES, *TF_PLACES):
        assert (ROOT / place).exists(), f"{place} is named as a room but does not exist"
    assert all("mpi4py" in imported(ROOT / m) for m in MPI_MODULES)   # the walk reads their imports


def test_mpi_and_tensorflow_stay_in_their_rooms():
    for path in modules():
        rel = str(path.relative_to(ROOT))
        heads = {t.split(".")[0] for t in imported(path)}
        if "mpi4py" in heads:
            assert rel in MPI_MODULES, f"{rel} imports mpi4py"
        if heads & {"tensorflow", "keras"}:
            assert rel.startswith(TF_PLACES), f"{rel} imports TensorFlow/Keras"


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from ensemble.orchestrate import session\n")
    assert "ensemble.orchestrate.session" in imported(bad)
    assert layer_of("ensemble.orchestrate.session")[1] > LAYERS["results"]
