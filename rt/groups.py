"""What the body of an ``async with`` raised, out of the groups trio's nurseries
wrap it in: the caller's ``except KeyError`` then catches it as itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import trio


def only(group: BaseExceptionGroup, err: BaseException) -> bool:
    """Whether ``err`` is in ``group`` and every other leaf of it is a Cancelled."""
    leaves = list(_leaves(group))
    return any(e is err for e in leaves) and all(
        e is err or isinstance(e, trio.Cancelled) for e in leaves
    )


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


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    # (a group the body raised is not found: the nurseries hold derived copies of it)
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e
