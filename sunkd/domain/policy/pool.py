"""One pool's round: the order in which the policy looks at a pool and decides.

`plan_pool` is a fixed sequence of named steps: take the census and net the demand
(`demand`), pick surplus lends, step every node (transitions, adoption, mirrors, repairs), then
start new moves within `max_in_flight`: forced ones (pins, pool mode) first, then the
ones demand and the min/max knobs ask for. The order is part of the behaviour: ids
are handed out in decision order, and earlier steps mark nodes as touched.
"""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, OwnershipSpec, SlurmdSpec
from sunkd.domain.policy.blocks import is_return_lend
from sunkd.domain.policy.demand import (
    Census,
    PoolDemand,
    job_ends,
    net_demand,
    take_census,
)
from sunkd.domain.policy.fairness import protect_running_pods
from sunkd.domain.policy.holds import mirror_holds
from sunkd.domain.policy.lend import can_lend, lend_order, start_lend, unlock_started
from sunkd.domain.policy.model import (
    MODE_AUTO,
    MODE_KUBERNETES,
    MODE_SLURM,
    PREFER_KUBERNETES,
    VERB_DRAIN,
    PoolSpec,
)
from sunkd.domain.policy.planner import Planner, active_pod_count
from sunkd.domain.policy.reclaim import can_reclaim, start_reclaim
from sunkd.domain.policy.repair import (
    repair_settled,
    repair_while_held,
    report_conflict,
    report_gres,
    report_invalid_pin,
    report_invalid_registration,
    report_unparsed,
)
from sunkd.domain.policy.slurmd import nodes_from_state, nodeset_of, slurmd_args
from sunkd.domain.policy.slurmd import plan as slurmd_plan
from sunkd.domain.policy.slurmdbusy import VERB_SLURMD_LABEL, label_args, label_steps
from sunkd.domain.policy.slurmdfinalizer import DELETE as DELETE_STEP
from sunkd.domain.policy.slurmdfinalizer import DRAIN as DRAIN_STEP
from sunkd.domain.policy.slurmdfinalizer import (
    drain_reason,
    ending_nodeset,
    finalizer_args,
    finalizer_delete_args,
    plan_end,
)
from sunkd.domain.policy.slurmdfinalizer import nodes_from_state as ending_nodes
from sunkd.domain.policy.slurmdupdate import repair_and_update
from sunkd.domain.policy.transitions import adopt_node, handle_transition
from sunkd.domain.slurmdgone import slurmd_nodeset
from sunkd.domain.state import OWNER_NONE, NodeState


def plan_pool(planner: Planner, pool: PoolSpec, members: list[NodeState]) -> None:
    spec = pool.ownership
    census = take_census(planner, members)
    demand = net_demand(planner.state, pool, census)
    surplus_lends = _surplus_lends(spec, census, demand)
    _step_nodes(planner, pool, census, surplus_lends)
    _slurmd_pods(planner, pool, census)
    if not _slurmd_ending(planner, pool, census):
        _start_moves(planner, pool, census, demand)
    for node in census.members:
        # Said only of a node nothing else this round is about (its Warning must not take
        # the round, or the side, of a move or a repair): unknown capacity is no hold.
        if (node.transition is None and node.name not in planner.touched
                and census.assessments[node.name].actionable):
            report_unparsed(planner, node)


