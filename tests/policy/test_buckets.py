"""Shape buckets: which bound a dynamic size runs in (policy/buckets.py)."""

from __future__ import annotations

import pytest
from trnsim.policy.buckets import Buckets, BucketSpecError, DynamicSizes, parse


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


# -- eager ops' dynamic sizes (DynamicSizes) --------------------------------------------------
def test_one_size_met_with_seven_values_turns_dynamic_and_compiles_the_buckets_met() -> None:
    sizes = DynamicSizes(parse(""))
    assert [sizes.bucket("mm", (n, 64)) for n in (5, 9, 3, 12, 7, 6)] == [[]] * 6
    # the seventh: its bucket first, then the buckets of the sizes met before
    assert sizes.bucket("mm", (10, 64)) == [(16, 64), (8, 64), (4, 64)]
    assert sizes.bucket("mm", (11, 64)) == [(16, 64)]
    assert sizes.bucket("mm", (16, 64)) == []  # (its own size is its bucket's)
    assert sizes.dynamic("mm") == (frozenset({0}), "3, 5, 6, 7, 9, 10, 12")
    assert sizes.bucket("other", (11, 64)) == []  # (another family: another op or line)


def test_one_size_is_every_position_holding_it_and_only_those() -> None:
    sizes = DynamicSizes(parse(""))
    for n in (5, 9, 3, 12, 7, 6, 10):  # (n, 64) @ (64, 256) -> out (n, 256); and (n, 128) ...
        sizes.bucket("mm.out", (n, 64, 64, 256, n, 256))
        sizes.bucket("mm.out", (n, 128, 128, 64, n, 64))
    assert sizes.dynamic("mm.out")[0] == {0, 4}
    assert sizes.bucket("mm.out", (13, 128, 128, 64, 13, 64))[0] == (16, 128, 128, 64, 16, 64)


def test_a_models_own_shapes_stay_exact() -> None:
    sizes = DynamicSizes(parse(""))
    widths = [(34, 64, 64, 128), (34, 128, 128, 64), (34, 64, 64, 32), (34, 64, 64, 1000)]
    assert [sizes.bucket("linear", w) for w in widths] == [[]] * 4  # (few values of a size)
    # two sizes changing at once (a layer's input and output widths) are not one size
    pairs = [(34, a, a, b) for a, b in ((3, 5), (6, 7), (9, 11), (13, 15), (17, 19), (21, 23))]
    assert [sizes.bucket("pairs", p) for p in pairs + pairs[:2]] == [[]] * 8


def test_exact_buckets_nothing() -> None:
    sizes = DynamicSizes(parse("exact"))
    assert [sizes.bucket("mm", (n, 64)) for n in range(1, 12)] == [[]] * 11
