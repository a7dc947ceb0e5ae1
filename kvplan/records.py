"""kvplan's `dataclass`: the standard one, except that a frozen class shares five of its six methods.

`dataclasses.dataclass(frozen=True)` compiles six methods per class, one `exec` each (__init__, __repr__,
__eq__, __hash__, __setattr__, __delattr__), about 0.1 ms apiece on CPython 3.11, and `kvplan estimate`
defines about 70 frozen classes on its way: 420 compilations, 40 ms of a 200 ms start. Here a frozen class
is still a dataclass (`fields`, `replace`, `asdict` work), but only its __init__ is generated. The other
five are the functions below, shared by every frozen class and behaving as dataclass's do: equality and
hash over the tuple of compared fields of the same class (read by one operator.attrgetter per class), the
repr of the repr'd fields, and FrozenInstanceError on any assignment once __init__ has set a field.
Type checkers see `dataclasses.dataclass` itself. Mutable classes (frozen=False) get it unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__record_key__
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(self.__record_key__(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{self.__class__.__qualname__}({shown})"


def _setattr(self: Any, name: str, value: Any) -> None:
    # The generated __init__ sets each field once; any other assignment is refused, as on a frozen dataclass.
    if name in self.__dict__ or name not in self.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _tuple_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """obj -> the tuple of its `names` attributes (attrgetter returns a bare value for one name)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names) if names else lambda obj: ()


def _frozen(cls: type) -> type:
    # frozen=False: the generated __init__ assigns with `self.x = x`, which _setattr lets through once.
    made: type = dataclasses.dataclass(cls, repr=False, eq=False)
    fields = dataclasses.fields(made)
    shared: dict[str, Any] = {
        # staticmethod: the key is a plain function of the instance, not a method bound to it.
        "__record_key__": staticmethod(_tuple_of(tuple(f.name for f in fields if f.compare))),
        "__record_repr__": tuple(f.name for f in fields if f.repr),
        "__eq__": _eq,
        "__hash__": _hash,
        "__repr__": _repr,
        "__setattr__": _setattr,
        "__delattr__": _delattr,
    }
    for name, value in shared.items():
        setattr(made, name, value)
    return made


if TYPE_CHECKING:
    from dataclasses import dataclass
else:

    def dataclass(cls=None, /, *, frozen=False, **options):
        """`@dataclass`, `@dataclass(...)` as in the standard library; `@dataclass(frozen=True)` as above."""
        if not frozen:
            return dataclasses.dataclass(cls, **options) if cls is not None else dataclasses.dataclass(**options)
        if options:
            raise TypeError(f"kvplan.records.dataclass(frozen=True) takes no other options, got {sorted(options)}")
        return _frozen if cls is None else _frozen(cls)
