"""The ledger's Lua scripts and the one typed description of their arguments.

The scripts live in ``trio_dispatch/_redis/lua/*.lua``, shipped in the package:
``prelude.lua`` (the keys, the clock, the rules every script shares),
``budgets.lua`` (the budgets' rules, for the step) and one file per
operation. ``load_scripts`` composes each operation with the
prelude, as Redis needs one text per script, and the clock (``clock.lua``:
the server's own ``TIME``) in place of the prelude's ``--@CLOCK@`` marker.

Each script's ``ARGV`` is laid out by exactly one frozen value here, whose
``pack()`` gives the strings in order: numbers go as whole numbers in
digits, or as ``repr`` of a float (the shortest text that reads back as the
same double), never in a form the other side could read differently.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from typing import TYPE_CHECKING, Final, final

import attrs

from .._policy._budgets import FORGET_AFTER, MAX_TOKENS, AdaptiveLimit

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .._policy._budgets import Budget
    from .._policy._ratelimits import RateLimitInfo
    from ..messages._limits import Tenant
    from ..messages._protocol import Ticket

_CLOCK_MARK: Final = "--@CLOCK@\n"


def _lua(name: str) -> str:
    return (
        importlib.resources.files(__package__ or "trio_dispatch")
        .joinpath("lua", f"{name}.lua")
        .read_text(encoding="utf-8")
    )


@final
class Script:
    """A script's text and the digest by which Redis runs it."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.sha[:12]}>"


@final
@attrs.frozen
class Scripts:
    """The ledger's six scripts, each composed with the prelude, and the clock.

    ``time`` reads the server's own clock alone (``clock.lua``, whatever
    clock the others read), in milliseconds.
    """

    step: Script
    set_limit: Script
    set_budget: Script
    set_tenant: Script
    pause: Script
    resume: Script
    time: Script


def load_scripts(clock: str | None = None) -> Scripts:
    """The scripts, with ``clock`` (Lua setting ``now`` in ms; default: ``TIME``)."""
    prelude = (
        _lua("prelude")
        .replace("@MAX_TOKENS@", str(MAX_TOKENS))
        .replace("@FORGET_AFTER@", str(round(FORGET_AFTER * 1000)))
    )
    if _CLOCK_MARK not in prelude:  # pragma: no cover (the file is ours)
        raise RuntimeError("prelude.lua has no clock marker")
    prelude = prelude.replace(_CLOCK_MARK, _lua("clock") if clock is None else clock)

    def script(name: str) -> Script:
        return Script(prelude + _lua(name))

    return Scripts(
        step=Script(prelude + _lua("budgets") + _lua("step")),
        set_limit=script("set_limit"),
        set_budget=script("set_budget"),
        set_tenant=script("set_tenant"),
        pause=script("pause"),
        resume=script("resume"),
        time=Script(_lua("clock") + "return now\n"),
    )


def limit_spec(limit: int | AdaptiveLimit | None) -> str:
    """A limit as the scripts take it: ``none``, ``N``, or ``N,min,max,backoff,signal``.

    The signal is ``latency``, or empty for the rate-limit one.
    """
    if limit is None:
        return "none"
    if isinstance(limit, AdaptiveLimit):
        signal = "latency" if limit.signal == "latency" else ""
        return (
            f"{limit.initial},{limit.minimum},{limit.maximum},{limit.backoff!r},"
            f"{signal}"
        )
    return str(limit)


def tokens_arg(tokens: int) -> str:
    """A count of tokens as the scripts take it: digits, from 0 to ``MAX_TOKENS``."""
    return str(max(0, min(MAX_TOKENS, int(tokens))))


def _number(value: float) -> str:
    """A number in digits if whole, else the shortest exact text of its double."""
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _optional(value: float | None) -> str:
    return "" if value is None else _number(value)


