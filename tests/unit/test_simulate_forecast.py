"""The bridge's shortcuts hold with the forecast on (sunkd/simulate/quiet.py, `_next_due`).

A warm demand summary (every hour wanted 3 of the 4 nodes, no error, 30 min lead) is put
in the controller's state before the run, so the forecast lends from the first hour. The
bridge (changes, `quiet` skips, due times incl. the forecast's hour edges), the bridge
without skips, and the daemon's schedule (every change and every second) must decide
the same things at the same moments.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sunkd.domain.forecast import BUCKETS, DemandSummary
from sunkd.simulate.bridge import POOL, Latencies, SunkdController
from sunkd.simulate.metrics import Targets, measure
from sunkd.simulate.world import World
from tests.unit.test_simulate_bridge import HOUR, KNOBS, Watched, small_workload

WARM = DemandSummary(means=(3.0,) * BUCKETS, samples=(5,) * BUCKETS, lead=1800.0,
                     leads_seen=3)


@pytest.mark.parametrize(("seed", "backlog", "prefer"), [(4, 3, "Slurm"), (5, 0, "Kubernetes")])
def test_with_the_forecast_the_bridge_decides_what_a_1s_tick_decides(
    seed: int, backlog: int, prefer: str
) -> None:
    workload = small_workload(seed, hours=3, backlog=backlog)
    knobs = replace(KNOBS, prefer=prefer, forecast=True)
    outcomes = []
    for options in ({}, {"exact": True}, {"reference": True}):
        world = World(workload, 4, 1, drain_limit=2 * HOUR)
        controller = SunkdController(world, knobs, Latencies(), check=True, **options)
        controller.state = replace(controller.state, demand_history={POOL: WARM})
        watched = Watched(world, controller)
        world.run()
        assert watched.broken == [] and controller.stats.problems == []
        report = measure(world, "sunkd", 3, 1, Targets(),
                         moves=controller.stats.lends + controller.stats.reclaims)
        outcomes.append((controller.digest(), report.pod_pending_s, report.moves))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    world = World(workload, 4, 1, drain_limit=2 * HOUR)
    cold = SunkdController(world, knobs, Latencies())
    world.run()
    assert cold.digest() != outcomes[0][0]  # the warm forecast did move nodes


# A trough from 22:00 to 02:00 (1 node wanted, 5 otherwise) on a 6-node pool lent 5: the
# 3-hour runs start in it at 00:00; the block goes back from 01:40 (four nodes, two at a
# time, 10 min lead).
TROUGH = DemandSummary(means=tuple(1.0 if h in (22, 23, 0, 1) else 5.0 for h in range(BUCKETS)),
                       samples=(5,) * BUCKETS, lead=600.0, leads_seen=3)


@pytest.mark.parametrize("seed", [2, 3])
def test_with_daily_blocks_the_bridge_decides_what_a_1s_tick_decides(seed: int) -> None:
    workload = small_workload(seed, hours=3, nodes=6, backlog=6)
    knobs = replace(KNOBS, prefer="Slurm", forecast=True, forecast_block_hours=2.0)
    outcomes = []
    for options in ({}, {"exact": True}, {"reference": True}):
        world = World(workload, 6, 5, drain_limit=2 * HOUR)
        controller = SunkdController(world, knobs, Latencies(), check=True, **options)
        controller.state = replace(controller.state, demand_history={POOL: TROUGH})
        watched = Watched(world, controller)
        world.run()
        assert watched.broken == [] and controller.stats.problems == []
        report = measure(world, "sunkd", 1, 5, Targets(),
                         moves=controller.stats.lends + controller.stats.reclaims)
        outcomes.append((controller.digest(), report.pod_pending_s, report.moves))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    world = World(workload, 6, 5, drain_limit=2 * HOUR)
    plain = SunkdController(world, replace(knobs, forecast_block_hours=0.0), Latencies())
    plain.state = replace(plain.state, demand_history={POOL: TROUGH})
    world.run()
    assert plain.digest() != outcomes[0][0]  # the block moved nodes otherwise
