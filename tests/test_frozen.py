"""fast_init: a cheaper __init__ for frozen, slotted dataclasses that changes nothing else."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field

import pytest

from resetctl.frozen import fast_init
from resetctl.machine import Attempt, AttemptState, Decision, NoticeState
from resetctl.store import Step, StepResult


@dataclass(frozen=True, slots=True)
class Stock:
    name: str
    count: int
    note: str | None = None
    ratio: float = 0.5


@fast_init
@dataclass(frozen=True, slots=True)
class Fast:
    name: str
    count: int
    note: str | None = None
    ratio: float = 0.5


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("a", 1), {}),
        (("a", 1, "n"), {}),
        (("a", 1, "n", 2.0), {}),
        ((), {"name": "a", "count": 1, "ratio": 3.0}),
        (("a",), {"count": 1, "note": None}),
    ],
)
def test_it_builds_what_the_dataclass_would(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """Positional and keyword arguments and defaults land in the same fields."""
    fast, stock = Fast(*args, **kwargs), Stock(*args, **kwargs)  # type: ignore[arg-type]
    assert dataclasses.astuple(fast) == dataclasses.astuple(stock)
    assert repr(fast).removeprefix("Fast") == repr(stock).removeprefix("Stock")
    assert fast == Fast(*args, **kwargs)  # type: ignore[arg-type]
    assert hash(fast) == hash(Fast(*args, **kwargs))  # type: ignore[arg-type]


def test_the_class_stays_frozen_and_replace_still_works() -> None:
    """Assignment and deletion still raise; dataclasses.replace builds through it."""
    fast = Fast("a", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.count = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del fast.name  # type: ignore[misc]
    assert dataclasses.replace(fast, count=2) == Fast("a", 2)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("a",), {}, "count"),
        (("a", 1, "n", 2.0, "extra"), {}, "positional"),
        (("a", 1), {"colour": "red"}, "colour"),
        (("a", 1), {"name": "b"}, "name"),
    ],
)
def test_wrong_arguments_fail_as_they_would(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    """A missing, extra, unknown or doubled argument is a TypeError naming it."""
    with pytest.raises(TypeError, match=message):
        Fast(*args, **kwargs)  # type: ignore[arg-type]


def test_shapes_it_cannot_copy_are_refused_at_import() -> None:
    """A default factory, __post_init__, an InitVar, or a class that is not frozen and
    slotted."""

    @dataclass(frozen=True, slots=True)
    class Factory:
        items: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class PostInit:
        value: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        value: int
        scale: InitVar[int] = 1

    @dataclass(slots=True)
    class Mutable:
        value: int

    @dataclass(frozen=True)
    class Unslotted:
        value: int

    for cls in (Factory, PostInit, WithInitVar, Mutable, Unslotted):
        with pytest.raises(TypeError, match=cls.__name__):
            fast_init(cls)


def test_the_machine_and_store_records_are_still_frozen() -> None:
    """The records a sweep builds per notice refuse assignment after fast_init."""
    attempt = Attempt("email", "k", AttemptState.INTENT, 0.0, 0.0)
    state = NoticeState("n", "queued", 1.0, ("email",), (attempt,))  # type: ignore[arg-type]
    records: list[object] = [attempt, state, StepResult(True, 1)]
    decision = Decision(state.phase, "none", None, None, "terminal")  # type: ignore[arg-type]
    step = Step("n", 1, None, state.phase, decision, True, None, "tick", "w", 0.0)
    for record in [*records, decision, step]:
        first = dataclasses.fields(record)[0].name  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, first, None)
