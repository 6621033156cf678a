"""Fair shares of the engine, after the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024). Each group (a class) has a counter of the service its requests were given over its weight, and
each client (a student) one within its group; the least-served group goes next, within it the least-served client,
first come, first served within a client. The counters decide who takes a free slot and who gets the step's prompt
budget, so the server never idles while anyone waits (but for the slots the scheduler keeps for students reading an
answer, scheduler.py).

Service is counted in answer tokens: each generated token is 1 (a decode row), a prompt token what it adds to a
step over one row of a full batch (step_cost.py), PROMPT_COST before both are measured. Cached prompt tokens are
not computed, so never charged.

What a client holds is bounded by `slot_shares`: while a client waits with fewer slots than its max-min fair share,
one holding more than its own gives a slot back (the scheduler parks a request, which resumes later where it was),
else a student who opened eight chats first keeps eight slots until their answers end, however the counters order
the queue (docs/measurements/2026-12-05-fairness.md).

A client or group with no request in the engine that sends one starts no lower than the least counter among those
that have (or, when none has, the counter of the last one to leave): idle time banks no credit, and nobody pays for
having been served while others were idle. Pure Python.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .request import Share
from .step_cost import StepCost

ANSWER_COST = 1.0  # the unit: a generated token, one row of a decode step
# A prompt token in answer tokens until the step costs are measured: VTC's prices (input 1, output 2). A prompt
# token goes through the model with many others at once, a decode row alone with its slot's whole cache.
PROMPT_COST = 0.5
FORGET_AT = 256  # idle counters kept before those that no longer matter are forgotten


def prompt_cost(costs: StepCost, rows: int, start: int, length: int) -> float:
    """`length` prompt tokens from position `start`, in answer tokens: the seconds they add to a step over the seconds
    of one row of a decode step with `rows` rows (the slot count: a full batch)."""
    if length <= 0:
        return 0.0
    row_s = costs.decode_s(rows) if costs.ready else None
    if row_s:
        cost = costs.chunk_s(start, length) * rows / row_s
        if cost > 0:
            return cost
    return PROMPT_COST * length


@dataclass
class Account:
    served: float = 0.0
    requests: int = 0  # in the engine: waiting or in a slot


class Ledger:
    """The counters of one level: the groups, or the clients of one group."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}
        self.last_left = 0.0  # the counter of the last to leave (its last request ended)
        self._forget_at = FORGET_AT

    def floor(self) -> float:
        """Where a newcomer starts at the least: the least counter among those with requests, else the last to
        leave's. It never goes down: a newcomer is lifted to it and counters only grow."""
        return min((a.served for a in self.accounts.values() if a.requests), default=self.last_left)

    def arrive(self, key: str) -> None:
        account = self.accounts.setdefault(key, Account())
        if not account.requests:
            account.served = max(account.served, self.floor())
        account.requests += 1

    def leave(self, key: str) -> None:
        account = self.accounts[key]
        account.requests -= 1
        if not account.requests:
            self.last_left = account.served
            if len(self.accounts) > self._forget_at:
                self._forget()

    def _forget(self) -> None:
        """An idle counter at or under the floor would be lifted to the floor on return anyway."""
        floor = self.floor()
        self.accounts = {k: a for k, a in self.accounts.items() if a.requests or a.served > floor}
        self._forget_at = max(FORGET_AT, 2 * len(self.accounts))


class Shared(Protocol):
    @property
    def share(self) -> Share: ...


R = TypeVar("R", bound=Shared)


