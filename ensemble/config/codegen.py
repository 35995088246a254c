"""Write ``ensemble/config/typed.py``, the typed config objects, from the schema.

The schema (``ensemble.config.schema``: ``Key`` and ``Table``) is the one home of every
setting, its type, default and meaning; the typed classes are generated from it so that
the code past the reader reads ``cfg.runtime.specs_in_hand`` (checked by the type
checker) and no default is restated. ``python -m ensemble.config.codegen --write``
regenerates the file; a test fails when the file and the rendering differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ensemble.config.schema import EVOLVE_KEYS, NUM, SCHEMA, Key, Table

TYPED = Path(__file__).with_name("typed.py")
REGENERATE = "python -m ensemble.config.codegen --write"
SCALARS = {int: "int", float: "float", str: "str", bool: "bool", list: "tuple[Any, ...]",
           dict: "Mapping[str, Any]"}
#: class name of each table (the top level is RunConfig)
CLASSES = {"data": "DataConfig", "train": "TrainConfig", "architectures": "ArchitectureConfig",
           "ensemble": "EnsembleConfig", "pbt": "PbtConfig", "evolve": "EvolveConfig",
           "runtime": "RuntimeConfig", "rehearsal": "RehearsalConfig",
           "tracking": "TrackingConfig", "online": "OnlineConfig"}


def _type(key: Key) -> str:
    types = tuple(key.types)
    if types == NUM:
        out = "float"
    else:
        out = " | ".join(SCALARS[t] for t in types)
    return f"{out} | None" if key.nullable else out


def _doc(text: str, indent: str) -> list[str]:
    words, lines, line = text.replace('"""', "'''").split(), [], ""
    for w in words:
        if len(indent) + 4 + len(line) + len(w) + 1 > 110 and line:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    if line:
        lines.append(line)
    return [f"{indent}#: {x}" for x in lines]


def _class(name: str, table: dict, doc: str, *, sections: dict[str, str], arrays: tuple[str, ...] = (),
           extra: tuple[str, str] | None = None) -> list[str]:
    out = ["", "", "@dataclass(frozen=True)", f"class {name}(Section):", f'    """{doc or name}"""', ""]
    if sections:
        nested = ", ".join(f"{k!r}: {v}" for k, v in sections.items())
        out.append(f"    SECTIONS: ClassVar[dict[str, type[Section]]] = {{{nested}}}")
    if arrays:
        out.append(f"    ARRAYS: ClassVar[tuple[str, ...]] = ({', '.join(repr(a) for a in arrays)},)")
    if extra:
        out.append(f"    EXTRA: ClassVar[str | None] = {extra[0]!r}")
    if sections or arrays or extra:
        out.append("")
    for key, spec in table.items():
        if isinstance(spec, Table):
            cls = CLASSES[key]
            out += _doc(spec.doc or key, "    ")
            out.append(f"    {key}: tuple[{cls}, ...]" if spec.array else f"    {key}: {cls}")
        elif key in sections:
            out += _doc(spec.doc, "    ")
            out.append(f"    {key}: {sections[key]}")
        else:
            out += _doc(spec.doc, "    ")
            out.append(f"    {key}: {_type(spec)}")
    if extra:
        out += _doc(extra[1], "    ")
        out.append(f"    {extra[0]}: Mapping[str, Any]")
    return out


def render() -> str:
    """The text of ``typed.py``."""
    lines = ['"""The run\'s config as typed, frozen objects: GENERATED from ``ensemble.config.schema`` by',
             f"``{REGENERATE}``; do not edit.", "",
             "``load_config`` / ``resolve_config`` return a ``RunConfig``; every setting's type, default and",
             'meaning live in the schema (and docs/config.md, rendered from it)."""', "",
             "from __future__ import annotations", "",
             "from collections.abc import Mapping",
             "from dataclasses import dataclass",
             "from typing import Any, ClassVar", "",
             "from ensemble.config.section import Section"]
    top = SCHEMA.keys
    for key, spec in top.items():
        if isinstance(spec, Table):
            subs = {k: CLASSES[k] for k, v in spec.keys.items() if isinstance(v, Table)}
            lines += _class(CLASSES[key], spec.keys, spec.doc.split(". ")[0].rstrip(".") + ".", sections=subs)
        if key == "evolve":
            lines += _class("EvolveConfig", EVOLVE_KEYS, "mode \"evolve\": the search strategy and its budget; "
                            "the strategy's own settings in ``settings``.", sections={},
                            extra=("settings", "the chosen strategy's own settings (evolve.strategies), by name"))
    sections = {k: CLASSES[k] for k, v in top.items() if isinstance(v, Table)} | {"evolve": "EvolveConfig"}
    arrays = tuple(k for k, v in top.items() if isinstance(v, Table) and v.array)
    lines += _class("RunConfig", top, "A whole run's settings, resolved: every default filled in.",
                    sections=sections, arrays=arrays)
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensemble.config.codegen", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {TYPED}")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        TYPED.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
