"""The child process's entry point: ``python -m rt.actors.child --ctl FD --parent PID``.

1. Arm the parent-death signal (SIGKILL), then re-check the parent's pid: the
   parent may have died before the signal was armed, and the signal is tied
   to the thread that forked us, so it cannot be relied on alone.
2. Read the boot message from the control socket, import what the parent
   could (its ``sys.path``), build the actor, run its start-up, report ready.
3. Run the actor under ``trio.run`` with a heartbeat timer, a SIGTERM handler
   (cancel, exit 0) and a watch on the control socket (EOF: the parent died).

A start-up error or a crash is reported as its traceback and
:func:`describe_error`'s one line: the innermost real exception, not the last
line of an exception group's traceback. A crash is told the moment the
exception reaches the top level, before the slow part of dying (cancelling
the other tasks, closing rings, the interpreter's teardown: up to seconds
with torch loaded): first the heartbeat's going-down slot (the supervisor's
status reads it), then the report on the control socket (which wakes it).

This module imports nothing heavy: the restore time of a light actor is the
interpreter's start plus trio's import.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import traceback
from contextlib import ExitStack
from typing import Any

import trio

from rt.actors import boot as wire
from rt.actors.actor import ActorContext
from rt.actors.boot import ChildBoot
from rt.actors.faults import Faults
from rt.actors.heartbeat import Heartbeat
from rt.errors import ConfigError, EndOfChannel, ModelLoadError
from rt.groups import leaves

PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 70  # the parent was gone before or while we started


def arm_parent_death(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def describe_error(error: BaseException) -> str:
    """``Type: message`` (first line) of the exception an error comes down to:
    through exception groups (a nursery wraps what its tasks raise) to the first
    leaf that is not ``trio.Cancelled`` (the siblings the failure cancelled)."""
    found = list(leaves(error))
    leaf = next((e for e in found if not isinstance(e, trio.Cancelled)), found[0])
    cls = type(leaf)
    name = cls.__qualname__
    if cls.__module__ not in ("builtins", "__main__"):  # as a traceback names it
        name = f"{cls.__module__}.{name}"
    try:
        message = str(leaf).strip().partition("\n")[0]
    except Exception:
        message = "<str() of the exception failed>"
    return f"{name}: {message}" if message else name


def _attach(boot: ChildBoot, stack: ExitStack) -> tuple[ActorContext, Heartbeat]:
    faults = Faults(boot.fault_plan, boot.name, boot.incarnation)
    heartbeat = Heartbeat(boot.heartbeat_segment, boot.heartbeat_slot)
    heartbeat.beat()
    inbox, outbox = {}, {}
    if boot.inboxes or boot.outboxes:
        from rt.actors.mailbox import Inbox, Outbox
        from rt.shm import RingReceiver, RingSender

        for name, spec in boot.inboxes.items():
            rx = RingReceiver.attach(spec)
            stack.callback(rx.close)
            inbox[name] = Inbox(name, rx, faults, heartbeat.beat)
        for name, spec in boot.outboxes.items():
            tx = RingSender.attach(spec)
            stack.callback(tx.close)
            outbox[name] = Outbox(name, tx, faults, heartbeat.beat)
    ctx = ActorContext(boot.name, boot.incarnation, faults, heartbeat, inbox, outbox)
    return ctx, heartbeat


async def _beat_forever(ctx: ActorContext, interval: float) -> None:
    while True:
        ctx.beat()
        await trio.sleep(interval)


async def _exit_when_parent_gone(ctl: socket.socket) -> None:
    """The parent holds its end until it has reaped us: EOF means it died."""
    while True:
        await trio.lowlevel.wait_readable(ctl)
        try:
            if not ctl.recv(4096):
                os._exit(EXIT_ORPHANED)
        except BlockingIOError:
            continue


async def _stop_on_sigterm(cancel_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            cancel_scope.cancel()
            return


def _report(ctl: socket.socket, crash: tuple[str, str, str]) -> None:
    """Write the crash report now: a few KB into a socket buffer the parent left
    empty, so it does not wait. A parent gone meanwhile has nobody to tell."""
    with contextlib.suppress(OSError):
        ctl.setblocking(True)
        ctl.sendall(wire.encode(crash))
        ctl.setblocking(False)


async def _start_up(boot: ChildBoot, ctx: ActorContext) -> Any:
    """Build the actor and run its start-up, beating meanwhile: a start-up stuck on
    the trio thread stops the beats, and the supervisor gives up on it after a tenth
    of its startup_timeout (STARTUP_SILENCE_SHARE), not the whole (600 s for the
    scheduler). Work that takes long (loading a model) runs on a worker thread."""
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_beat_forever, ctx, boot.heartbeat_interval)
        try:
            await ctx.faults.point("startup")
            actor = boot.factory(*boot.args, **boot.kwargs)
            startup = getattr(actor, "startup", None)  # optional for duck-typed actors
            if startup is not None:
                await startup(ctx)
        except BaseException as err:  # raised alone, not in the nursery's group
            if isinstance(err, trio.Cancelled):
                raise
            error = err
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return actor


async def run_child(boot: ChildBoot, ctl: socket.socket) -> int:
    with ExitStack() as stack:
        try:
            ctx, heartbeat = _attach(boot, stack)
            actor = await _start_up(boot, ctx)
        except Exception as err:
            # the same start-up would fail again: options, or a model that does not load
            refused = isinstance(err, ConfigError | ModelLoadError)
            report = ("startup_error", traceback.format_exc(), describe_error(err), refused)
            ctl.sendall(wire.encode(report))
            return 1
        ctl.sendall(wire.encode(("ready",)))
        ctl.setblocking(False)
        crash: tuple[str, str, str] | None = None
        code = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_beat_forever, ctx, boot.heartbeat_interval)
            nursery.start_soon(_exit_when_parent_gone, ctl)
            nursery.start_soon(_stop_on_sigterm, nursery.cancel_scope)
            try:
                await actor.run(ctx)
            except SystemExit as exit:  # sys.exit(n) in an actor: exit n, as in a script
                code = exit.code if isinstance(exit.code, int) else 1
            except EndOfChannel:  # a producer closed its ring cleanly: a normal end
                code = 0
            except Exception as err:
                heartbeat.set_going_down()  # first: the supervisor's status says so now
                crash = ("crashed", traceback.format_exc(), describe_error(err))
                _report(ctl, crash)  # wakes the supervisor; it reads the report at the exit
            finally:
                heartbeat.set_going_down()  # any end of the run: this incarnation is over
            nursery.cancel_scope.cancel()
        if crash is not None:
            sys.stderr.write(f"actor {boot.name!r} (pid {os.getpid()}) crashed:\n{crash[1]}")
            return 1
        return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rt.actors.child")
    parser.add_argument("--ctl", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--name", default="")
    args = parser.parse_args(argv)
    arm_parent_death(args.parent)
    ctl = socket.socket(fileno=args.ctl)
    message = wire.recv_blocking(ctl)
    if message is None:
        os._exit(EXIT_ORPHANED)
    sys_path, payload = message
    sys.path[:] = sys_path
    try:
        boot: ChildBoot = pickle.loads(payload)
    except Exception as err:
        report = ("startup_error", traceback.format_exc(), describe_error(err), False)
        ctl.sendall(wire.encode(report))
        sys.exit(1)
    sys.exit(trio.run(run_child, boot, ctl))


if __name__ == "__main__":
    main()
