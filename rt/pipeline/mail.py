"""Receiving and sending objects in a supervised pipeline.

Every ring of the pipeline outlives the processes at its ends. When a peer
dies its ring reads as broken (or, if it closed it on the way out, as ended)
until the supervisor's restart attaches a successor; an actor waits that
out instead of failing, so one death never cascades.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from rt.actors.mailbox import Inbox, Outbox
from rt.errors import Broken, EndOfChannel, SegmentError
from rt.shm import Frame, codec

log = logging.getLogger(__name__)
RETRY_S = 0.02  # how often to look again while a peer restarts


@dataclass(frozen=True)
class Unreadable:
    """A frame that did not decode (corruption): the actor logs it and commits it
    in its turn, never crashing on it again and again."""

    error: str


async def receive(inbox: Inbox) -> tuple[Any, Frame]:
    tries = 0
    while True:
        try:
            frame = await inbox.receive()
        except (Broken, EndOfChannel):
            await trio.sleep(RETRY_S)
            continue
        except SegmentError as err:  # a side frame's: no fd now, or lost (the frontend resends)
            tries = await unreadable_side(inbox.name, err, tries)
            continue
        try:
            return codec.loads(frame.data), frame
        except Exception as err:
            log.error("%s: a frame at offset %d does not decode: %r", inbox.name, frame.offset, err)
            return Unreadable(repr(err)), frame


async def unreadable_side(name: str, err: SegmentError, tries: int) -> int:
    """Say that a side frame cannot be read (the first time, then every 100th) and
    wait before the next try, longer each time: out of fds may last. ``tries``
    before this one; returns it plus one."""
    tries += 1
    if tries % 100 == 1:
        log.error("%s: a side frame cannot be read: %s", name, err)
    await trio.sleep(min(RETRY_S * tries, 0.5))
    return tries


async def send(outbox: Outbox, obj: Any) -> None:
    data = codec.dumps(obj)
    while True:
        try:
            await outbox.send(data)
            return
        except Broken:  # the reader is gone (with a full ring, or having closed it)
            await trio.sleep(RETRY_S)