def _start_moves(planner: Planner, pool: PoolSpec, census: Census, demand: PoolDemand) -> None:
    """Forced moves (pins, the pool's mode), then the moves demand wants, within budget."""
    spec = pool.ownership
    budget = _move_budget(planner, spec, census)
    if budget == 0:
        return
    lendable = [n for n in census.members if can_lend(planner, n, census.assessments[n.name])]
    reclaimable = [n for n in census.members if can_reclaim(planner, n, census.assessments[n.name])]
    forced_lends, forced_reclaims = _forced_moves(spec, census, lendable, reclaimable)
    budget = _start_forced_moves(planner, pool, census, forced_lends, forced_reclaims, budget)
    # The forced moves used up the budget (nothing more could start), or the pool's mode
    # allows no other moves.
    if budget == 0 or spec.mode != MODE_AUTO:
        return

    forced = {n.name for n in forced_lends} | {n.name for n in forced_reclaims}
    lend_more, reclaim_more = _moves_wanted(planner, spec, census, demand)
    if lend_more > 0:
        candidates = [n for n in lendable if n.name not in forced]
        budget = _start_demand_lends(planner, pool, census, demand, candidates, lend_more, budget)
    if reclaim_more > 0 and budget > 0:
        candidates = [n for n in reclaimable if n.name not in forced]
        _start_demand_reclaims(planner, pool, census, demand, candidates, reclaim_more, budget)


def _surplus_lends(spec: OwnershipSpec, census: Census, demand: PoolDemand) -> set[str]:
    """Lends the demand no longer justifies (not yet handed over), newest first. While a
    block's return runs, its own lends are kept through a drop of the target (Slurm's
    next job heading the queue shrinks the room for lends; the window still says the
    rise is coming: policy/blocks.py), never beyond `max_kubernetes`: the others go
    first, then the return's beyond that bound."""
    lends = census.lends
    surplus_lends: set[str] = set()
    if spec.mode == MODE_AUTO:
        voluntary = [
            n
            for n in lends
            if census.assessments[n.name].pin != wk.OWNER_KUBERNETES
            and n.transition is not None
            and not unlock_started(n, n.transition)
        ]
        surplus = max(len(lends) - demand.lend_target, 0)
        voluntary.sort(
            key=lambda n: (n.transition.started_at if n.transition else 0.0, n.name),
            reverse=True,
        )
        chosen = voluntary[:surplus]
        if demand.block_returning:
            kept = [n for n in voluntary
                    if n.transition is not None and is_return_lend(n.transition.reason)]
            others = [n for n in voluntary if n not in kept]
            chosen = others[:surplus]
            cap = len(lends) if spec.max_kubernetes is None else \
                max(spec.max_kubernetes - census.owned_k8s, 0)
            over = max(len(lends) - len(chosen) - cap, 0)
            chosen += kept[:min(over, surplus - len(chosen))]
        for node in chosen:
            assert node.transition is not None
            surplus_lends.add(node.transition.transition_id)
    return surplus_lends


def _step_nodes(
    planner: Planner, pool: PoolSpec, census: Census, surplus_lends: set[str]
) -> None:
    """Per node: transitions, adoption, mirrors, repairs."""
    spec = pool.ownership
    for node in census.members:
        assessment = census.assessments[node.name]
        if not assessment.actionable:
            continue
        if assessment.conflicts:
            report_conflict(planner, node, assessment)
        elif assessment.invalid_pin is not None:
            report_invalid_pin(planner, node, assessment)
        elif assessment.invalid_registration is not None:
            report_invalid_registration(planner, node, assessment)
        elif assessment.gres_problem is not None:
            report_gres(planner, node, assessment)
        if assessment.identity_conflict:
            continue  # which Node is which is unknown: no action but the Warning
        if node.transition is not None:
            handle_transition(planner, node, assessment, spec, surplus_lends)
        elif node.owner == OWNER_NONE and not assessment.held:
            adopt_node(planner, node, pool)
        mirror_holds(planner, node, assessment)
        if node.transition is None and not assessment.held and node.owner != OWNER_NONE:
            repair_settled(planner, node, assessment)
        elif assessment.held:
            repair_while_held(planner, node, assessment)


