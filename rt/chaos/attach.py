"""A running rt-serve that ``rt-chaos --url`` attaches to: what its
``/server_info`` says decides how the run is judged and whether it can be run.

* the model it serves, and how (``model_path``, ``load_format``, ``dtype``,
  ``device``): the replays that judge its outputs load the same (a checker
  that replayed rt-chaos's own default model found every output of a
  ``--load-format dummy`` server "diverged", with no fault at all);
* its restart limit (``--max-restarts`` in ``--restart-window``): a schedule
  whose faults restart actors more often than that makes the server give up,
  as it should, and the run then blamed the server for it. Such a schedule is
  refused before it starts, saying what to change (a server rt-chaos starts
  itself gets a limit that fits its schedule). A schedule drawn for the server
  is first spread out to fit it (:func:`spaced`): a server at its default
  flags (5 restarts in 60 s) takes the default runs (they were refused, the
  documented examples with them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rt.chaos.schedule import Schedule, ScheduleConfig

SPACING_MARGIN = 1.1  # faults a little further apart than the budget allows at its fullest
RESTART_AFTER_STOP_S = 5.0  # past the watchdog's timeout: a stopped actor's restart is due
MEAN_EXTRA_WAIT_S = 0.85 + 1.0  # the drawn part of a fault's wait, and its phase's (roughly)


class AttachError(RuntimeError):
    """The server attached to cannot be run against as asked (rt-chaos exits 2)."""


@dataclass(frozen=True)
class Served:
    device: str
    dtype: str
    model_path: str
    load_format: str
    max_restarts: int
    restart_window: float
    watchdog_timeout: float = 30.0  # (a stop left to it restarts its actor this much later)


async def served(url: str) -> Served:
    """What a running rt-serve says of itself (its ``/server_info``)."""
    import httpx

    from rt.chaos.targets import ServerTarget

    try:
        async with httpx.AsyncClient() as http:
            info = await ServerTarget(url.rstrip("/"), http).info()
        return of_info(info)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        raise AttachError(f"{url}: no rt-serve /server_info to read ({err!r})") from err


def of_info(info: dict[str, Any]) -> Served:
    config = info["config"]
    return Served(
        str(config["device"]),
        str(config["dtype"]),
        str(info["model"]["path"]),
        str(config.get("load_format", "auto")),
        int(config["max_restarts"]),
        float(config["restart_window"]),
        float(config.get("watchdog_timeout", 30.0)),
    )


def restarts_at_once(schedule: Schedule, window: float, stop_restart_s: float = 0.0) -> int:
    """The most actor restarts the schedule's signal faults could cause within one
    ``window`` of seconds: each kill restarts its actor at once; a stop left to the
    watchdog does ``stop_restart_s`` later. A fault fires ``wait_s`` after the one
    before it at the soonest."""
    at, times = 0.0, []
    for fault in schedule.faults:
        if fault.via != "signal":
            continue
        at += fault.wait_s
        if fault.kind != "sigstop":
            times.append(at)
        elif fault.stop_s is None:
            times.append(at + stop_restart_s)
    times.sort()
    return max(
        (sum(1 for t in times[i:] if t - start < window) for i, start in enumerate(times)),
        default=0,
    )


def spaced(config: ScheduleConfig, server: Served, duration: float | None = None) -> ScheduleConfig:
    """``config`` with its signal faults far enough apart that the restarts they
    cause stay within ``server``'s limit (a window's worth of them at most), and
    no more of them than a run of ``duration`` seconds has room for. The restart
    phase (a fault while the one before is still restarting its actor: two
    restarts at once) is left out when the faults must be spread out."""
    if server.max_restarts <= 0:  # (nothing fits: refused as before)
        return config
    slots = max(1, server.max_restarts - 1)  # (one spare: a restart of rt's own is no fault)
    gap = SPACING_MARGIN * server.restart_window / slots
    if gap <= config.min_wait_s:
        return config
    phases = tuple(p for p in config.phases if p != "restart") or config.phases
    faults = config.faults
    if duration is not None:  # (a count of requests goes on until the faults fired)
        faults = min(faults, max(1, int(duration // (gap + MEAN_EXTRA_WAIT_S))))
    # a stop left to the watchdog restarts its actor a watchdog later: the next fault
    # waits that much more, so that the restarts, not only the faults, are spread
    stop_restart_s = server.watchdog_timeout + RESTART_AFTER_STOP_S
    return replace(
        config, min_wait_s=gap, phases=phases, faults=faults, stop_restart_s=stop_restart_s
    )


def check_restart_limit(schedule: Schedule, server: Served) -> None:
    """Refuse a schedule that would restart the server's actors past its limit."""
    need = restarts_at_once(schedule, server.restart_window, server.watchdog_timeout)
    if need > server.max_restarts:
        raise AttachError(
            f"this schedule may restart actors {need} times within {server.restart_window:g} s, "
            f"and the server gives up past {server.max_restarts} (its --max-restarts in "
            f"--restart-window): the run would end in its giving up, as it should. Start "
            f"rt-serve with --max-restarts {2 * need + 5}, or ask for fewer faults "
            "(--fault-count)"
        )
