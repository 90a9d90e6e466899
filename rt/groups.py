"""What the body of an ``async with`` raised, out of the groups trio's nurseries
wrap it in: the caller's ``except KeyError`` then catches it as itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import trio


def only(group: BaseExceptionGroup, err: BaseException) -> bool:
    """Whether ``err`` is in ``group`` and every other leaf of it is a Cancelled."""
    leaves = list(_leaves(group, err))
    return any(e is err for e in leaves) and all(
        e is err or isinstance(e, trio.Cancelled) for e in leaves
    )


def raise_as_is(err: BaseException) -> NoReturn:
    """Raise ``err`` from inside an ``except`` of its group, its own context kept
    (not the group it was caught in)."""
    context, suppress = err.__context__, err.__suppress_context__
    try:
        raise err
    finally:
        err.__context__, err.__suppress_context__ = context, suppress


def _leaves(group: BaseExceptionGroup, err: BaseException) -> Iterator[BaseException]:
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup) and e is not err:  # the body may raise a group
            yield from _leaves(e, err)
        else:
            yield e
