"""The stride allocation behind every claim, without a database.

A claim hands its free slots to groups with :class:`Allocation`; these tests
run claims in a loop against in-memory "groups" (a count of runnable rows
each) and carry the virtual times from one claim to the next, as the
``groups`` table does.
"""

from __future__ import annotations

from collections import Counter

import pytest

from dbexecutor.store.fairshare import Allocation, GroupState, capacity


class World:
    """Groups with runnable rows, their stored virtual times, and the global virtual time."""

    def __init__(self, weights: dict[str, int], rows: dict[str, int] | None = None, limits: dict[str, int] | None = None):
        self.weights = weights
        self.rows = dict(rows or {g: 10**9 for g in weights})
        self.limits = limits or {}
        self.vtime = {g: 0.0 for g in weights}
        self.global_vtime = 0.0
        self.started: Counter[str] = Counter()

    def claim(self, free: int, running: dict[str, int] | None = None) -> list[str]:
        """One claim: the groups of the slots it leased, in dispatch order."""
        groups = [
            GroupState(g, self.weights[g], self.vtime[g], self.limits.get(g), (running or {}).get(g, 0))
            for g in sorted(self.weights)
            if self.rows[g] > 0
        ]
        alloc = Allocation(groups, free, self.global_vtime)
        picked: dict[str, list[str]] = {}
        while wants := alloc.next_round():
            for name, k in wants.items():
                got = min(k, self.rows[name])
                self.rows[name] -= got
                picked.setdefault(name, []).extend([name] * got)
                alloc.record(name, k, got)
        self.vtime.update(alloc.vtime_updates())
        new_global = alloc.global_vtime()
        assert new_global >= self.global_vtime, "the global virtual time never goes back"
        self.global_vtime = new_global
        order = alloc.interleave(picked)
        self.started.update(order)
        return order


def test_slots_are_shared_in_proportion_to_weight():
    world = World({"heavy": 3, "light": 1})
    for _ in range(100):
        world.claim(4)
    assert world.started["heavy"] == 300 and world.started["light"] == 100


def test_every_group_gets_a_turn_when_groups_outnumber_slots():
    world = World({f"g{i}": 1 for i in range(7)})
    seen: list[set[str]] = []
    for _ in range(7):
        seen.append(set(world.claim(1)))
    assert set().union(*seen) == set(world.weights), "seven single-slot claims serve all seven groups"
    for _ in range(693):
        world.claim(1)
    assert set(world.started.values()) == {100}


def test_a_limit_caps_the_group_and_the_rest_goes_to_others():
    world = World({"api": 1, "batch": 1}, limits={"api": 2})
    order = world.claim(6, running={"api": 1})
    assert Counter(order) == {"api": 1, "batch": 5}
    assert capacity(GroupState("api", 1, 0.0, limit=2, running=5), 6) == 0
    assert capacity(GroupState("free", 1, 0.0), 6) == 6


def test_a_paused_group_gets_nothing():
    world = World({"paused": 5, "other": 1}, limits={"paused": 0})
    assert world.claim(3) == ["other"] * 3


def test_a_group_back_from_idle_does_not_cash_in_missed_turns():
    world = World({"busy": 1, "idle": 1}, rows={"busy": 10**9, "idle": 0})
    for _ in range(50):
        world.claim(2)
    assert world.started["busy"] == 100
    world.rows["idle"] = 10**9  # it comes back
    order = [g for _ in range(10) for g in world.claim(2)]
    # From now on it gets its fair half, not the 100 turns it missed.
    assert Counter(order) == {"busy": 10, "idle": 10}


def test_a_group_with_fewer_rows_than_its_share_leaves_the_rest_to_others():
    world = World({"a": 1, "b": 1}, rows={"a": 1, "b": 100})
    order = world.claim(6)
    assert Counter(order) == {"a": 1, "b": 5}
    # a ran dry: its virtual time stops moving, b's keeps going, and the global
    # time follows the groups that are still busy.
    assert world.vtime["a"] == 1.0 and world.vtime["b"] == 5.0
    assert world.global_vtime == 5.0


def test_dispatch_order_interleaves_the_groups_as_slots_were_handed_out():
    world = World({"a": 1, "b": 1, "c": 2})
    order = world.claim(8)
    assert Counter(order) == {"a": 2, "b": 2, "c": 4}
    # No group's jobs come in one block: a child's queue starts fairly too.
    assert order[:4].count("c") == 2 and {"a", "b"} <= set(order[:4])


@pytest.mark.parametrize("free", [0, -1])
def test_no_free_slots_no_rounds(free):
    alloc = Allocation([GroupState("a", 1, 0.0)], free, 0.0)
    assert alloc.next_round() == {}
    assert alloc.interleave({"a": []}) == []