def _slurmd_pods(planner: Planner, pool: PoolSpec, census: Census) -> None:
    """A Nodeset with `spec.slurmd`: its slurmd pods follow ownership (`policy/slurmd.py`
    decides; each create or delete is an action on the Kubernetes side, of the node's
    open transition when it has one, so a move that ends takes its queued pod action
    with it: `transitions.stale_action`). A settled Slurm-owned node whose pod is
    missing, ended or unregistered is the repair's (`policy/slurmdrepair.py`: drain,
    delete, recreate with backoff, undrain), not the plan's; so is one whose pod is
    outdated, when the rolling update chose it (`policy/slurmdupdate.py`)."""
    observed = slurmd_nodeset(planner.state, pool.name)
    nodeset = nodeset_of(observed) if observed is not None else None
    if nodeset is None:
        return
    members = {node.name: node for node in census.members}
    views = nodes_from_state(planner.state, nodeset, census.members, planner.now)
    # A Nodeset marked for deletion creates, repairs and updates no pod: its finalizer's
    # steps (`_slurmd_ending`) remove them. Its busy labels stay (the PDB still counts).
    ending = observed is not None and observed.deleting
    repaired = set() if ending else repair_and_update(
        planner, pool, nodeset, census.members, census.assessments)
    for step in () if ending else slurmd_plan(nodeset, views, planner.now,
                                               sources_fresh=planner.state.sources_fresh()):
        node = members.get(step.node)
        if not step.verb or node is None or step.node in repaired:
            continue
        transition = node.transition
        tx = (transition.transition_id if transition is not None
              and transition.transition_id not in planner.ended else None)
        planner.ensure(node, wk.OWNER_KUBERNETES, step.verb, step.reason,
                       slurmd_args(step, nodeset), tx)
    # The busy label under the Nodeset's PDB (`policy/slurmdbusy.py`): after the pod steps
    # (a create or delete this round takes the node's Kubernetes side first), of no
    # transition (it protects whatever the node's owner: a lend waits for its job too).
    for label in label_steps(nodeset, views, sources_fresh=planner.state.sources_fresh()):
        node = members.get(label.node)
        if node is not None:
            planner.ensure(node, wk.OWNER_KUBERNETES, VERB_SLURMD_LABEL, label.reason,
                           label_args(label, nodeset), await_observation=False)


def _slurmd_ending(planner: Planner, pool: PoolSpec, census: Census) -> bool:
    """sunkd's finalizer on the pool's Nodeset (`policy/slurmdfinalizer.py`): put on while
    it has `spec.slurmd`; once it is marked for deletion (or `spec.slurmd` is removed),
    drain each node running a slurmd pod of sunkd's, delete the pod once Slurm reports the
    node drained, idle and in contact, and take the finalizer off once none is left.
    Each is an action like any other; the finalizer's ride on the pool's first member (a
    Nodeset has no node of its own in the log). True when the Nodeset is marked for
    deletion: the pool starts no new move."""
    observed = planner.state.nodesets.get(pool.name)
    nodeset = ending_nodeset(observed) if observed is not None else None
    if nodeset is None or not (nodeset.slurmd or nodeset.ours):
        return False
    members = {node.name: node for node in census.members}
    # Not ending: only the finalizer's presence counts (no node is looked at each round).
    views, known = ending_nodes(nodeset, census.members) if nodeset.ending else ([], True)
    anchor = min(members) if members else None
    grace = observed.slurmd.termination_grace_seconds if observed is not None \
        and observed.slurmd is not None else SlurmdSpec().termination_grace_seconds
    for step in plan_end(nodeset, views, sources_fresh=planner.state.sources_fresh(),
                         all_pods_known=known):
        if step.verb == DRAIN_STEP:
            planner.ensure(members[step.node], wk.OWNER_SLURM, VERB_DRAIN, step.reason,
                           (Label("reason", drain_reason(nodeset)),))
        elif step.verb == DELETE_STEP:
            planner.ensure(members[step.node], wk.OWNER_KUBERNETES, DELETE_STEP, step.reason,
                           finalizer_delete_args(nodeset, step, grace))
        elif step.verb and anchor is not None:
            planner.ensure(members[anchor], wk.OWNER_KUBERNETES, step.verb, step.reason,
                           finalizer_args(nodeset))
    return nodeset.deleting


