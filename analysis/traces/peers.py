"""The p2p peers a trace records: the global ranks its record_param_comms ops send to or receive from.

torch records a p2p op's peer as "Dst Rank" (send) or "Src Rank" (recv), a rank within the op's
process group, and the group's global ranks as "Process Group Ranks" (a list, or its text in some
versions); without that list the peer is taken as global (the default group's). Gloo traces record no
record_param_comms; NCCL ones do. Read only where nothing else says which ranks form the pipelines
(analysis.pipelines), so the event array is decoded a second time, a piece at a time, args kept raw.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from analysis.traces.events import decoded_pieces
from analysis.traces.load import RawTrace

RECORD_PARAM_COMMS = "record_param_comms"


class _Op(msgspec.Struct, gc=False):
    name: str = ""
    args: msgspec.Raw = msgspec.Raw()  # empty: no args


class _PeerArgs(msgspec.Struct, gc=False):
    src: Any = msgspec.field(name="Src Rank", default=None)
    dst: Any = msgspec.field(name="Dst Rank", default=None)
    ranks: Any = msgspec.field(name="Process Group Ranks", default=None)


_OPS = msgspec.json.Decoder(list[_Op])
_ARGS = msgspec.json.Decoder(_PeerArgs)


def p2p_peers(trace: RawTrace) -> set[int]:
    """The global ranks other than its own that the trace's p2p ops name as peers."""
    found: set[int] = set()
    text = memoryview(trace.events_json)
    for _, _, ops in decoded_pieces(trace.path, text, _OPS):
        for op in ops:
            if op.name == RECORD_PARAM_COMMS and len(op.args):
                found |= _peers(op.args)
    return found - {trace.rank}


def _peers(raw: msgspec.Raw) -> set[int]:
    try:
        args = _ARGS.decode(raw)
    except msgspec.DecodeError:  # args that are no object, or fields of other types: no peer said
        return set()
    ranks = args.ranks
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            ranks = None
    peers = {peer for peer in (args.src, args.dst) if type(peer) is int and peer >= 0}
    if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks):
        return {ranks[peer] for peer in peers if peer < len(ranks)}
    return peers
