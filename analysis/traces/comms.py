"""What a trace's record_param_comms ops say: the p2p peers, and the process group of each collective.

torch records a p2p op's peer as "Dst Rank" (send) or "Src Rank" (recv), a rank within the op's
process group, and the group's global ranks as "Process Group Ranks" (a list, or its text in some
versions; torch cuts a long one short, and then it is no list), beside the group's id ("Process Group
Name") and description ("Process Group Description"); without the list the peer is taken as global
(the default group's). Gloo traces record no record_param_comms; NCCL ones do. The loader keeps those
args as it decodes the events (analysis.traces.events: `RawTrace.comms`), so the text is not held for
them, and only its pieces that hold such ops are decoded twice: the peers are wanted only where nothing else says which ranks form the pipelines
(analysis.traces.layout), the groups only where the trace has collectives.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from analysis.traces.events import ParamComms
from analysis.traces.kineto import CommArgs

# index: the event's position in traceEvents (the frame's `index`); members: the group's global ranks,
# null where the op does not list them; group_id, group_desc: what it says of the group, else null
GROUP_SCHEMA = {"index": pl.Int64, "members": pl.List(pl.Int64), "group_id": pl.Utf8, "group_desc": pl.Utf8}


def _members(args: CommArgs) -> list[int] | None:
    ranks = args.ranks
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            return None
    if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks):
        return ranks
    return None


def p2p_peers(comms: ParamComms, rank: int | None) -> set[int]:
    """The global ranks other than its own (`rank`) that the trace's p2p ops name as peers."""
    found: set[int] = set()
    for _, args in comms:
        peers = {peer for peer in (args.src, args.dst) if type(peer) is int and peer >= 0}
        members = _members(args)
        found |= {members[peer] for peer in peers if peer < len(members)} if members else peers
    return found - {rank}


def comm_groups(comms: ParamComms) -> pl.DataFrame:
    """GROUP_SCHEMA: what each record_param_comms op says of its process group."""

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    rows = [
        (index, _members(args), text(args.group_id), text(args.group_desc))
        for index, args in comms
    ]
    return pl.DataFrame(rows, schema=GROUP_SCHEMA, orient="row")
