"""``record``: ``@dataclass`` for the classes the one-shot commands create at import (the
settings, the facts, the findings), cheaper to create.

A record is a dataclass (``dataclasses.fields``, ``replace``, ``asdict`` and type
checkers treat it as one) whose ``__eq__``, ``__repr__`` and, when frozen, ``__hash__``
are the functions below, shared by every record, instead of methods ``@dataclass``
writes as source and compiles for each class. They give what ``@dataclass``'s would:
equality of the compared fields' tuples between instances of the same class, the same
repr (``...`` for a recursive one), the same hash, and unhashable when not frozen
(``tests/test_record.py`` holds them to ``@dataclass`` itself). A method the class
defines itself is kept, as ``@dataclass`` keeps it.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")
_records: weakref.WeakSet[type] = weakref.WeakSet()


@functools.cache
def _field_names(cls: type, role: str) -> tuple[str, ...]:
    """The fields of ``cls`` that take part in ``role``: "compare", "repr" or "hash"
    (``field(hash=None)`` follows ``compare``, as in ``@dataclass``)."""
    def takes_part(f: dataclasses.Field[Any]) -> bool:
        if role == "hash" and f.hash is not None:
            return f.hash
        return bool(getattr(f, "compare" if role == "hash" else role))

    return tuple(f.name for f in dataclasses.fields(cls) if takes_part(f))


def _values(obj: Any, role: str) -> tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in _field_names(obj.__class__, role))


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is self.__class__:
        return _values(self, "compare") == _values(other, "compare")
    return NotImplemented


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _field_names(self.__class__, "repr"))
    return f"{self.__class__.__qualname__}({shown})"


def _hash(self: Any) -> int:
    return hash(_values(self, "hash"))


def _defines(cls: type, name: str) -> bool:
    """Whether the class body defines ``name`` (an ``__eq__`` alone sets ``__hash__`` to None)."""
    if name == "__hash__":
        return cls.__dict__.get("__hash__", None) is not None or (
            "__hash__" in cls.__dict__ and "__eq__" not in cls.__dict__)
    return name in cls.__dict__


def _make(cls: type[T], frozen: bool) -> type[T]:
    shared = {"__eq__": _eq, "__repr__": _repr, "__hash__": _hash if frozen else None}
    for name, method in shared.items():
        if not _defines(cls, name):
            setattr(cls, name, method)
    made = dataclasses.dataclass(cls, eq=False, repr=False, frozen=frozen)
    _records.add(made)
    return made


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, frozen: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(cls: type[T] | None = None, /, *, frozen: bool = False) -> Any:
    """``@record`` or ``@record(frozen=True)``, where ``@dataclass`` would be."""
    if cls is None:
        return functools.partial(_make, frozen=frozen)
    return _make(cls, frozen)


def is_record(cls: type) -> bool:
    """Whether ``cls`` was made by ``record`` (a ``@dataclass`` class is not)."""
    return cls in _records
