"""What the body of an ``async with`` raised, out of the groups trio's nurseries
wrap it in: the caller's ``except KeyError`` then catches it as itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import trio


def only(group: BaseExceptionGroup, err: BaseException) -> bool:
    """Whether ``err`` is in ``group`` and every other leaf of it is a Cancelled;
    for a group ``err``, whether its leaves are (a group the body raised comes
    back as derived copies, holding the same leaves)."""
    mine = list(leaves(err))
    found = list(leaves(group))
    ours = {id(e) for e in mine}
    return all(any(e is m for e in found) for m in mine) and all(
        id(e) in ours or isinstance(e, trio.Cancelled) for e in found
    )


def lone(group: BaseExceptionGroup) -> BaseException | None:
    """The one leaf of ``group`` that is not a Cancelled, if there is exactly one:
    what stopped a start-up (an escalation, a Ctrl-C), the rest its echoes."""
    found = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
    return found[0] if len(found) == 1 else None


def made_of(err: BaseException, *kinds: type[BaseException]) -> bool:
    """Whether ``err`` is one of ``kinds``, or a group whose every leaf is."""
    if isinstance(err, BaseExceptionGroup):
        return all(made_of(e, *kinds) for e in err.exceptions)
    return isinstance(err, kinds)


def raise_as_is(err: BaseException) -> NoReturn:
    """Raise ``err`` from inside an ``except`` of its group, its own context kept
    (not the group it was caught in)."""
    context, suppress = err.__context__, err.__suppress_context__
    try:
        raise err
    finally:
        err.__context__, err.__suppress_context__ = context, suppress


def leaves(err: BaseException) -> Iterator[BaseException]:
    """``err``'s leaves: itself, or a group's, however deep."""
    if isinstance(err, BaseExceptionGroup):
        for e in err.exceptions:
            yield from leaves(e)
    else:
        yield err
