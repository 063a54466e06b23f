"""A cheaper ``__init__`` for the frozen, slotted dataclasses a sweep builds per notice.

dataclasses gives a frozen class an ``__init__`` that calls ``object.__setattr__`` once
per field, to get past the class's own ``__setattr__`` (which refuses every assignment).
A slot's member descriptor stores the value the same way for about half the cost; a
sweep builds some forty such records per notice (states, attempts, decisions, steps),
so that was a tenth of a lifecycle's time (bench/README.md). The class is unchanged
otherwise: still frozen (assignment raises), with the same fields, defaults, equality,
hash and repr, and ``dataclasses.replace`` still works.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets its slots
    directly. Only plain fields are supported (positional or keyword, with or without a
    default); anything else is a TypeError at import time, never a silent difference."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: fast_init needs @dataclass(frozen=True, slots=True)")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: fast_init does not run __post_init__")
    # The stock __init__'s parameters must be exactly the fields set here (an InitVar, for
    # one, is a parameter but not a field).
    stock = list(inspect.signature(cls.__init__).parameters)[1:]
    if stock != [spec.name for spec in dataclasses.fields(cls)]:  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__}: fast_init supports plain fields only")
    namespace: dict[str, object] = {"__name__": cls.__module__}
    signature: list[str] = []
    body: list[str] = []
    for number, spec in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if (
            not spec.init
            or spec.kw_only
            or spec.default_factory is not dataclasses.MISSING
            or spec.name == "self"
        ):
            raise TypeError(f"{cls.__name__}.{spec.name}: fast_init supports plain fields only")
        setter = f"_set{number}"
        namespace[setter] = getattr(cls, spec.name).__set__  # the slot's member descriptor
        if spec.default is dataclasses.MISSING:
            signature.append(spec.name)
        else:
            namespace[f"_default{number}"] = spec.default
            signature.append(f"{spec.name}=_default{number}")
        body.append(f"    {setter}(self, {spec.name})\n")
    lines = "".join(body) or "    pass\n"
    source = f"def __init__(self, {', '.join(signature)}):\n{lines}"
    exec(source, namespace)  # noqa: S102 - generated from the class's own field names
    init: Any = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - a method assignment mypy would refuse
    return cls