def _move_budget(planner: Planner, spec: OwnershipSpec, census: Census) -> int:
    """New moves, within max_in_flight: how many may start (transitions ended this round
    no longer count)."""
    lends_open = sum(1 for n in census.lends if n.transition and n.transition.transition_id
                     not in planner.ended)
    reclaims_open = sum(1 for n in census.reclaims if n.transition and n.transition.transition_id
                        not in planner.ended)
    in_flight = lends_open + reclaims_open
    return max(spec.max_in_flight - in_flight, 0)


def _forced_moves(
    spec: OwnershipSpec,
    census: Census,
    lendable: list[NodeState],
    reclaimable: list[NodeState],
) -> tuple[list[NodeState], list[NodeState]]:
    """The lends and reclaims the operator forces, in the order they are started."""
    assessments = census.assessments
    # Forced moves first: pins to the other side, then the pool's mode. They skip
    # dwell and the min/max knobs (the operator asked for exactly this).
    forced_lends = [n for n in lendable if assessments[n.name].pin == wk.OWNER_KUBERNETES]
    forced_reclaims = [n for n in reclaimable if assessments[n.name].pin == wk.OWNER_SLURM]
    if spec.mode == MODE_KUBERNETES:
        pinned_names = {n.name for n in forced_lends}
        forced_lends += [n for n in lendable if n.name not in pinned_names]
    elif spec.mode == MODE_SLURM:
        pinned_names = {n.name for n in forced_reclaims}
        forced_reclaims += [n for n in reclaimable if n.name not in pinned_names]
    return forced_lends, forced_reclaims


def _start_forced_moves(
    planner: Planner,
    pool: PoolSpec,
    census: Census,
    forced_lends: list[NodeState],
    forced_reclaims: list[NodeState],
    budget: int,
) -> int:
    """Start the forced lends, then the forced reclaims, while the budget lasts; return
    the budget left (0 as soon as it ran out)."""
    for node in forced_lends:
        if budget == 0:
            return budget
        pinned = census.assessments[node.name].pin == wk.OWNER_KUBERNETES
        why = "operator pinned the node to kubernetes" if pinned else "pool mode is Kubernetes"
        start_lend(planner, node, pool, why)
        budget -= 1
    for node in forced_reclaims:
        if budget == 0:
            return budget
        pinned = census.assessments[node.name].pin == wk.OWNER_SLURM
        why = "operator pinned the node to slurm" if pinned else "pool mode is Slurm"
        start_reclaim(planner, node, pool, why)
        budget -= 1
    return budget


def _moves_wanted(
    planner: Planner, spec: OwnershipSpec, census: Census, demand: PoolDemand
) -> tuple[int, int]:
    """How many more lends and reclaims demand and the min/max knobs ask for (at most one
    of the two is positive)."""
    lends = census.lends
    reclaims = census.reclaims
    owned_k8s = census.owned_k8s
    # A lend completed in this very round still covers demand (its node is now an idle
    # Kubernetes node, which `idle_k8s` only sees from the next round on); only lends
    # aborted now stop counting. Otherwise every completion would start one more lend.
    lends_covering = sum(1 for n in lends if n.transition
                         and n.transition.transition_id not in planner.aborted)
    lend_more = demand.lend_target - lends_covering
    lend_more = min(lend_more, census.owned_slurm - spec.min_slurm)
    if spec.max_kubernetes is not None:
        lend_more = min(lend_more, spec.max_kubernetes - owned_k8s - len(lends))
    reclaim_more = min(demand.reclaim_target - len(reclaims), owned_k8s - spec.min_kubernetes)
    if spec.max_kubernetes is not None:
        excess = owned_k8s + len(lends) - len(reclaims) - spec.max_kubernetes
        reclaim_more = max(reclaim_more, excess)
    if lend_more > 0 and reclaim_more > 0:
        # Only the floors can ask for both; do not churn both ways at once.
        if spec.prefer == PREFER_KUBERNETES:
            reclaim_more = 0
        else:
            lend_more = 0
    return lend_more, reclaim_more


