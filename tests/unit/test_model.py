"""The pure model: epochs, attempt tokens, publication names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_dispatch.checkpoint import model
from slurm_dispatch.errors import BadPublicationName, OutOfBounds, OutsideRoot

generations = st.integers(0, 10**8 - 1)
submissions = st.integers(1, 999_999)
restarts = st.integers(0, 999_999)
steps = st.integers(0, 10**20 - 1)
segment = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))
paths = (
    st.lists(segment, min_size=1, max_size=4)
    .map("/".join)
    .filter(lambda p: len(model.encode_path(p)) <= model.NAME_MAX - 42)
)


def test_epoch_formula() -> None:
    assert model.Epoch(0, 1, 0).value == 1_000_000
    assert model.Epoch(3, 2, 1).value == 3_000_002_000_001
    assert int(model.Epoch(0, 999_999, 999_999)) == 999_999_999_999


@given(generations, submissions, restarts)
def test_epoch_round_trip(g: int, n: int, r: int) -> None:
    e = model.Epoch(g, n, r)
    assert model.Epoch.from_value(e.value) == e


@given(generations, submissions, restarts, generations, submissions, restarts)
def test_epoch_order_is_lexicographic_gnr(
    g1: int, n1: int, r1: int, g2: int, n2: int, r2: int
) -> None:
    a, b = model.Epoch(g1, n1, r1), model.Epoch(g2, n2, r2)
    assert (a.value < b.value) == ((g1, n1, r1) < (g2, n2, r2))


@pytest.mark.parametrize(
    "g,n,r,word",
    [
        (-1, 1, 0, "generation -1"),
        (0, 0, 0, "submission 0"),
        (0, 1_000_000, 0, "submission 1000000"),
        (0, 1, -1, "restart -1"),
        (0, 1, 1_000_000, "restart 1000000"),
        (10**8, 1, 0, "generation 100000000"),
        (0, "1", 0, "submission '1'"),
        (True, 1, 0, "generation True"),
    ],
)
def test_epoch_refuses(g: object, n: object, r: object, word: str) -> None:
    with pytest.raises(OutOfBounds, match=word):
        model.Epoch(g, n, r)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 999_999, -5, 10**20, 1_500_000 - 1_000_000])
def test_epoch_value_no_triple_makes_is_refused(value: int) -> None:
    with pytest.raises(OutOfBounds, match=str(value)):
        model.check_epoch_value(value)


def test_attempt_tokens_are_unique_and_well_formed() -> None:
    tokens = {model.new_attempt() for _ in range(20_000)}
    assert len(tokens) == 20_000
    for token in list(tokens)[:100]:
        assert model.check_attempt(token) == token


@pytest.mark.parametrize("bad", ["", "x" * 25, "A" * 26, "../" + "a" * 23, "a" * 27])
def test_attempt_refuses_foreign_tokens(bad: str) -> None:
    with pytest.raises(OutOfBounds, match="attempt"):
        model.check_attempt(bad)


@given(generations, submissions, restarts, steps, paths)
def test_name_round_trip(g: int, n: int, r: int, step: int, path: str) -> None:
    epoch = model.Epoch(g, n, r).value
    name = model.format_name(epoch, step, path)
    assert model.is_name(name)
    assert len(name) <= model.NAME_MAX
    assert "=" not in name and name.count("-") == 2
    pub = model.parse_name(name)
    assert (pub.epoch, pub.step, pub.path) == (epoch, step, path)
    assert pub.name == name


@given(
    st.tuples(generations, submissions, restarts, steps, paths),
    st.tuples(generations, submissions, restarts, steps, paths),
)
def test_name_order_equals_epoch_then_step(a: tuple, b: tuple) -> None:
    ea, eb = model.Epoch(*a[:3]).value, model.Epoch(*b[:3]).value
    na, nb = model.format_name(ea, a[3], a[4]), model.format_name(eb, b[3], b[4])
    if (ea, a[3]) != (eb, b[3]):
        assert (na < nb) == ((ea, a[3]) < (eb, b[3]))
    pa, pb = model.parse_name(na), model.parse_name(nb)
    assert (pa < pb) == (na < nb)


def test_ties_go_to_greatest_name() -> None:
    names = [model.format_name(1_000_000, 7, p) for p in ("exec/b/x", "exec/a/x", "exec/c/x")]
    assert max(model.parse_name(n) for n in names).name == max(names)


@pytest.mark.parametrize(
    "path,word",
    [
        ("", "empty"),
        ("/abs/x", "absolute"),
        ("a/../../x", "climbs"),
        ("..", "climbs"),
        (".", "root itself"),
        ("a\0b", "NUL"),
    ],
)
def test_format_refuses_paths(path: str, word: str) -> None:
    with pytest.raises(OutsideRoot, match=word):
        model.format_name(1_000_000, 1, path)


def test_format_normalises_paths() -> None:
    assert model.parse_name(model.format_name(1_000_000, 1, "./a//b/")).path == "a/b"


def test_format_refuses_long_path_and_steps() -> None:
    with pytest.raises(OutOfBounds, match="too long"):
        model.format_name(1_000_000, 1, "x" * 200)
    with pytest.raises(OutOfBounds, match="step -1"):
        model.format_name(1_000_000, -1, "x")
    with pytest.raises(OutOfBounds, match="step 1" + "0" * 20):
        model.format_name(1_000_000, 10**20, "x")


def _raw_name(epoch: int, step: int, raw: bytes) -> str:
    return f"{epoch:020d}-{step:020d}-{model.encode_path_bytes(raw)}"


@pytest.mark.parametrize(
    "name",
    [
        "garbage",
        "00000000000001000000-00000000000000000005",
        "00000000000001000000-00000000000000000005-",
        "00000000000001000000-00000000000000000005-mzxw6",  # lower case
        "00000000000001000000-00000000000000000005-MZXW6===",  # padding
        "00000000000001000000-00000000000000000005-MZXW6Y",  # impossible length
        "0000000000001000000-00000000000000000005-MZXW6",  # 19 digits
        "00000000000000000000-00000000000000000005-MZXW6",  # epoch 0: no (G, N, R) makes it
        "00000000000001000000-00000000000000000005-MZXW7",  # non-canonical trailing bits
        _raw_name(1_000_000, 5, b"/etc/passwd"),
        _raw_name(1_000_000, 5, b"../outside"),
        _raw_name(1_000_000, 5, b"a/../../outside"),
        _raw_name(1_000_000, 5, b"a//b"),
    ],
)
def test_parse_refuses_and_names_it(name: str) -> None:
    with pytest.raises(BadPublicationName) as info:
        model.parse_name(name)
    assert repr(name) in str(info.value)


def test_encode_paths_is_encode_path_of_each() -> None:
    """Cleanup encodes many paths in one pass (gc's unpublished saves): the same text as one
    by one, whatever each path's length against base32's 5-byte blocks."""
    import random

    rng = random.Random(5)
    paths = ["", "a", "ab", "abc", "abcd", "abcde", "abcdef", "é/ü"] + [
        "".join(rng.choice("ab/=.-_é") for _ in range(rng.randint(1, 40))) for _ in range(500)
    ]
    assert model.encode_paths(paths) == [model.encode_path(p) for p in paths]
