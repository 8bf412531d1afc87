"""Bulkheads: how many tasks of each name and tenant one claim may take (DESIGN §8).

Pure arithmetic over the ``limits`` rows and the live counts the engine reads under the
claim's lock; the engine's claims (:mod:`ratchet.ledger.ops.claims`) are the only caller,
and every dialect runs the same plan (the SQL only obeys the per-name and per-tenant numbers).

The rules, per dimension (task types; tenants), checked on their own:

* ``maximum``: at most that many RUNNING tasks of the scope. A RUNNING row holds its slot
  until its holder's fenced write ends it, or it is taken over (the slot passes to the new
  holder: a takeover never adds a RUNNING row) or retired / revoked. An expired lease that
  nobody took over still holds its slot.
* ``total``: at most that many RUNNING tasks in all. Only with a total do reservations
  mean anything (they are shares of it).
* ``reserved``: of the free slots (total - RUNNING), the part a scope with ready work is
  short of its reservation (``reserved - running``, at least 0) is *owed* to it; the rest
  (the pool) may be taken by anyone. A scope without ready work is owed nothing: its idle
  reservation is lent to the others. When it gets work, new claims of the borrowers are
  refused until its owed slots are free again; RUNNING borrowers are not preempted, so the
  owner gets its slots as borrowers finish (within one task duration of the longest
  borrower, plus a poll interval).

Within a claim the SQL takes, oldest first, each name's owed slots and then at most
``pool`` tasks in all beyond them (and the same for tenants), so what one claim takes never
exceeds the free slots nobody is owed, whichever names have ready work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .base import Limit, LimitScope

__all__ = ["UNLIMITED", "Allowance", "allowance", "lock_scopes", "pick", "reserved_groups"]

UNLIMITED = 1 << 30
"""Stands for "no limit" in the numbers handed to the SQL (fits a 32-bit integer)."""

@dataclass(frozen=True, slots=True)
class Allowance:
    """What one claim may take: parameters of the ``claim_limited`` statement.

    Attributes:
        names: the claimed task names; name_limits: at most this many of each (its cap,
            parallel); name_reserved: how many of each may come out of the slots owed to
            it (its reservation, parallel); pool: at most this many tasks in all beyond
            their name's reserved number (the free slots nobody is owed).
        tenants: the tenants with a limit row; tenant_limits, tenant_reserved: the same
            per tenant (parallel); tenant_pool: the same pool for the tenant dimension
            (every other tenant, and tasks without one, take only from it).
        limit: at most this many tasks in all.
    """

    names: list[str]
    name_limits: list[int]
    name_reserved: list[int]
    pool: int
    tenants: list[str]
    tenant_limits: list[int]
    tenant_reserved: list[int]
    tenant_pool: int
    limit: int


def lock_scopes(limits: Sequence[Limit], names: Sequence[str]) -> list[str] | None:
    """The advisory-lock scopes a claim of ``names`` must hold before counting, sorted (the
    order every claimer takes them in), or None when no limit applies to the claim (the
    unlimited claim, no lock, no count).

    With a total every claim is limited and all of them serialise on one scope (``*``):
    reservations compare the use of every scope. Without one, a cap only needs the claims
    that could add to its count serialised: one scope per capped claimed name, one per
    capped tenant (any claim may find a task of that tenant). Reservations without a total
    have no effect.
    """
    if any(lim.scope is LimitScope.TOTAL for lim in limits):
        return ["*"]
    wanted = set(names)
    scopes = [f"type:{lim.name}" for lim in limits
              if lim.scope is LimitScope.TYPE and lim.maximum is not None and lim.name in wanted]
    scopes += [f"tenant:{lim.name}" for lim in limits
               if lim.scope is LimitScope.TENANT and lim.maximum is not None]
    return sorted(scopes) or None


def reserved_groups(limits: Sequence[Limit]) -> tuple[list[str], list[str]]:
    """``(type names, tenants)`` with a reservation that counts (a total is set): the
    scopes whose "has ready work" the claim must read."""
    if not any(lim.scope is LimitScope.TOTAL for lim in limits):
        return [], []
    types = sorted(lim.name for lim in limits if lim.scope is LimitScope.TYPE and lim.reserved)
    tenants = sorted(lim.name for lim in limits
                     if lim.scope is LimitScope.TENANT and lim.reserved)
    return types, tenants


def allowance(
    limits: Sequence[Limit],
    names: Sequence[str],
    want: int,
    running: Mapping[tuple[str, str | None], int],
    ready_types: set[str],
    ready_tenants: set[str],
) -> Allowance:
    """How many tasks of each claimed name and tenant a claim of at most ``want`` tasks may
    take, given the RUNNING counts per ``(name, tenant)`` (read under the claim's lock) and
    which reserved scopes have ready work (see the module docstring for the rules)."""
    by_key = {(lim.scope, lim.name): lim for lim in limits}
    total = by_key.get((LimitScope.TOTAL, ""))
    per_type: Counter[str] = Counter()
    per_tenant: Counter[str] = Counter()
    used = 0
    for (name, tenant), count in running.items():
        per_type[name] += count
        if tenant is not None:
            per_tenant[tenant] += count
        used += count
    free = UNLIMITED
    if total is not None and total.maximum is not None:
        free = max(0, total.maximum - used)

    def caps(scope: LimitScope, keys: Sequence[str], counts: Counter[str]) -> list[int]:
        out = []
        for key in keys:
            lim = by_key.get((scope, key))
            top = UNLIMITED if lim is None or lim.maximum is None else lim.maximum - counts[key]
            out.append(max(0, min(want, top)))
        return out

    def owed(scope: LimitScope, keys: Sequence[str], counts: Counter[str], ready: set[str],
             top: list[int]) -> tuple[list[int], int]:
        """Per key, the slots owed to it (within its cap), and the pool left for all."""
        if total is None:
            return [0] * len(keys), UNLIMITED
        due = {lim.name: max(0, lim.reserved - counts[lim.name]) for lim in limits
               if lim.scope is scope and lim.reserved and lim.name in ready}
        pool = max(0, free - sum(due.values()))
        return [min(cap, due.get(key, 0)) for key, cap in zip(keys, top, strict=True)], pool

    name_limits = caps(LimitScope.TYPE, names, per_type)
    name_reserved, pool = owed(LimitScope.TYPE, names, per_type, ready_types, name_limits)
    tenants = [lim.name for lim in limits if lim.scope is LimitScope.TENANT]
    tenant_limits = caps(LimitScope.TENANT, tenants, per_tenant)
    tenant_reserved, tenant_pool = owed(LimitScope.TENANT, tenants, per_tenant,
                                        ready_tenants, tenant_limits)
    if not tenants:
        # No tenant has a limit: the tenant dimension must not filter (the total is held by
        # ``limit``). A tenant pool of ``free`` here ranked rows the name filter then
        # dropped, so a claim could take fewer than the free slots (1 run in 25: tasks of
        # two names with equal run_at, interleaved by id).
        tenant_pool = UNLIMITED
    return Allowance(list(names), name_limits, name_reserved, min(pool, UNLIMITED), tenants,
                     tenant_limits, tenant_reserved, min(tenant_pool, UNLIMITED),
                     min(want, free))


def pick(plan: Allowance, rows: Sequence[tuple[str, str, str | None]]) -> list[str]:
    """Which of ``rows`` (``(task_id, name, tenant)``, in the claim's order) a claim under
    ``plan`` takes: the rules ``claim_limited`` applies in SQL, for a claim whose order is
    chosen by the engine (fairness, rate limits: :mod:`ratchet.ledger.ops.flowclaims`).
    Per row in turn: its name's count stays within the name's cap and, past the name's
    owed slots, within the pool; the same for its tenant; at most ``plan.limit`` rows."""
    caps = dict(zip(plan.names, zip(plan.name_limits, plan.name_reserved, strict=True),
                    strict=True))
    tenant_caps = dict(zip(plan.tenants, zip(plan.tenant_limits, plan.tenant_reserved,
                                             strict=True), strict=True))
    per_name: Counter[str] = Counter()
    per_tenant: Counter[str | None] = Counter()
    pool = tenant_pool = 0
    taken: list[str] = []
    for task_id, name, tenant in rows:
        if len(taken) >= plan.limit:
            break
        cap, own = caps.get(name, (0, 0))
        t_cap, t_own = tenant_caps.get(tenant, (UNLIMITED, 0)) if tenant is not None \
            else (UNLIMITED, 0)
        from_pool = per_name[name] + 1 > own
        from_tenant_pool = per_tenant[tenant] + 1 > t_own
        if per_name[name] + 1 > cap or per_tenant[tenant] + 1 > t_cap:
            continue
        if from_pool and pool + 1 > plan.pool:
            continue
        if from_tenant_pool and tenant_pool + 1 > plan.tenant_pool:
            continue
        per_name[name] += 1
        per_tenant[tenant] += 1
        pool += from_pool
        tenant_pool += from_tenant_pool
        taken.append(task_id)
    return taken