def figures_arg(info: RateLimitInfo | None) -> str:
    """The figures of ``info`` budgets learn from: eight fields, comma-separated.

    For requests, then tokens: ``1`` if there are figures (even with no
    usable field: token figures settle the charges answered so far), then
    the limit, remaining and reset, each empty when missing.
    """
    if info is None:
        return ""
    parts: list[str] = []
    for quota in (info.requests, info.tokens):
        if quota is None:
            parts.extend(("", "", "", ""))
        else:
            parts.append("1")
            parts.extend(
                _optional(value)
                for value in (quota.limit, quota.remaining, quota.reset)
            )
    return ",".join(parts)


def _counted(items: list[str]) -> list[str]:
    return [str(len(items)), *items]


def _rates(budget: Budget | None) -> list[str]:
    """A budget's requests and tokens per minute, each empty when it has none."""
    if budget is None:
        return ["", ""]
    return [
        _optional(None if rate is None else float(rate))
        for rate in (budget.requests_per_minute, budget.tokens_per_minute)
    ]


def _tenant_fields(settings: Tenant | None) -> list[str]:
    """A tenant's weight and cap, each empty for the default (no weight: none configured)."""
    if settings is None:
        return ["", ""]
    return [
        repr(float(settings.weight)),
        "" if settings.limit is None else str(settings.limit),
    ]


@final
@attrs.frozen(kw_only=True)
class Seed:
    """A provider's settings, as a process knows the fleet has them.

    A step that carries it stores again, where the namespace holds none,
    each of them, when the namespace is not the one the process last saw:
    Redis lost it (see ``step.lua``).

    Attributes:
        limit: The limit, fixed or adaptive (at its current value), or
            ``None`` for none to store.
        budget: The provider's configured budgets, or ``None``.
        models: Each model's configured budgets.
        tenants: Each configured tenant's weight and cap.
        members: A group's: each member's own seed (its limit, budgets
            and models' budgets; its tenants and members unused), stored
            under the same rule in the same step.
    """

    limit: int | AdaptiveLimit | None = None
    budget: Budget | None = None
    models: Mapping[str, Budget] = attrs.field(factory=dict)
    tenants: Mapping[str, Tenant] = attrs.field(factory=dict)
    members: Mapping[str, Seed] = attrs.field(factory=dict)

    def pack(self) -> list[str]:
        """Its part of ``step.lua``'s ``ARGV``."""
        args = ["1", *self._own()]
        args.append(str(len(self.tenants)))
        for tenant, settings in self.tenants.items():
            args += (tenant, *_tenant_fields(settings))
        args.append(str(len(self.members)))
        for member, seed in self.members.items():
            args += (member, *seed._own())
        return args

    def _own(self) -> list[str]:
        """Its limit, budgets and models' budgets, as ``step.lua`` reads them."""
        args = [
            "" if self.limit is None else limit_spec(self.limit),
            *_rates(self.budget),
            str(len(self.models)),
        ]
        for model, budget in self.models.items():
            args += (model, *_rates(budget))
        return args


