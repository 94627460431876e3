"""Weighted fair share by stride scheduling: which groups get the free slots of one claim. No I/O.

Each group has a virtual time: the jobs it has started divided by its weight.
Slots go one at a time to the runnable group furthest behind, and each slot
advances that group's virtual time by ``1 / weight``; so over time a group of
weight 3 starts three jobs for every one of a group of weight 1, and every
group gets a turn even when groups outnumber slots. A group that comes back
after idling starts at the global virtual time (the lowest among the groups
still busy), so it cannot cash in the turns it missed. A group with a
concurrency limit gets at most ``limit - running`` slots.

The claim runs the allocation in rounds, because a group may turn out to
have fewer runnable rows than it was given (another claim took them, or
there are no more)::

    alloc = Allocation(groups, free=4, global_vtime=g)
    while (wants := alloc.next_round()):
        for name, k in wants.items():
            rows = lease k rows of name          # I/O, in the claim
            alloc.record(name, k, len(rows))
    alloc.vtime_updates(), alloc.global_vtime(), alloc.interleave(rows per group)
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["GroupState", "Allocation", "capacity"]

T = TypeVar("T")


@dataclass(frozen=True)
class GroupState:
    """A group with runnable work, as the claim read it under its row lock."""

    name: str
    weight: int
    vtime: float
    limit: int | None = None  # leased + running jobs allowed at once (None: no limit)
    running: int = 0  # leased + running jobs now (counted only for limited groups)


def capacity(group: GroupState, free: int) -> int:
    """How many of ``free`` slots ``group`` may take: all of them, or what its limit leaves."""
    if group.limit is None:
        return free
    return min(free, max(0, group.limit - group.running))


class Allocation:
    """The free slots of one claim, handed out by stride scheduling over ``groups``."""

    def __init__(self, groups: Sequence[GroupState], free: int, global_vtime: float) -> None:
        self.free = free
        self.global_start = global_vtime
        self.stored = {g.name: float(g.vtime) for g in groups}
        self.caps = {g.name: capacity(g, free) for g in groups}
        eligible = [g for g in groups if self.caps[g.name] > 0]
        # A group back from idling starts at the global virtual time.
        self.vt = {g.name: max(float(g.vtime), global_vtime) for g in eligible}
        self.weight = {g.name: max(1, int(g.weight)) for g in eligible}
        self.got = {g.name: 0 for g in eligible}
        self.exhausted: set[str] = set()
        #: Group names in the order their slots were handed out (one entry per slot).
        self.order: list[str] = []

    def next_round(self) -> dict[str, int]:
        """Slots to ask each group for now (empty when the claim is over).

        Simulates handing the remaining slots out one by one, always to the
        group with the lowest virtual time that still has room, and returns
        how many each group received.
        """
        if self.free <= 0:
            return {}
        heap = [(self.vt[n], n) for n in self.got if n not in self.exhausted and self.got[n] < self.caps[n]]
        heapq.heapify(heap)
        want: dict[str, int] = {}
        sim = dict(self.vt)
        for _ in range(self.free):
            if not heap:
                break
            _, n = heapq.heappop(heap)
            self.order.append(n)
            want[n] = want.get(n, 0) + 1
            sim[n] += 1.0 / self.weight[n]
            if self.got[n] + want[n] < self.caps[n]:
                heapq.heappush(heap, (sim[n], n))
        return want

    def record(self, name: str, asked: int, got: int) -> None:
        """Group ``name`` was asked for ``asked`` rows and leased ``got``; fewer means it has no more to give."""
        self.got[name] += got
        self.vt[name] += got / self.weight[name]
        self.free -= got
        if got < asked:
            self.exhausted.add(name)

    def vtime_updates(self) -> dict[str, float]:
        """The groups whose stored virtual time changed, with the new value."""
        return {n: v for n, v in self.vt.items() if v != self.stored[n]}

    def global_vtime(self) -> float:
        """The new global virtual time: the lowest among groups still busy (it never goes back)."""
        busy = [self.vt[n] for n in self.got if n not in self.exhausted]
        return max(self.global_start, min(busy)) if busy else self.global_start

    def interleave(self, picked: Mapping[str, Sequence[T]]) -> list[T]:
        """``picked`` rows in the order the slots were handed out, so queued jobs start fairly too.

        A slot whose group came back with fewer rows than asked is skipped.
        """
        out: list[T] = []
        cursor = {n: 0 for n in picked}
        for n in self.order:
            rows = picked.get(n, ())
            if cursor.get(n, 0) < len(rows):
                out.append(rows[cursor[n]])
                cursor[n] += 1
        return out
