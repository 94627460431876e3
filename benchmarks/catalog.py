"""Every scenario, by the name ``--scenarios`` takes, in the order a run goes through them.

throughput, map, efficiency, dag, claim, latency, memory   benchmarks/scenarios.py
durable, coldstart, roundtrip, timeout                      benchmarks/perjob.py   (issue 18)
drain, scaleout, swarm, idle, connections                   benchmarks/scaleout.py (issues 16, 18)
"""

from __future__ import annotations

from collections.abc import Callable

from . import perjob, scaleout, scenarios
from .scenarios import Context, Row

SCENARIOS: dict[str, Callable[[Context, str], list[Row]]] = {
    "throughput": scenarios.throughput,
    "map": scenarios.map_scenario,
    "efficiency": scenarios.efficiency,
    "dag": scenarios.dag,
    "claim": scenarios.claim,
    "latency": scenarios.latency,
    "memory": scenarios.memory,
    "durable": perjob.durable,
    "coldstart": perjob.coldstart,
    "roundtrip": perjob.roundtrip,
    "timeout": perjob.timeout,
    "drain": scaleout.drain,
    "scaleout": scaleout.scaleout,
    "swarm": scaleout.swarm,
    "idle": scaleout.idle,
    "connections": scaleout.connections,
}
