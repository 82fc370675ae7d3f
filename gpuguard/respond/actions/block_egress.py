"""block-egress: refuse connects to the pool addresses in the evidence, in the cgroup and host-wide."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import BLOCK_EGRESS
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action, Option, name_block, note_exit_during_move
from gpuguard.respond.blocks import Block, BlockKind, new_block_id
from gpuguard.respond.cgroup_blocks import EGRESS_BLOCK
from gpuguard.respond.nft import NftError, NftSets, where
from gpuguard.respond.pool_addresses import parse_addresses, pool_endpoints, split_host_wide
from gpuguard.sources.proc.identity import pidfd_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.responder import Responder


def run(r: Responder, verdict: Verdict, state: ProcessState, base: dict[str, Any]) -> ActionOutcome:
    addresses, rejected = parse_addresses(pool_endpoints(verdict, state))
    if not addresses:
        return ActionOutcome(
            action=BLOCK_EGRESS.name,
            status="skipped",
            detail={"rejected": rejected},
            **base,
            reason="the evidence names no pool address",
        )
    ttl = r.settings.egress_ttl_s
    if r.dry_run:
        return ActionOutcome(
            action=BLOCK_EGRESS.name,
            status="dry-run",
            **base,
            detail={"addresses": addresses, "nftables": r.settings.nftables},
            reason=f"would refuse connects to {', '.join(addresses)} for {ttl:g} s",
        )
    container = bool(state.facts and state.facts.container_id)
    with r.open_offender(verdict, state) as handle:
        block = r.cgroup_blocker().block_egress(
            verdict.pid, container, addresses, ttl, f"{verdict.verdict} verdict"
        )
        moved_alive = pidfd_alive(handle.pidfd)
    name_block(block, verdict)
    outcome = note_exit_during_move(
        r.placed(
            block,
            BLOCK_EGRESS.name,
            f"connects to {', '.join(addresses)} refused in its cgroup",
            base,
        ),
        moved_alive,
    )
    host_wide, kept_local = split_host_wide(addresses, r.settings.never_block_host_wide)
    if kept_local:
        outcome.detail["not_host_wide"] = kept_local
        outcome.reason += (
            f"; not host-wide: {', '.join(kept_local)} (loopback, local or "
            "response.block_egress.never_block)"
        )
    if r.settings.nftables and host_wide:
        netns = r.settings.nftables_netns
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
            r.store.save(host)
            outcome.detail["nftables_block_id"] = host.id
            outcome.reason += "; host-wide in table inet gpuguard"
        except (NftError, OSError, ValueError) as exc:
            outcome.detail["nftables_error"] = str(exc)
            outcome.reason += "; nftables failed (see detail)"
    return outcome


def lift_nftables_block(block: Block, root: Path, others: list[Block]) -> str:
    """Remove the block's addresses no other block in its namespace holds; the last one, the table."""
    netns = block.detail.get("netns", "")
    same_table = [b for b in others if b.kind == "nftables" and b.detail.get("netns") == netns]
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


NFTABLES_BLOCK = BlockKind("nftables", "n", lift_nftables_block, nftables_in_place)


ACTION = Action(
    BLOCK_EGRESS,
    run,
    section="block_egress",
    options=(
        Option("ttl_s", "egress_ttl_s", "number"),
        Option("nftables", "nftables", "flag"),
        Option("nftables_netns", "nftables_netns", "text"),
        Option("never_block", "never_block_host_wide", "networks"),
    ),
    default_on=("malicious",),
    blocks=(EGRESS_BLOCK, NFTABLES_BLOCK),
)
