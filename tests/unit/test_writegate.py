"""The write gate (sunkd/store/writegate.py): one writer at a time, lease operations before
waiting appends, first come first served otherwise, and no cancellation can leave it held."""

from __future__ import annotations

import asyncio

import pytest

from sunkd.store.writegate import WriteGate


async def _hold(gate: WriteGate, name: str, order: list[str], *, urgent: bool = False,
                seconds: float = 0.01) -> None:
    async with gate.hold(urgent=urgent):
        order.append(name)
        await asyncio.sleep(seconds)


async def test_urgent_waiters_go_before_normal_ones_and_each_queue_is_fifo() -> None:
    gate = WriteGate()
    order: list[str] = []
    first = asyncio.create_task(_hold(gate, "first", order, seconds=0.05))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(_hold(gate, f"append{i}", order)) for i in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(_hold(gate, f"lease{i}", order, urgent=True)) for i in range(2)]
    await asyncio.gather(first, *tasks)
    assert order == ["first", "lease0", "lease1", "append0", "append1", "append2"]
    assert not gate.held and gate.waiting() == 0


async def test_one_holder_at_a_time() -> None:
    gate = WriteGate()
    inside = 0
    most = 0

    async def writer(urgent: bool) -> None:
        nonlocal inside, most
        async with gate.hold(urgent=urgent):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)
            inside -= 1

    await asyncio.gather(*(writer(i % 3 == 0) for i in range(50)))
    assert most == 1 and not gate.held


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    gate = WriteGate()
    order: list[str] = []
    first = asyncio.create_task(_hold(gate, "first", order, seconds=0.05))
    await asyncio.sleep(0)
    doomed = asyncio.create_task(_hold(gate, "doomed", order, urgent=True))
    after = asyncio.create_task(_hold(gate, "after", order))
    await asyncio.sleep(0)
    doomed.cancel()
    await asyncio.gather(first, after)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert order == ["first", "after"] and not gate.held


async def test_a_waiter_cancelled_as_the_gate_is_handed_to_it_passes_it_on() -> None:
    gate = WriteGate()
    order: list[str] = []
    async with gate.hold():
        doomed = asyncio.create_task(_hold(gate, "doomed", order))
        after = asyncio.create_task(_hold(gate, "after", order))
        await asyncio.sleep(0)
    # Released: the gate is now doomed's, but doomed is cancelled before it runs.
    doomed.cancel()
    await asyncio.gather(doomed, after, return_exceptions=True)
    assert order == ["after"] and not gate.held and gate.waiting() == 0


async def test_a_holder_cancelled_inside_releases() -> None:
    gate = WriteGate()
    order: list[str] = []
    holder = asyncio.create_task(_hold(gate, "holder", order, seconds=10))
    await asyncio.sleep(0)
    assert gate.held
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert not gate.held
    await asyncio.wait_for(_hold(gate, "next", order), 1)
    assert order == ["holder", "next"]
