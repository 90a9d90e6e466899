"""Spawning one child process and watching it die.

A child is a fresh interpreter (``python -m rt.actors.child``), never a fork:
the parent may have imported torch. Its stdin is /dev/null, it leads its own
session (so a terminal's ^C reaches only the parent, which stops children in
order), and it inherits exactly the fds it needs.

``subprocess.Popen`` runs on the calling (trio) thread on purpose: the child
arms PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits,
and trio's ``open_process`` forks from a worker thread that its thread cache
retires after idling. Exit is seen through a pidfd (readable the moment the
child exits), not by polling.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import cloudpickle
import trio

from rt.actors import boot as wire
from rt.actors.affinity import format_cpu_list, pin_process
from rt.actors.boot import ChildBoot
from rt.errors import ActorStartupError

log = logging.getLogger("rt.actors")

EXIT_AFTER_ERROR_S = 5.0  # a child that reported a start-up error gets this long to exit
STUCK_POLL_S = 0.25  # how often a start-up's heartbeat is looked at
Stuck = Callable[[], str | None]  # why a child in its start-up is stuck, or None


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class ChildProcess:
    """A spawned child: signal it, wait for it, read its last report."""

    def __init__(self, popen: subprocess.Popen[bytes], ctl: socket.socket, name: str) -> None:
        self.name = name
        self.pid = popen.pid
        self.returncode: int | None = None
        self.exited_at: float | None = None  # time.monotonic() when the exit was seen
        self.report: str | None = None  # the traceback a crashing child sent
        self.error: str | None = None  # and its innermost exception, "Type: message"
        self.killed_after_grace = False
        self._popen = popen
        self._ctl = ctl
        self._pidfd = os.pidfd_open(popen.pid)
        self._exit = select.poll()  # (not select.select: it cannot take an fd past 1023)
        self._exit.register(self._pidfd, select.POLLIN)
        self._lock = trio.Lock()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped, so the pidfd is open and the pid ours
            with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                signal.pidfd_send_signal(self._pidfd, sig)

    def has_exited(self) -> bool:
        """Whether the child has exited, its exit seen by a waiter or not yet (the
        pidfd is readable from the moment it dies: no wait for a task to run)."""
        if self.returncode is not None:
            return True
        return bool(self._exit.poll(0))

    async def wait(self) -> int:
        """Wait for the exit and reap. Safe from several tasks; a cancelled waiter
        leaves the child to the next one."""
        async with self._lock:
            if self.returncode is None:
                await trio.lowlevel.wait_readable(self._pidfd)
                self.exited_at = time.monotonic()
                self.returncode = self._popen.wait()
                self._release()
        return self.returncode

    async def stop(self, grace: float) -> int:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL."""
        if self.returncode is None:
            self.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                return await self.wait()
            log.warning(
                "actor %r (pid %d) ignored SIGTERM for %.1f s: SIGKILL", self.name, self.pid, grace
            )
            self.killed_after_grace = True
            self.send_signal(signal.SIGKILL)
        return await self.wait()

    async def wait_report(self) -> None:
        """Return once the child has written its crash report (it does so as it
        starts to go down; the report is read at its exit) or has exited."""
        with contextlib.suppress(trio.ClosedResourceError):
            await trio.lowlevel.wait_readable(self._ctl)

    async def kill(self) -> int:
        self.send_signal(signal.SIGKILL)
        return await self.wait()

    async def handshake(self, timeout: float, stuck: Stuck | None = None) -> None:
        """Wait for "ready"; raise ActorStartupError if start-up fails, takes too
        long, or is stuck (``stuck`` says why, polled every STUCK_POLL_S)."""
        message, why = None, None

        async def watch(scope: trio.CancelScope) -> None:
            nonlocal why
            while stuck is not None and (why := stuck()) is None:
                await trio.sleep(STUCK_POLL_S)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            if stuck is not None:
                nursery.start_soon(watch, nursery.cancel_scope)
            with trio.move_on_after(timeout) as deadline:
                message = await wire.recv(self._ctl)
            nursery.cancel_scope.cancel()
        if message is None and why is not None:  # (what it said as it was found stuck)
            message = wire.recv_buffered(self._ctl)
        if message == ("ready",):
            return
        if why is not None and message is None:
            await self.kill()
            raise ActorStartupError(
                f"actor {self.name!r} (pid {self.pid}) stuck in its start-up: {why}"
            )
        if deadline.cancelled_caught:
            await self.kill()
            raise ActorStartupError(
                f"actor {self.name!r} (pid {self.pid}) did not report ready within {timeout} s "
                "(raise the actor's startup_timeout if its start-up is slow)"
            )
        with trio.move_on_after(EXIT_AFTER_ERROR_S):
            await self.wait()
        code = await self.kill()  # a no-op unless something kept it alive
        if message is not None and message[0] == "startup_error":
            _, child_traceback, error, refused = message
            raise ActorStartupError(
                f"actor {self.name!r} (pid {self.pid}) raised during start-up: {error}",
                child_traceback,
                refused=refused,
            )
        raise ActorStartupError(
            f"actor {self.name!r} (pid {self.pid}) exited before reporting ready "
            f"({describe_exit(code)})"
        )

    def _release(self) -> None:
        message = wire.recv_buffered(self._ctl)
        if message is not None and message[0] == "crashed":
            _, self.report, self.error = message
        trio.lowlevel.notify_closing(self._ctl)  # wakes wait_report
        self._ctl.close()
        trio.lowlevel.notify_closing(self._pidfd)
        self._exit.unregister(self._pidfd)
        os.close(self._pidfd)


TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def _cannot_start(name: str, err: OSError) -> ActorStartupError:
    """No process could be made. Out of fds or processes (which a client can cause):
    the supervisor tries again, uncounted; anything else (a missing interpreter)
    counts toward the restart intensity like any failed start."""
    transient = err.errno in TRANSIENT
    again = "; trying again" if transient else ""
    return ActorStartupError(
        f"cannot start a process for actor {name!r}: {err}{again}", transient=transient
    )


async def spawn(
    boot: ChildBoot,
    *,
    pass_fds: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    cpus: Sequence[int] | None = None,
    stuck: Stuck | None = None,
) -> ChildProcess:
    """Start a child running ``boot``'s actor and wait until it reports ready;
    pinned to ``cpus`` (before it starts a thread: its interpreter is starting)."""
    try:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as err:
        raise _cannot_start(boot.name, err) from err
    try:
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rt.actors.child",
                "--ctl",
                str(child_end.fileno()),
                "--parent",
                str(os.getpid()),
                "--name",
                boot.name,
            ],
            stdin=subprocess.DEVNULL,
            pass_fds=(child_end.fileno(), *pass_fds),
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    except BaseException as err:
        parent_end.close()
        if isinstance(err, OSError):
            raise _cannot_start(boot.name, err) from err
        raise
    finally:
        child_end.close()
    parent_end.setblocking(False)
    try:
        proc = ChildProcess(popen, parent_end, boot.name)
    except OSError as err:  # its pidfd: out of fds
        popen.kill()
        popen.wait()
        parent_end.close()
        raise _cannot_start(boot.name, err) from err
    try:
        if cpus is not None:
            try:
                pin_process(cpus, popen.pid)
            except OSError as err:  # a CPU taken offline since the engine started
                raise ActorStartupError(
                    f"actor {boot.name!r} (pid {popen.pid}): cannot pin it to CPUs "
                    f"{format_cpu_list(cpus)}: {err}"
                ) from err
        # A child that died at once breaks the pipe: the handshake then reads EOF
        # and says how it exited.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await wire.send(parent_end, (list(sys.path), cloudpickle.dumps(boot)))
        await proc.handshake(startup_timeout, stuck)
    except BaseException:
        with trio.CancelScope(shield=True):
            await proc.kill()
        raise
    return proc
