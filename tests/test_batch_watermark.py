"""The watermark's arithmetic (DESIGN §6 row 9), as a property: batches committed in any
order, each any number of times, move the watermark only forward, to the contiguous
committed position, and count every item once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.errors import WriteRejected
from ratchet.ledger.base import BatchMark, BatchRun
from ratchet.ledger.ops.batches import merge_mark

RUN = "ratchet:batches:items"


@st.composite
def commits(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[int]]:
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=30))
    bounds: list[tuple[int, int]] = []
    pos = 0
    for size in sizes:
        bounds.append((pos, pos + size))
        pos += size
    order = draw(st.lists(st.integers(0, len(bounds) - 1), min_size=len(bounds),
                          max_size=3 * len(bounds)))
    order += draw(st.permutations(range(len(bounds))))  # every batch at least once
    return bounds, order


@given(commits())
def test_watermark_is_contiguous_monotone_and_counts_each_item_once(
        case: tuple[list[tuple[int, int]], list[int]]) -> None:
    bounds, order = case
    run: BatchRun | None = None
    committed: set[int] = set()
    for step, index in enumerate(order):
        start, end = bounds[index]
        before = run.watermark if run is not None else 0
        run = merge_mark(run, "t", 7, BatchMark(RUN, start, end, end - start), float(step))
        committed.add(index)
        assert run.watermark >= before
        contiguous = 0
        for i, (_start, e) in enumerate(bounds):
            if i not in committed:
                break
            contiguous = e
        assert run.watermark == contiguous  # not the last written position
        assert all(s >= run.watermark for s, _ in run.above)
        assert run.processed == run.committed_items == sum(
            bounds[i][1] - bounds[i][0] for i in committed)
    assert run is not None and run.watermark == bounds[-1][1] and run.above == ()
    done = merge_mark(run, "t", 7, BatchMark(RUN, run.watermark, run.watermark, done=True),
                      99.0)
    assert done.done and done.total == bounds[-1][1]


@pytest.mark.parametrize(("mark", "message"), [
    (BatchMark(RUN, 0, 5, 4), "does not add up"),
    (BatchMark(RUN, 5, 3, 0), "does not add up"),
    (BatchMark(RUN, 0, 5, 6, -1), "does not add up"),
    (BatchMark(RUN, 12, 14, 2), "overlaps"),
    (BatchMark(RUN, 20, 20, done=True), "its watermark is 10"),
])
def test_marks_that_do_not_add_up_are_refused(mark: BatchMark, message: str) -> None:
    run = merge_mark(None, "t", 1, BatchMark(RUN, 0, 10, 10), 0.0)
    run = merge_mark(run, "t", 1, BatchMark(RUN, 13, 20, 7), 1.0)
    assert run.watermark == 10 and run.above == ((13, 20),)
    with pytest.raises(WriteRejected, match=message):
        merge_mark(run, "t", 1, mark, 2.0)