class FairShare:
    def __init__(self) -> None:
        self.groups = Ledger()  # counters over weights
        self.clients: dict[str, Ledger] = {}  # per group

    def arrive(self, share: Share) -> None:
        """A request of `share` entered the engine."""
        self.groups.arrive(share.group)
        self.clients.setdefault(share.group, Ledger()).arrive(share.client)

    def leave(self, share: Share) -> None:
        """A request of `share` ended."""
        self.groups.leave(share.group)
        clients = self.clients[share.group]
        clients.leave(share.client)
        if not clients.accounts:
            del self.clients[share.group]

    def requests(self, share: Share) -> int:
        """The client's requests in the engine."""
        clients = self.clients.get(share.group)
        account = clients.accounts.get(share.client) if clients else None
        return account.requests if account else 0

    def charge(self, share: Share, cost: float) -> None:
        self.groups.accounts[share.group].served += cost / share.weight
        self.clients[share.group].accounts[share.client].served += cost

    def served(self, share: Share) -> tuple[float, float]:
        """(the group's counter, the client's within it): the smaller the sooner served."""
        return self.groups.accounts[share.group].served, self.clients[share.group].accounts[share.client].served

    def by_service(self, requests: Iterable[R]) -> list[R]:
        """Least-served first; in the given order among equals."""
        return sorted(requests, key=lambda r: self.served(r.share))

    def order(self, waiting: Sequence[R], cost: Callable[[R], float], owed: Iterable[tuple[Share, float]]) -> list[R]:
        """`waiting` (in arrival order) in the order they would take slots if nothing else changed. The first is the
        next to go: the least-served group's least-served client's oldest request. The rest are placed as if each
        before them were served as `cost` expects (a virtual start time, as in weighted fair queueing), so a client's
        second request goes after others' first. `owed`: the cost of prompt tokens that requests in slots have yet
        to prefill, counted as served already (VTC charges a prompt when it is admitted), so several admitted in one
        step are not all one client's. Ties go to the earlier arrival."""
        client_owed: dict[tuple[str, str], float] = {}
        group_owed: dict[str, float] = {}
        for share, amount in owed:
            key = (share.group, share.client)
            client_owed[key] = client_owed.get(key, 0.0) + amount
            group_owed[share.group] = group_owed.get(share.group, 0.0) + amount / share.weight
        queues: dict[str, dict[str, deque[int]]] = {}  # group -> client -> indices into waiting, oldest first
        for i, request in enumerate(waiting):
            queues.setdefault(request.share.group, {}).setdefault(request.share.client, deque()).append(i)
        within: dict[str, deque[int]] = {}
        for group, clients in queues.items():
            accounts = self.clients[group].accounts
            starts = {c: (accounts[c].served + client_owed.get((group, c), 0.0), accounts[c].requests)
                      for c in clients}
            within[group] = deque(_merge(clients, starts, lambda i: cost(waiting[i])))
        groups = self.groups.accounts
        starts = {g: (groups[g].served + group_owed.get(g, 0.0), groups[g].requests) for g in within}
        return [waiting[i] for i in _merge(within, starts, lambda i: cost(waiting[i]) / waiting[i].share.weight)]


def slot_shares(demand: Mapping[tuple[str, str], int], weights: Mapping[str, float],
                slots: int) -> dict[tuple[str, str], float]:
    """Each (group, client)'s fair share of `slots`, max-min fair: the groups' by weight, a group's equally among its
    clients, nobody's more than its `demand` (requests in the engine), what one does not need going to the others."""
    clients: dict[str, dict[str, int]] = {}
    for (group, client), n in demand.items():
        clients.setdefault(group, {})[client] = n
    by_group = _fill({g: sum(cs.values()) for g, cs in clients.items()}, weights, slots)
    return {(g, c): share for g, cs in clients.items()
            for c, share in _fill(cs, dict.fromkeys(cs, 1.0), by_group[g]).items()}


def _fill(demand: Mapping[str, int], weights: Mapping[str, float], total: float) -> dict[str, float]:
    """Water-filling: `total` split by weight, each capped at its demand, the rest split again among the others."""
    shares: dict[str, float] = {}
    left = {k: n for k, n in demand.items() if n > 0}
    shares.update({k: 0.0 for k in demand if k not in left})
    while left:
        level = total / sum(weights[k] for k in left)
        sated = [k for k, n in left.items() if n <= level * weights[k]]
        if not sated:
            shares.update({k: level * weights[k] for k in left})
            break
        for k in sated:
            shares[k] = float(left.pop(k))
            total -= shares[k]
    return shares


def _merge(queues: dict[str, deque[int]], starts: dict[str, tuple[float, int]],
           cost: Callable[[int], float]) -> list[int]:
    """The queues' items (arrival indices) merged least start first, each queue's start advanced by the cost of the
    item it gave. `starts`: (counter, requests in the engine); at equal counters the one with fewer requests goes
    first, so a newcomer lifted to a busy client's counter is not put behind that client's backlog."""
    heap = [(start, load, q[0], k) for k, q in queues.items() for start, load in [starts[k]]]
    heapq.heapify(heap)
    merged = []
    while heap:
        start, load, i, k = heapq.heappop(heap)
        merged.append(i)
        queue = queues[k]
        queue.popleft()
        if queue:
            heapq.heappush(heap, (start + cost(i), load, queue[0], k))
    return merged
