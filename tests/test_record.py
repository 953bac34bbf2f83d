"""``slurmgpu.record``: each record class against the same class made by ``@dataclass``,
which is what its shared ``__eq__``, ``__repr__`` and ``__hash__`` must match."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from slurmgpu.record import is_record, record


def pair(frozen: bool, body: dict[str, Any], annotations: dict[str, str]) -> tuple[type, type]:
    """The same class body twice: once through ``@dataclass``, once through ``@record``."""
    def make(decorate: Any) -> type:
        cls = type("Thing", (), {**body, "__annotations__": dict(annotations), "__qualname__": "Outer.Thing"})
        return decorate(cls)

    return make(dataclass(frozen=frozen)), make(record(frozen=frozen))


FIELDS = {"a": "int", "b": "list[str]", "c": "float", "hidden": "str", "noise": "int"}
BODY = {"b": field(default_factory=list), "c": 0.5, "hidden": field(default="x", repr=False),
        "noise": field(default=0, compare=False)}
def hash_or_error(obj: object) -> int | type[Exception]:
    """``hash(obj)``, or the type of what it raises."""
    try:
        return hash(obj)
    except Exception as exc:
        return type(exc)


VALUES = [dict(a=1), dict(a=1, b=("x",)), dict(a=1, c=math.nan), dict(a=2, hidden="y"),
          dict(a=1, noise=9), dict(a=-0, c=-0.0)]


@pytest.mark.parametrize("frozen", [False, True])
def test_eq_repr_and_hash_are_the_dataclass_ones(frozen: bool) -> None:
    classic, lean = pair(frozen, BODY, FIELDS)
    for left in VALUES:
        assert repr(lean(**left)) == repr(classic(**left))
        for right in VALUES:
            assert (lean(**left) == lean(**right)) == (classic(**left) == classic(**right)), (left, right)
            assert (lean(**left) != lean(**right)) == (classic(**left) != classic(**right)), (left, right)
        assert hash_or_error(lean(**left)) == hash_or_error(classic(**left))
    same_nan = math.nan  # a tuple compares one object to itself by identity
    assert (lean(a=1, c=same_nan) == lean(a=1, c=same_nan)) == (classic(a=1, c=same_nan) == classic(a=1, c=same_nan))
    assert lean(a=1).__eq__(classic(a=1)) is NotImplemented


def test_hash_fields_follow_dataclass_rules() -> None:
    body = {"x": field(default=0, hash=False), "y": field(default=0, compare=False, hash=True), "z": 0}
    classic, lean = pair(True, body, {"x": "int", "y": "int", "z": "int"})
    for x, y, z in [(1, 2, 3), (0, 5, 3), (4, 0, 0)]:
        assert hash(lean(x, y, z)) == hash(classic(x, y, z))


def test_unhashable_and_mutable_unless_frozen() -> None:
    classic, lean = pair(False, BODY, FIELDS)
    for cls in (classic, lean):
        with pytest.raises(TypeError):
            hash(cls(a=1))
    _, frozen = pair(True, BODY, FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen(a=1).a = 2  # type: ignore[misc]


def test_recursive_repr_as_dataclass() -> None:
    classic, lean = pair(False, {"child": None}, {"child": "Any"})
    loops = []
    for cls in (classic, lean):
        node = cls()
        node.child = [node, cls()]
        loops.append(repr(node))
    assert loops[0] == loops[1] == "Outer.Thing(child=[..., Outer.Thing(child=None)])"


def test_methods_the_class_defines_are_kept() -> None:
    @record(frozen=True)
    class Own:
        n: int

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 7

        def __repr__(self) -> str:
            return "own"

    assert Own(1) == Own(2) and hash(Own(3)) == 7 and repr(Own(1)) == "own"

    @record
    class EqOnly:
        n: int

        def __eq__(self, other: object) -> bool:
            return False

    assert EqOnly(1) != EqOnly(1)
    with pytest.raises(TypeError):
        hash(EqOnly(1))


def test_a_record_is_a_dataclass() -> None:
    @record
    class Base:
        a: int
        tags: list[str] = field(default_factory=list)

    @record
    class Child(Base):
        b: str = "x"

    child = Child(1, ["t"], "y")
    assert dataclasses.is_dataclass(child)
    assert [f.name for f in dataclasses.fields(child)] == ["a", "tags", "b"]
    assert dataclasses.asdict(child) == {"a": 1, "tags": ["t"], "b": "y"}
    assert dataclasses.replace(child, b="z") == Child(1, ["t"], "z")
    assert repr(child) == "test_a_record_is_a_dataclass.<locals>.Child(a=1, tags=['t'], b='y')"
    assert Child(1) != Base(1)


def test_is_record() -> None:
    classic, lean = pair(False, {}, {"a": "int"})
    assert is_record(lean) and not is_record(classic) and not is_record(int)