@final
@attrs.frozen(kw_only=True)
class Plan:
    """One round of a process's changes for ``step.lua``, in the order it applies them.

    Made by the process's book; ``pack`` lays it out as the script's
    ``ARGV``, with what the round adds (``step.lua`` reads them in this
    order: the round's own fields, then the figures, then the plan's lists).

    Attributes:
        spoil: Lease ids given back without success (no adaptive increase,
            no end of a backoff streak).
        usage: Lease ids and the tokens their requests used.
        release: Lease ids given back.
        withdraw: Queue members withdrawn (with their leases, if a step
            whose answer was lost granted them).
        enqueue: Members and their start on the server's clock: new
            entries, entries whose answer was lost, renewed ones.
        costs: The estimated tokens of the entries that have some.
        meta: The tenant and model of the entries that have either.
        renew_leases: Lease ids renewed (added back if gone).
        ask: Members that ask for a grant.
        answered: Lease ids whose answer started.
        recheck: Whether a round since the last answered one went
            unanswered: it may have granted members of this one, which
            the step then looks up among the leases.
        enqueued: The book's tickets of ``enqueue``, in the same order
            (not sent: the book reads them back with the answer).
        lanes: A group's entries' lanes (``lane_text``), by member of
            ``enqueue``: a member's or a pool's name, or any member's,
            and the members each avoids.
        holders: A group's leases named in the plan, each with its member.
        failed: A group's leases of ``release`` whose call failed before
            its answer started (they count for their member's health).
    """

    spoil: list[str] = attrs.field(factory=list)
    usage: list[tuple[str, int]] = attrs.field(factory=list)
    release: list[str] = attrs.field(factory=list)
    withdraw: list[str] = attrs.field(factory=list)
    enqueue: list[tuple[str, float]] = attrs.field(factory=list)
    costs: Mapping[str, int] = attrs.field(factory=dict)
    meta: Mapping[str, tuple[str | None, str | None]] = attrs.field(factory=dict)
    renew_leases: list[str] = attrs.field(factory=list)
    ask: list[str] = attrs.field(factory=list)
    answered: list[str] = attrs.field(factory=list)
    recheck: bool = True
    enqueued: list[Ticket] = attrs.field(factory=list)
    lanes: Mapping[str, str] = attrs.field(factory=dict)
    holders: Mapping[str, str] = attrs.field(factory=dict)
    failed: list[str] = attrs.field(factory=list)

    def pack(
        self,
        *,
        node: str,
        ttl: int,
        waiting: int,
        channel: str,
        epoch: str,
        seed: Seed | None,
        observed: Sequence[tuple[str | None, RateLimitInfo]],
        verdicts: Sequence[int] = (),
        members: Sequence[str] = (),
        pools: Mapping[str, Sequence[str]] | None = None,
        figures_on: Sequence[str] = (),
        verdicts_on: Sequence[str] = (),
        failure_threshold: int = 1,
        failure_cooldown: int = 0,
        affinity_wait: int = 0,
    ) -> list[str]:
        """``ARGV``, in the script's order.

        Args:
            node: The process's name for the provider.
            ttl: Milliseconds a lease, an entry or the process lives
                unrenewed.
            waiting: The process's waiters.
            channel: The provider's wake-up channel.
            epoch: The namespace's epoch as the process last saw it
                (empty: none, then the step does not check it).
            seed: The settings to store again if the namespace's epoch is
                not ``epoch``, or ``None``.
            observed: Rate-limit figures to learn from: each with the
                model whose answer they came with, or ``None`` for the
                provider's.
            verdicts: The non-zero verdicts of the process's latency
                signal since its last round, in order: each a change of
                the fleet's limit (``Adaptive.move``).
            members: A group's members, in their order (none: a
                provider, its own and only member).
            pools: A group's pools, each with its members in order.
            figures_on: A group's: the member of each of ``observed``.
            verdicts_on: A group's: the member of each of ``verdicts``.
            failure_threshold: A group's: the failures in a row that take
                a member out of service.
            failure_cooldown: A group's: milliseconds a member stays out.
            affinity_wait: A group's: milliseconds an entry waits for the
                member it prefers (0: affinity off).
        """
        args = [
            node,
            str(ttl),
            str(waiting),
            epoch,
            channel,
            "1" if self.recheck else "0",
            *(["0"] if seed is None else seed.pack()),
            str(len(observed)),
        ]
        for model, info in observed:
            args += (model or "", figures_arg(info))
        args += _counted([str(int(change)) for change in verdicts])
        args += _counted(self.spoil)
        args.append(str(len(self.usage)))
        for lease_id, tokens in self.usage:
            args += (lease_id, tokens_arg(tokens))
        args += _counted(self.release)
        args += _counted(self.withdraw)
        args.append(str(len(self.enqueue)))
        costs = self.costs
        meta = self.meta
        for member, start in self.enqueue:
            tenant, model = meta.get(member, (None, None))
            args += (
                member,
                _number(start),
                tokens_arg(costs.get(member, 0)),
                tenant or "",
                model or "",
            )
        args += _counted(self.renew_leases)
        args += _counted(self.ask)
        args += _counted(self.answered)
        if members:
            args += _counted(list(members))
            pools = pools or {}
            args.append(str(len(pools)))
            for pool, names in pools.items():
                args += (pool, str(len(names)), *names)
            args.append(str(len(self.lanes)))
            for member, lane in self.lanes.items():
                args += (member, lane)
            args.append(str(len(self.holders)))
            for lease_id, name in self.holders.items():
                args += (lease_id, name)
            args += _counted(list(figures_on))
            args += _counted(list(verdicts_on))
            args += (str(failure_threshold), str(failure_cooldown))
            args += _counted(self.failed)
            args.append(str(affinity_wait))
        return args


