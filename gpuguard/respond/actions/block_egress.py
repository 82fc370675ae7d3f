"""block-egress: refuse connects to the pool addresses in the evidence, in the cgroup and host-wide."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.config.schema import Key
from gpuguard.events.action_kinds import BLOCK_EGRESS
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import (
    Action,
    cgroup_programs,
    load_cgroup_programs,
    name_block,
    note_exit_during_move,
)
from gpuguard.respond.blocks import Block, BlockKind, new_block_id
from gpuguard.respond.cgroup_blocks import EGRESS_BLOCK
from gpuguard.respond.nft import NftError, NftSets, where
from gpuguard.respond.pool_addresses import parse_addresses, pool_endpoints, split_host_wide
from gpuguard.sources.proc.identity import pidfd_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext


@dataclass(frozen=True, slots=True)
class EgressSettings:
    """``response.block_egress``: how long, and whether (and where) host-wide nftables sets too."""

    egress_ttl_s: float = 3600.0
    nftables: bool = True  # host-wide sets besides the cgroup program
    nftables_netns: str = ""  # manage this named network namespace's firewall instead
    never_block_host_wide: tuple[str, ...] = ()  # networks (CIDR) never put in the host-wide sets


def run(
    ctx: ActionContext, verdict: Verdict, state: ProcessState, base: dict[str, Any]
) -> ActionOutcome:
    addresses, rejected = parse_addresses(pool_endpoints(verdict, state))
    if not addresses:
        return ActionOutcome(
            action=BLOCK_EGRESS.name,
            status="skipped",
            detail={"rejected": rejected},
            **base,
            reason="the evidence names no pool address",
        )
    ttl = ctx.options.egress_ttl_s
    if ctx.dry_run:
        return ctx.would(
            f"refuse connects to {', '.join(addresses)} for {ttl:g} s",
            {"addresses": addresses, "nftables": ctx.options.nftables},
            base,
        )
    container = bool(state.facts and state.facts.container_id)
    with ctx.open_offender(verdict, state) as handle:
        block = ctx.part(cgroup_programs).block_egress(
            verdict.pid, container, addresses, ttl, f"{verdict.verdict} verdict"
        )
        moved_alive = pidfd_alive(handle.pidfd)
    name_block(block, verdict)
    outcome = note_exit_during_move(
        ctx.placed(
            block,
            f"connects to {', '.join(addresses)} refused in its cgroup",
            base,
        ),
        moved_alive,
    )
    host_wide, kept_local = split_host_wide(addresses, ctx.options.never_block_host_wide)
    if kept_local:
        outcome.detail["not_host_wide"] = kept_local
        outcome.reason += (
            f"; not host-wide: {', '.join(kept_local)} (loopback, local or "
            "response.block_egress.never_block)"
        )
    if ctx.options.nftables and host_wide:
        netns = ctx.options.nftables_netns
        try:
            NftSets(netns).add(host_wide, ttl)
            host = Block(
                new_block_id(NFTABLES_BLOCK),
                NFTABLES_BLOCK.name,
                block.created,
                block.expires,
                block.reason,
                verdict.pid,
                verdict.key.start_time,
                verdict.comm,
                verdict.exe,
                {"addresses": host_wide, "netns": netns},
            )
            ctx.blocks.save(host)
            outcome.detail["nftables_block_id"] = host.id
            outcome.reason += "; host-wide in table inet gpuguard"
        except (NftError, OSError, ValueError) as exc:
            outcome.detail["nftables_error"] = str(exc)
            outcome.reason += "; nftables failed (see detail)"
    return outcome


def lift_nftables_block(block: Block, root: Path, others: list[Block]) -> str:
    """Remove the block's addresses no other block in its namespace holds; the last one, the table."""
    netns = block.detail.get("netns", "")
    same_table = [b for b in others if b.kind == block.kind and b.detail.get("netns") == netns]
    held = {a for b in same_table for a in b.detail.get("addresses", [])}
    gone = [a for a in block.detail.get("addresses", []) if a not in held]
    nft = NftSets(netns)
    try:
        nft.remove(gone)
        # The last block in this namespace takes the table (its sets, chains, rules) with it.
        dropped = not same_table and nft.delete_table()
    except NftError as exc:
        raise OSError(f"nft refused: {exc}") from None
    said = f"removed {len(gone)} address(es) from table inet gpuguard"
    if dropped:
        said += f", then the table ({where(netns)})"
    return said


def nftables_in_place(block: Block, root: Path) -> str:
    """How many of the block's addresses the host-wide sets hold now."""
    try:
        present = {
            a
            for values in NftSets(block.detail.get("netns", "")).elements().values()
            for a in values
        }
    except (OSError, ValueError):
        return "nft unavailable"
    wanted = block.detail.get("addresses", [])
    found = sum(a in present for a in wanted)
    return f"{found}/{len(wanted)} addresses in sets"


def remove_tables(lifted: list[Block], netns_seen: set[str]) -> list[tuple[str, str]]:
    """After every block is lifted: ``table inet gpuguard`` in each namespace a block used (or
    ``netns_seen`` names); no other table is touched."""
    done = []
    for netns in sorted(netns_seen | {b.detail.get("netns", "") for b in lifted}):
        try:
            if NftSets(netns).delete_table():
                done.append(("nftables", f"removed table inet gpuguard ({where(netns)})"))
        except NftError as exc:
            done.append(("nftables", f"failed: table inet gpuguard ({where(netns)}): {exc}"))
    return done


NFTABLES_BLOCK = BlockKind(
    "nftables", "n", lift_nftables_block, nftables_in_place, lift_shared=remove_tables
)


ACTION = Action(
    BLOCK_EGRESS,
    run,
    section="block_egress",
    options=(
        Key("ttl_s", "number", "blocks expire after this long", field="egress_ttl_s", low=0),
        Key("nftables", "flag", "host-wide nftables sets besides the cgroup program"),
        Key("nftables_netns", "text", "manage this named network namespace's firewall instead"),
        Key(
            "never_block",
            "networks",
            "networks (CIDR) never put in the host-wide sets",
            field="never_block_host_wide",
        ),
    ),
    settings=EgressSettings,
    default_on=("malicious",),
    blocks=(EGRESS_BLOCK, NFTABLES_BLOCK),
    start=load_cgroup_programs,
    extra_capabilities=lambda options: ("CAP_NET_ADMIN",) if options.nftables else (),
    what="the pool addresses the evidence names (IP literals in it, such as a pool URL on the "
    "command line, and its connections whose address or port a rule matched; all of its "
    "connections if none is named; host names are never resolved) are refused to the "
    "offender's cgroup by cgroup connect4/connect6 programs, and host-wide through nftables: "
    "`table inet gpuguard`, sets `pool4`/`pool6` with timeouts, a drop rule on `output` and "
    "`forward` (loopback, unspecified, link-local and multicast addresses and the networks in "
    "`block_egress.never_block` stay out of the host-wide sets: dropping them would cut the "
    "host off from itself or its own services)",
    undone_by="`block_egress.ttl_s` (1 h), `unblock`",
)
