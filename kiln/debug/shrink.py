"""Shrinking a failing set of nodes: the minifier's search, over node positions 0..n-1 of a graph.

    kept, search = shrink(n, fails, budget=100)   # fails(positions) -> bool, positions sorted

Three strategies, in order, each step kept only where the smaller set still fails:

1. truncate the tail: bisect on the length of a prefix (about log2(n) tests);
2. cut the head: bisect on where the suffix of that prefix starts (about log2(n) more);
3. remove chunks, delta-debugging style: halves, then quarters, ... then single nodes, until no
   single node can go (1-minimal) or the budget is spent.

The bisections assume that a longer prefix (suffix) of a failing one fails too, as it does when the
failure comes from one op or one run of ops; where that is not so they still end on a set that was
seen to fail, only a larger one, which step 3 then shrinks. Answers are cached by set; `fails` is
asked at most `budget` times, and once that is spent every new set counts as not failing, so the
search ends with the smallest failing set found so far.
"""

from __future__ import annotations

from typing import Callable, Sequence

Positions = tuple[int, ...]


class Search:
    """`fails` with its answers cached by set and its calls counted against `budget`.

    Example::

        search = Search(lambda kept: 7 in kept, budget=20)
        search.fails([5, 6, 7])   # True; asked once, answered from the cache after
    """

    def __init__(self, fails: Callable[[Positions], bool], budget: int) -> None:
        self._fails, self.budget = fails, budget
        self.answers: dict[Positions, bool] = {}

    @property
    def tests(self) -> int:
        return len(self.answers)

    @property
    def spent(self) -> bool:
        return self.tests >= self.budget

    def fails(self, kept: Sequence[int]) -> bool:
        key = tuple(kept)
        if not key:
            return False
        if key not in self.answers:
            if self.spent:
                return False
            self.answers[key] = self._fails(key)
        return self.answers[key]


def truncate_tail(search: Search, kept: list[int]) -> list[int]:
    """The shortest prefix of `kept` (which fails) found failing by bisection."""
    lo, hi = 0, len(kept)  # kept[:hi] fails; kept[:lo] is not known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if search.fails(kept[:mid]) else (mid, hi)
    return kept[:hi]


def cut_head(search: Search, kept: list[int]) -> list[int]:
    """The shortest suffix of `kept` (which fails) found failing by bisection."""
    lo, hi = 0, len(kept)  # kept[lo:] fails; kept[hi:] is not known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if search.fails(kept[mid:]) else (lo, mid)
    return kept[lo:]


def remove_chunks(search: Search, kept: list[int]) -> list[int]:
    """`kept` (which fails) without every chunk whose removal leaves it failing: chunks of half its
    length first, then quarters, down to single nodes (delta debugging's complements, one pass per
    chunk size: after a removal the next chunk slides into place and is tried at once)."""
    size = len(kept) // 2
    while size >= 1 and not search.spent:
        start = 0
        while start < len(kept) and len(kept) > 1:
            smaller = kept[:start] + kept[start + size:]
            if search.fails(smaller):
                kept = smaller
            else:
                start += size
        size //= 2
    return kept


def shrink(count: int, fails: Callable[[Positions], bool], budget: int) -> tuple[list[int], Search]:
    """The smallest failing subset of positions 0..count-1 found (all of them fail), and the search.

    Example::

        kept, search = shrink(300, lambda kept: 150 in kept, budget=60)
        kept, search.tests   # [150], about 17
    """
    search = Search(fails, budget)
    search.answers[tuple(range(count))] = True  # the caller saw the whole graph fail
    kept = list(range(count))
    for strategy in (truncate_tail, cut_head, remove_chunks):
        kept = strategy(search, kept)
    return kept, search
