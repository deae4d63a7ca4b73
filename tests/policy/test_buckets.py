"""Shape buckets: which bound a dynamic size runs in (policy/buckets.py)."""

from __future__ import annotations

import pytest
from trnsim.policy.buckets import Buckets, BucketSpecError, parse


def test_powers_of_two_by_default() -> None:
    b = parse("")
    assert [b.bound(n) for n in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 128]
    assert parse("pow2") == b


def test_listed_bounds_and_sizes_past_the_last() -> None:
    b = parse("128,256,512")
    assert [b.bound(n) for n in (1, 128, 129, 512, 513)] == [128, 128, 256, 512, 513]


def test_exact_turns_bucketing_off() -> None:
    b = parse("exact")
    assert b == Buckets(exact=True)
    assert [b.bound(n) for n in (3, 5, 100)] == [3, 5, 100]


@pytest.mark.parametrize("spec", ["256,128", "0,8", "a,b", "8,8", ","])
def test_a_bad_list_says_what_to_write(spec: str) -> None:
    with pytest.raises(BucketSpecError, match="ascending positive sizes"):
        parse(spec)