def lane_text(
    lane: str | None, avoid: Sequence[str] = (), prefer: str | None = None
) -> str:
    """A group's entry's lane as ``step.lua`` reads it (``read_lane``).

    ``lane``: a member's or a pool's name, ``None`` for any member; the
    members it avoids; the member it prefers (its conversation's last),
    for the step to place as ``SlotPolicy`` does. Each as its length, a
    colon and the text, so that any text is a name.
    """
    if lane is None and not avoid and prefer is None:
        return ""
    parts = [prefer or "", "", lane or "", *avoid]
    return "".join(f"{len(part)}:{part}" for part in parts)


@final
@attrs.frozen(kw_only=True)
class SetLimitArgs:
    """``set_limit.lua``'s arguments: the limit, whether it overwrites, channel, member."""

    limit: int | AdaptiveLimit | None
    overwrite: bool
    channel: str
    member: str | None = None

    def pack(self) -> list[str]:
        """``ARGV``, in the script's order."""
        return [
            limit_spec(self.limit),
            "1" if self.overwrite else "0",
            self.channel,
            self.member or "",
        ]


@final
@attrs.frozen(kw_only=True)
class SetBudgetArgs:
    """``set_budget.lua``'s arguments: rates per minute, channel, model (or none)."""

    budget: Budget
    channel: str
    model: str | None = None
    member: str | None = None
    members: Sequence[str] = ()

    def pack(self) -> list[str]:
        """``ARGV``, in the script's order."""
        return [
            *_rates(self.budget),
            self.channel,
            self.model or "",
            self.member or "",
            *self.members,
        ]


@final
@attrs.frozen(kw_only=True)
class SetTenantArgs:
    """``set_tenant.lua``'s arguments: tenant, weight and cap (or defaults), channel, members."""

    tenant: str
    settings: Tenant | None
    channel: str
    members: Sequence[str] = ()

    def pack(self) -> list[str]:
        """``ARGV``, in the script's order; no settings: back to the defaults."""
        return [
            self.tenant,
            *_tenant_fields(self.settings),
            self.channel,
            *self.members,
        ]


@final
@attrs.frozen(kw_only=True)
class PauseArgs:
    """``pause.lua``'s arguments: delay (or none), default, longest (ms), member."""

    delay: int | None
    default_pause: int
    max_pause: int
    member: str | None = None

    def pack(self) -> list[str]:
        """``ARGV``, in the script's order."""
        return [
            "" if self.delay is None else str(self.delay),
            str(self.default_pause),
            str(self.max_pause),
            self.member or "",
        ]


@final
@attrs.frozen(kw_only=True)
class ResumeArgs:
    """``resume.lua``'s arguments: the channel, the member (``None``: the provider)."""

    channel: str
    member: str | None = None

    def pack(self) -> list[str]:
        """``ARGV``, in the script's order."""
        return [self.channel, self.member or ""]
