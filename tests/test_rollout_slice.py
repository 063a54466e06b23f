"""The traffic slice (issue 26, item 5): ``[rollout] percent = N`` takes a deterministic
N % of new idempotency keys (a plain SHA-256 of the key, the same on every host); the
rest are answered ``"in_slice": false`` and stored as no notice, and a retry answers the
same whatever the percent has become. Both backends where a store is involved."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.ops import health
from resetctl.rollout import SLICE_MEMORY, in_slice, slice_bound, slice_point
from resetctl.store import Store

#: Keys whose slice points are pinned: a change of the hash (or of its domain prefix)
#: would move keys across a slice in the middle of a rollout, so it must fail here.
PINNED = {
    "r-1": 13220934357057524542,
    "reset-1": 2437627621565859323,
    "ünïcødé-key": 9970131969748791386,
}
#: How often a uniform slice point may miss the tolerance on some set of keys.
ALPHA = 1e-9
KEYS = 10_000


def binomial_tolerance(n: int, p: float, alpha: float = ALPHA) -> int:
    """The smallest whole t with P(|X - np| > t) <= alpha for X ~ Binomial(n, p): how far
    a count of keys in the slice may stray from N % when slice points are uniform. The
    keys below are fixed, so the counts are too and the test cannot flake; the bound
    says a correct hash fails it for at most one key set in a billion, while a slice off
    by a fifth (or one that reads only a few bits) is far outside it."""
    log_p, log_q = math.log(p), math.log1p(-p)
    mean = n * p
    by_distance = sorted(
        (
            (
                abs(k - mean),
                math.exp(
                    math.lgamma(n + 1)
                    - math.lgamma(k + 1)
                    - math.lgamma(n - k + 1)
                    + k * log_p
                    + (n - k) * log_q
                ),
            )
            for k in range(n + 1)
        ),
        reverse=True,
    )
    tail = 0.0
    for distance, mass in by_distance:
        if tail + mass > alpha:
            return math.ceil(distance)
        tail += mass
    return 0


def sequential_keys() -> list[str]:
    return [f"reset-{i}" for i in range(KEYS)]


def random_keys() -> list[str]:
    """UUID-shaped keys from a fixed seed (an application's request ids)."""
    rng = random.Random(26)
    return [f"{rng.getrandbits(128):032x}" for _ in range(KEYS)]


def test_a_keys_slice_point_is_pinned() -> None:
    """The slice point is SHA-256 of the domain prefix and the key, the same in every
    process and on every host (never Python's per-process salted hash)."""
    assert {key: slice_point(key) for key in PINNED} == PINNED
    assert (in_slice("reset-1", 50), in_slice("r-1", 50)) == (True, False)


@pytest.mark.parametrize("percent", [1, 5, 10, 25, 50, 90])
@pytest.mark.parametrize("keys", [sequential_keys, random_keys], ids=["sequential", "random"])
def test_the_slice_is_close_to_n_percent_of_10000_keys(percent: int, keys: Any) -> None:
    """Over 10,000 keys, sequential or random, the slice holds N % of them within the
    binomial tolerance at one in a billion (about six standard deviations)."""
    taken = sum(in_slice(key, percent) for key in keys())
    tolerance = binomial_tolerance(KEYS, percent / 100)
    assert abs(taken - KEYS * percent / 100) <= tolerance, (taken, tolerance)


def test_the_tolerance_is_tight_enough_to_catch_a_wrong_slice() -> None:
    """The bound is about six standard deviations: at 10 % of 10,000 keys a slice a fifth
    off (1,200 or 800 keys for 1,000) falls outside it, as does one at 1 % that is off
    by seven tenths."""
    assert binomial_tolerance(KEYS, 0.10) == pytest.approx(6.1 * math.sqrt(KEYS * 0.1 * 0.9), 0.1)
    assert binomial_tolerance(KEYS, 0.10) < 200
    assert binomial_tolerance(KEYS, 0.01) < 70


def test_raising_the_percent_only_adds_keys() -> None:
    """Every key in a 5 % slice is in the 20 % one and the 100 % one; 0 % takes none."""
    keys = sequential_keys()[:2000]
    five = {k for k in keys if in_slice(k, 5)}
    twenty = {k for k in keys if in_slice(k, 20)}
    assert five < twenty
    assert all(in_slice(k, 100) for k in keys)
    assert not any(in_slice(k, 0) for k in keys)
    assert slice_bound(100) == 2**64


def sliced(percent: float) -> Settings:
    """Settings with ``[rollout] percent``."""
    return make_settings(rollout={"percent": percent})


def count(store: Store, table: str) -> int:
    (rows,) = store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(rows)


def test_a_key_out_of_the_slice_gets_its_line_and_nothing_else(
    store: Store, clock: FakeClock
) -> None:
    """At 50 %: a key out of the slice is answered notice_id null, created false,
    "in_slice": false; no notice, secret, limit count or refusal is stored for it; a key
    in the slice is a notice as ever, and its line does not mention the slice."""
    settings = make_settings(
        rollout={"percent": 50}, policy={"default": {"limits": {"per_recipient": 5}}}
    )
    requests = [reset_request(phone=f"+1415555{i:04d}") for i in range(40)]
    results = enqueue(store, settings, requests, clock())
    inside = [r for r in results if r.in_slice]
    outside = [r for r in results if not r.in_slice]
    assert [r.in_slice for r in results] == [in_slice(q["idempotency_key"], 50) for q in requests]
    assert inside
    assert outside
    for result in outside:
        assert result.to_json() == {
            "notice_id": None,
            "idempotency_key": result.idempotency_key,
            "created": False,
            "in_slice": False,
        }
    assert all("in_slice" not in r.to_json() and r.created for r in inside)
    assert count(store, "notices") == count(store, "notice_secrets") == len(inside)
    (subjects,) = store.conn.execute(
        "SELECT COUNT(DISTINCT subject) FROM limit_counts WHERE rule = 'recipient'"
    ).fetchone()
    assert subjects == 2 * len(inside)  # each in-slice notice's email and phone, no other
    assert count(store, "refusals") == 0
    assert health(store, clock(), 3600)["rollout"]["out_of_slice"] == {"default": len(outside)}


def test_a_retry_answers_the_same_whatever_the_percent_becomes(
    store: Store, clock: FakeClock
) -> None:
    """Answered at 10 %, retried at 100 %: a key out of the slice stays out (the
    application sent it by its own path) and a new key is in; lowered to 0 %, a key
    that names a notice is answered by its notice."""
    requests = [reset_request() for _ in range(60)]
    first = enqueue(store, sliced(10), requests, clock())
    out = [q for q, r in zip(requests, first, strict=True) if not r.in_slice]
    kept = [q for q, r in zip(requests, first, strict=True) if r.in_slice]
    assert out
    assert kept
    clock.advance(60)
    raised = enqueue(store, sliced(100), [*out, reset_request()], clock())
    assert [r.in_slice for r in raised] == [False] * len(out) + [True]
    assert raised[-1].created
    lowered = enqueue(store, sliced(0), kept, clock())
    assert [(r.in_slice, r.created) for r in lowered] == [(True, False)] * len(kept)
    assert [r.notice_id for r in lowered] == [
        r.notice_id for q, r in zip(requests, first, strict=True) if q in kept
    ]
    assert count(store, "notices") == len(kept) + 1


def test_a_key_answered_out_and_reused_with_other_fields_is_refused(
    store: Store, clock: FakeClock
) -> None:
    """A key out of the slice keeps its request digest: the same key with another link
    is an input error naming the line, and nothing of that call is written."""
    out = next(k for k in (f"reuse-{i}" for i in range(100)) if not in_slice(k, 50))
    enqueue(store, sliced(50), [reset_request(idempotency_key=out)], clock())
    with pytest.raises(InputError) as refused:
        enqueue(
            store,
            sliced(50),
            [reset_request(), reset_request(idempotency_key=out, reset_url="https://x.example/o")],
            clock(),
        )
    assert refused.value.problems == ["line 2: idempotency_key: already used with different fields"]
    assert count(store, "notices") + count(store, "slice_answers") == 1


def test_a_key_twice_in_one_batch_out_of_the_slice_must_match_itself(
    store: Store, clock: FakeClock
) -> None:
    """The same key out of the slice on two lines with other fields is refused, as for a
    notice; with the same fields both lines get the same answer."""
    out = next(k for k in (f"twice-{i}" for i in range(100)) if not in_slice(k, 50))
    request = reset_request(idempotency_key=out)
    first, second = enqueue(store, sliced(50), [request, dict(request)], clock())
    assert (first.in_slice, second.in_slice) == (False, False)
    other = reset_request(idempotency_key=out + "-b")
    while in_slice(other["idempotency_key"], 50):
        other = reset_request(idempotency_key=other["idempotency_key"] + "b")
    with pytest.raises(InputError, match="line 2: idempotency_key: already used"):
        enqueue(store, sliced(50), [other, {**other, "reset_url": "https://x.example/2"}], clock())


def test_shadow_and_a_slice_together(store: Store, clock: FakeClock) -> None:
    """percent and mode = "shadow" compose: keys in the slice become shadow notices
    (sent nowhere), the others are answered out of the slice."""
    settings = make_settings(rollout={"percent": 30, "mode": "shadow"})
    requests = [reset_request() for _ in range(30)]
    results = enqueue(store, settings, requests, clock())
    run_sweep(store, settings, clock)
    for request, result in zip(requests, results, strict=True):
        key_in = in_slice(request["idempotency_key"], 30)
        assert (result.in_slice, result.shadow) == (key_in, key_in)
    assert store.outbox_messages() == []
    figures = health(store, clock(), 3600)["rollout"]
    assert figures["would_send"] == {"default": {"email": sum(r.in_slice for r in results)}}
    assert figures["out_of_slice"] == {"default": sum(not r.in_slice for r in results)}


def test_enqueue_send_answers_out_of_the_slice_without_sending(
    store: Store, clock: FakeClock
) -> None:
    """With send, a key out of the slice gets its line without submitted, reason or
    phase (nothing was committed to send); the others are submitted as usual."""
    requests = [reset_request() for _ in range(20)]
    results = enqueue(store, sliced(50), requests, clock(), send=True, clock=clock)
    for result in results:
        shape = result.to_json()
        if result.in_slice:
            assert shape["submitted"] is True
        else:
            assert "submitted" not in shape
    assert len(store.outbox_messages()) == sum(r.in_slice for r in results)


def test_answers_past_their_keeping_are_folded_and_health_still_counts_them(
    store: Store, clock: FakeClock
) -> None:
    """An answer is kept while its link can live and two days at least; the next
    enqueue that answers out of the slice folds older ones into the daily aggregates,
    so health over a longer window counts the same."""
    first = enqueue(store, sliced(20), [reset_request() for _ in range(30)], clock())
    out = sum(not r.in_slice for r in first)
    assert count(store, "slice_answers") == out
    clock.advance(SLICE_MEMORY + 3600)
    later = enqueue(store, sliced(20), [reset_request() for _ in range(30)], clock())
    more = sum(not r.in_slice for r in later)
    assert count(store, "slice_answers") == more
    figures = health(store, clock(), 5 * 86400)["rollout"]["out_of_slice"]
    assert figures == {"default": out + more}
    assert health(store, clock(), 60)["rollout"]["out_of_slice"] == {"default": more}


def test_the_command_line_prints_in_slice_false(db: str, tmp_path: Path) -> None:
    """``resetctl enqueue`` with [rollout] percent prints one line per request, the ones
    out of the slice with "in_slice": false, and exits 0."""
    config = tmp_path / "rollout.toml"
    config.write_text("[rollout]\npercent = 50\n", encoding="utf-8")
    requests = [reset_request() for _ in range(10)]
    done = resetctl(
        "enqueue",
        "--config",
        str(config),
        db=db,
        input="\n".join(json.dumps(r) for r in requests) + "\n",
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line.get("in_slice", True) for line in lines] == [
        in_slice(r["idempotency_key"], 50) for r in requests
    ]
    assert all(line["notice_id"] is None for line in lines if "in_slice" in line)