def _dwell_ok(node: NodeState, spec: OwnershipSpec, now: float) -> bool:
    return node.last_move_at is None or now - node.last_move_at >= spec.dwell_seconds


def _start_demand_lends(
    planner: Planner,
    pool: PoolSpec,
    census: Census,
    demand: PoolDemand,
    lendable: list[NodeState],
    lend_more: int,
    budget: int,
) -> int:
    """Lend up to `lend_more` of the (unforced) lendable nodes past their dwell, idle
    ones first, then those whose jobs end soonest; return the budget left."""
    spec = pool.ownership
    ends = job_ends(planner.state, pool)
    candidates = [n for n in lendable if _dwell_ok(n, spec, planner.now)]
    order = {n.name: lend_order(n, ends) for n in candidates}
    candidates.sort(key=lambda n: order[n.name])
    count = min(lend_more, budget)
    if demand.ahead_by is not None:
        # The lends beyond what pending pods ask for are ahead of a forecast peak: only
        # nodes drained by then (idle, or jobs that end in time; an unknown end is no
        # end: policy/ahead.py, `drained_by`). They come first in lend order.
        in_time = sum(1 for n in candidates
                      if order[n.name][0] == 0 or order[n.name][1] <= demand.ahead_by)
        count = min(count, max(lend_more - demand.ahead_extra, in_time))
    why = (
        demand.ahead_why if demand.ahead_why is not None
        else f"kubernetes needs {demand.k8s_needed} node(s) for pending pool pods"
        if demand.k8s_needed >= spec.min_kubernetes - census.owned_k8s
        else f"min_kubernetes is {spec.min_kubernetes}"
    )
    for node in candidates[:count]:
        start_lend(planner, node, pool, why)
        budget -= 1
    return budget


def _start_demand_reclaims(
    planner: Planner,
    pool: PoolSpec,
    census: Census,
    demand: PoolDemand,
    reclaimable: list[NodeState],
    reclaim_more: int,
    budget: int,
) -> None:
    """Reclaim up to `reclaim_more` of the (unforced) reclaimable nodes past their dwell,
    those running the fewest pool pods first."""
    spec = pool.ownership
    candidates = [n for n in reclaimable if _dwell_ok(n, spec, planner.now)]
    candidates.sort(key=lambda n: (active_pod_count(n), n.name))
    if spec.max_kubernetes is not None and (
        census.owned_k8s + len(census.lends) > spec.max_kubernetes
    ):
        why = f"max_kubernetes is {spec.max_kubernetes}"
    elif demand.slurm_needed > 0:
        why = f"Slurm needs {demand.slurm_needed} node(s) for pending jobs"
        if demand.block_why is not None:
            # The trough's block moves only nodes running no pool pod: the block does not
            # evict (policy/blocks.py); Slurm's next job still may, below.
            why = demand.block_why
            candidates = [n for n in candidates if not active_pod_count(n)]
        floor_met = census.owned_slurm + len(census.reclaims) >= spec.min_slurm
        if floor_met and protect_running_pods(planner.state, pool, census.members,
                                              planner.now):
            if spec.prefer == PREFER_KUBERNETES:
                # Demand evicts pool pods only for Slurm's next job, never those the pool
                # prefers (policy/fairness.py): otherwise only nodes running none move.
                candidates = [n for n in candidates if not active_pod_count(n)]
            else:
                # Kubernetes is starved, or was within the hold: it keeps what it won,
                # idle or not, beyond Slurm's next job (the hysteresis, fairness.py).
                candidates = []
    else:
        why = f"min_slurm is {spec.min_slurm}"
    for node in candidates[: min(reclaim_more, budget)]:
        start_reclaim(planner, node, pool, why)
        budget -= 1
