"""The typed config: generated from the schema, read-only, the same settings as the TOML,
and the one way the code reads a setting (no string lookups on a config)."""

from __future__ import annotations

import dataclasses
import pickle
import re
import tomllib
from pathlib import Path

import pytest

from ensemble.config import RunConfig, dump_toml, load_config, read_saved_config, resolve_config
from ensemble.config.codegen import render
from ensemble.config.typed import ArchitectureConfig, EvolveConfig

ROOT = Path(__file__).resolve().parents[2]


def test_typed_module_is_the_rendering_of_the_schema():
    assert (ROOT / "ensemble/config/typed.py").read_text() == render(), (
        "ensemble/config/typed.py is stale; regenerate it with `python -m ensemble.config.codegen --write`")


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_reads_writes_and_pickles_unchanged(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    again = resolve_config(tomllib.loads(dump_toml(cfg)), saved=True)
    assert again == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg          # a config crosses MPI
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_a_config_cannot_be_changed_behind_the_runs_back():
    cfg = resolve_config({"architectures": [{"name": "a", "layers": [{"type": "Dense", "units": 4}]}]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 3                               # type: ignore[misc]
    assert isinstance(cfg.architectures, tuple) and isinstance(cfg.architectures[0], ArchitectureConfig)
    with pytest.raises(TypeError):
        cfg.architectures[0].layers[0]["units"] = 8        # type: ignore[index]
    changed = cfg.replace(train=cfg.train.replace(epochs=3))
    assert changed.train.epochs == 3 and cfg.train.epochs != 3


def test_a_strategys_own_settings_sit_in_settings_and_come_back_flat():
    cfg = resolve_config({"mode": "evolve", "evolve": {"strategy": "mu_plus_lambda", "mu": 5}})
    assert isinstance(cfg.evolve, EvolveConfig) and cfg.evolve.settings["mu"] == 5
    assert cfg.evolve.to_dict()["mu"] == 5 and "settings" not in cfg.evolve.to_dict()


def test_a_runs_saved_config_reads_back_as_the_config_it_ran(tmp_path):
    cfg = load_config(ROOT / "configs/digits_evolve.toml")
    (tmp_path / "config.toml").write_text(dump_toml(cfg))
    assert read_saved_config(tmp_path / "config.toml") == cfg


#: a subscript of something named like a config with a string: ``cfg["train"]``, ``config['data']``
#: (the mappings a config holds, a strategy's ``settings``, a builder's ``params``, are subscripted)
STRING_LOOKUP = re.compile(r"""\b(cfg|config|saved_cfg|source_cfg|run_cfg)"""
                           r"""(\.(?!settings\b|params\b|ranges\b)\w+)*\[["']""")


def test_no_code_reads_a_config_by_string_key():
    """Settings are attributes (``cfg.train.epochs``): a typo fails at once, the type checker
    reads them, and one home holds each default. (Result and spec dicts keep their keys.)"""
    offenders = []
    for path in sorted((ROOT / "ensemble").rglob("*.py")) + sorted((ROOT / "datafeed").rglob("*.py")):
        if "config" in path.relative_to(ROOT).parts[:2]:    # the schema validates the raw TOML dict
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if STRING_LOOKUP.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_a_section_has_no_string_lookup():
    cfg = resolve_config({"architectures": [{"name": "a", "layers": [{"type": "Dense", "units": 4}]}]})
    with pytest.raises(TypeError):
        cfg["train"]                                        # type: ignore[index]
    assert not hasattr(cfg.train, "get")


#: a branch on a mode's name: ``cfg.mode == "pbt"``, ``mode != 'evolve'``, ``mode in ("ensemble", ...)``
MODE_BRANCH = re.compile(r"""\bmode\s*(==|!=|\bin\b|\bnot in\b)\s*[("'\[]""")
#: where a mode's name may be read: the modes themselves, and the schema that checks each mode's tables
MODE_HOMES = ("ensemble/modes/", "ensemble/config/")
#: ``pbt.start``, ``evolve.start_from`` name another run, which must be a search: a check of its mode, not this one's
MODE_BRANCH_ALLOWED = {"ensemble/sources/earlier.py": 'if source_cfg.mode != "evolve":'}


def test_nothing_outside_the_modes_branches_on_the_mode_name():
    offenders = []
    for path in sorted((ROOT / "ensemble").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(MODE_HOMES):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if MODE_BRANCH.search(line) and MODE_BRANCH_ALLOWED.get(rel) != line.strip():
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "ask the mode object (ensemble.modes.mode_of(cfg)) instead:\n" + "\n".join(offenders)
