"""The benchmark's check of a full run: checksums compared over what a query's result decides
(``COMPARE``), since a query whose SQL picks either of tied rows (q18, q19) has more than one
right answer in its other columns."""

from __future__ import annotations

from types import SimpleNamespace

from kit.nexmark import compare_fingerprints

BATCH = {"rows": 3, "auction": (6, 1, 3), "bidder": (10, 2, 5)}


def test_every_batch_column_is_compared_by_default() -> None:
    query = SimpleNamespace()
    same = compare_fingerprints(query, {**BATCH, "version": (9, 1, 5)}, BATCH)  # type: ignore[arg-type]
    assert same.matches
    other = compare_fingerprints(query, {**BATCH, "bidder": (11, 2, 5)}, BATCH)  # type: ignore[arg-type]
    assert not other.matches and "bidder" in other.detail


def test_only_the_declared_columns_and_the_row_count_are_compared() -> None:
    query = SimpleNamespace(COMPARE=["auction"])
    tie_broken_otherwise = {**BATCH, "bidder": (11, 2, 5)}
    assert compare_fingerprints(query, tie_broken_otherwise, BATCH).matches  # type: ignore[arg-type]
    fewer_rows = {**BATCH, "rows": 2}
    assert not compare_fingerprints(query, fewer_rows, BATCH).matches  # type: ignore[arg-type]
