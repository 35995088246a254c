"""The base of the typed config objects (``ensemble.config.typed``, generated from the schema).

A section is a frozen dataclass: one attribute per setting, with the type the schema
declares. Lists become tuples and tables read-only mappings, so nothing past the reader
can change a setting behind the run's back; ``replace`` makes a changed copy. The TOML
stays the user's format: ``from_dict`` reads a resolved (validated, defaulted) config dict,
``to_dict`` gives it back, as the run directory records it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="Section")


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict | MappingProxyType):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Section:
    """One table of the config. ``SECTIONS`` maps a field holding a nested table to its
    class; ``ARRAYS`` names the fields holding an array of tables; ``EXTRA`` is the field
    (if any) that gathers the keys the schema leaves to someone else (a strategy's own
    settings)."""

    SECTIONS: ClassVar[dict[str, type[Section]]] = {}
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    EXTRA: ClassVar[str | None] = None

    @classmethod
    def from_dict(cls: type[S], values: Mapping[str, Any]) -> S:
        """The section of a resolved config dict (every key the schema declares present)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in values.items():
            if key not in names or key == cls.EXTRA:
                extra[key] = value
                continue
            sub = cls.SECTIONS.get(key)
            if sub is not None and key in cls.ARRAYS:
                kwargs[key] = tuple(sub.from_dict(v) for v in value)
            elif sub is not None:
                kwargs[key] = sub.from_dict(value)
            else:
                kwargs[key] = _freeze(value)
        if cls.EXTRA is not None:
            kwargs[cls.EXTRA] = _freeze(extra)
        elif extra:
            raise TypeError(f"{cls.__name__} has no setting {', '.join(map(repr, extra))}")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The section as the plain dict the TOML writer and JSON take."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = _thaw(getattr(self, f.name))
            if f.name == self.EXTRA:
                out.update(value)
            else:
                out[f.name] = value
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its dict (read-only mappings do not pickle): a config crosses MPI."""
        return (_rebuild, (type(self), self.to_dict()))

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (setting name -> value; a nested section as a Section)."""
        return dataclasses.replace(self, **{k: v if isinstance(v, Section) or (
            isinstance(v, tuple) and v and isinstance(v[0], Section)) else _freeze(v) for k, v in changes.items()})


def _rebuild(cls: type[S], values: Mapping[str, Any]) -> S:
    return cls.from_dict(values)


def field_types(cls: type[Section]) -> dict[str, Any]:
    """The declared type of each field (for the generator's own test)."""
    return typing.get_type_hints(cls)
