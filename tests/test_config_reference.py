"""docs/config.md is rendered from the schema (``ensemble.config.reference``): it must be exactly
that rendering, and every setting it renders must say what it means."""

from __future__ import annotations

from pathlib import Path

from ensemble.config.reference import CONFIG_DOC, REGENERATE, config_reference
from ensemble.config.schema import EVOLVE_KEYS, SCHEMA, SEARCH_DOCS, Key, Table
from ensemble.config.vocabulary import LAYER_PARAM_DOCS, LAYER_PARAMS

ROOT = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_the_rendering_of_the_schema():
    assert CONFIG_DOC == ROOT / "docs" / "config.md"
    assert CONFIG_DOC.is_file(), f"docs/config.md is missing; generate it with `{REGENERATE}`"
    assert CONFIG_DOC.read_text() == config_reference(), (
        f"docs/config.md differs from the settings in ensemble/config/schema.py; regenerate it with `{REGENERATE}`")


def _keys(table: Table, path: str = ""):
    for name, spec in table.keys.items():
        where = f"{path}.{name}" if path else name
        if isinstance(spec, Table):
            assert spec.doc, f"[{where}] has no doc"
            yield from _keys(spec, where)
        else:
            yield where, spec


def test_every_setting_says_what_it_means():
    settings = [*_keys(SCHEMA), *((f"evolve.{k}", v) for k, v in EVOLVE_KEYS.items())]
    assert len(settings) > 60
    undocumented = [where for where, key in settings if not (isinstance(key, Key) and key.doc)]
    assert not undocumented, f"settings without a `doc`: {undocumented}"
    text = config_reference()
    for where, _ in settings:
        if where in ("evolve", "search"):               # tables of their own, declared elsewhere
            assert f"## `[{where}]`" in text
        else:
            assert f"| `{where.rsplit('.', 1)[-1]}` |" in text, f"{where} is not in docs/config.md"


def test_search_and_layer_docs_cover_exactly_what_is_accepted():
    from evolve.space import SearchSpace
    assert set(SEARCH_DOCS) == set(SearchSpace.KEYS)
    params = {p for kind in LAYER_PARAMS.values() for p in kind}
    assert set(LAYER_PARAM_DOCS) == params


def test_allowed_values_and_defaults_are_rendered():
    text = config_reference()
    assert '| `optimizer` | string | `"adam"` |' in text and '`"lion"`' in text
    assert "| `val_fraction` | number | `0.15` |" in text
    assert "| `regularized` | `population_size` | 12 |" in text         # the strategy table
    assert "| `max_params` | integer | `2000000` |" in text                # SearchSpace's own default
    assert "| `Conv2D` | **`filters`**, **`kernel_size`**" in text
