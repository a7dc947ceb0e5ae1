"""kvplan.records.dataclass(frozen=True) behaves as the standard frozen dataclass, with shared methods."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from kvplan.records import dataclass


@dataclass(frozen=True)
class Spec:
    layers: int
    name: str = "full"
    note: str = dataclasses.field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class Sliding(Spec):
    window: int = 128


@dataclasses.dataclass(frozen=True)
class StdSpec:
    layers: int
    name: str = "full"
    note: str = dataclasses.field(default="", compare=False, repr=False)


def test_equality_hash_and_repr_are_the_standard_ones():
    a, b = Spec(32), Spec(32, note="other")
    assert a == b and hash(a) == hash(b)  # note is compare=False
    assert a != Spec(32, "sliding")
    assert hash(a) == hash(StdSpec(32))  # both hash the tuple of compared fields
    assert a != StdSpec(32) and Sliding(32) != Spec(32)  # another class is never equal
    assert repr(Sliding(2, window=4)) == "Sliding(layers=2, name='full', window=4)"
    assert repr(a) == repr(StdSpec(32)).replace("StdSpec", "Spec")


def test_a_record_is_frozen_and_still_a_dataclass():
    a = Spec(32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers = 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.extra = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        del a.name
    assert dataclasses.replace(a, layers=16) == Spec(16)
    assert dataclasses.asdict(Sliding(1)) == {"layers": 1, "name": "full", "note": "", "window": 128}
    assert [f.name for f in dataclasses.fields(Sliding)] == ["layers", "name", "note", "window"]


def test_mutable_classes_get_the_standard_dataclass():
    @dataclass
    class Tally:
        n: int = 0

    t = Tally()
    t.n += 1
    assert t == Tally(1) and repr(t).endswith("Tally(n=1)")
    with pytest.raises(TypeError, match="no other options"):
        dataclass(frozen=True, order=True)


def test_every_frozen_class_in_kvplan_uses_the_shared_methods():
    # A frozen class made by the standard decorator compiles five more methods at import (kvplan.records).
    root = pathlib.Path(__file__).parent.parent / "kvplan"
    offenders = [
        str(p.relative_to(root)) for p in root.rglob("*.py")
        if "@dataclass(frozen=True)" in (text := p.read_text())
        and re.search(r"^from dataclasses import [^\n]*\bdataclass\b", text, re.M)
    ]
    assert offenders == []
