"""One child process: how it is started, what it inherits, how start-up fails."""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Iterator

import pytest
import trio
from sample_actors import FailingStartup, Idle

from rt.actors import ActorSpec, RingDecl, SupervisorSpec, open_supervisor, process
from rt.actors import boot as wire
from rt.actors.boot import ChildBoot
from rt.actors.child import describe_error
from rt.actors.heartbeat import HeartbeatTable
from rt.actors.process import spawn
from rt.chaos import leaks
from rt.errors import ActorStartupError
from rt.shm.segment import new_run_prefix


@pytest.fixture
def heartbeats() -> Iterator[HeartbeatTable]:
    table = HeartbeatTable.create(new_run_prefix(), 1)
    yield table
    table.close()


def _boot(table: HeartbeatTable, factory: object) -> ChildBoot:
    return ChildBoot(
        name="solo", factory=factory, args=(), kwargs={}, incarnation=1,
        heartbeat_segment=table.name, heartbeat_slot=0, heartbeat_interval=0.1,
        inboxes={}, outboxes={}, fault_plan=None,
    )  # fmt: skip


async def test_startup_error_carries_the_child_traceback(heartbeats: HeartbeatTable) -> None:
    with pytest.raises(ActorStartupError) as caught, trio.fail_after(20):
        await spawn(_boot(heartbeats, FailingStartup))
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith("actor 'solo' (pid ")
    assert first_line.endswith(
        " raised during start-up: RuntimeError: this actor cannot start: boom"
    )
    assert "RuntimeError: this actor cannot start: boom" in caught.value.child_traceback
    assert "sample_actors.py" in caught.value.child_traceback


async def test_a_child_that_dies_before_ready_is_a_startup_error(
    heartbeats: HeartbeatTable,
) -> None:
    with pytest.raises(ActorStartupError, match=r"exited before reporting ready \(exit code 4\)"):
        with trio.fail_after(20):
            await spawn(_boot(heartbeats, _exit_4))


def _exit_4() -> None:
    os._exit(4)


async def test_startup_timeout_kills_the_child(heartbeats: HeartbeatTable) -> None:
    with pytest.raises(ActorStartupError, match=r"did not report ready within 0\.5 s"):
        with trio.fail_after(20):
            await spawn(_boot(heartbeats, _sleep_forever), startup_timeout=0.5)


def _sleep_forever() -> None:
    import time

    time.sleep(3600)


async def test_child_has_its_own_session_devnull_stdin_and_only_its_fds() -> None:
    spec = SupervisorSpec(
        children=(ActorSpec("plain", Idle), ActorSpec("other", Idle)),
        rings=(RingDecl("unused", 4096),),
    )
    async with open_supervisor(spec) as sup:
        fds = {a.name: _fd_targets(a.pid) for a in sup.status().actors}
        parent = _fd_targets(os.getpid())
        for actor in sup.status().actors:
            pid = actor.pid
            assert pid is not None
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid
            assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
            mine = fds[actor.name]
            # neither the ring's eventfds (not its inbox or outbox) nor any pidfd
            assert not mine & {"anon_inode:[eventfd]", "anon_inode:[pidfd]"}
            # no socket of the parent's (control sockets), none of its sibling's
            sockets = {t for t in mine if t.startswith("socket:")}
            assert sockets and not sockets & parent
            for other, theirs in fds.items():
                assert other == actor.name or not sockets & theirs


def _fd_targets(pid: int | None) -> set[str]:
    targets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return targets


async def test_describe_error_names_the_innermost_exception() -> None:
    cancelled = None
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as err:
            cancelled = err
            raise
    assert cancelled is not None
    boom = ValueError("boom\nsecond line")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [boom, KeyError("k")])])
    assert describe_error(nested) == "ValueError: boom"
    assert describe_error(BaseExceptionGroup("g", [cancelled, nested])) == "ValueError: boom"
    assert describe_error(BaseExceptionGroup("g", [cancelled])).startswith("trio.Cancelled: ")
    assert describe_error(ActorStartupError("failed", "Traceback ...")) == (
        "rt.errors.ActorStartupError: failed"
    )
    assert describe_error(RuntimeError()) == "RuntimeError"


@pytest.mark.parametrize(
    ("code", "transient"),
    [(errno.EMFILE, True), (errno.EAGAIN, True), (errno.ENOENT, False), (errno.EACCES, False)],
)
def test_a_process_not_made_is_retried_uncounted_only_for_want_of_fds_or_processes(
    code: int, transient: bool
) -> None:
    # A client can exhaust fds (retried, uncounted); a missing interpreter (a deploy
    # replaced the venv) would never start: counted, so that it escalates.
    err = process._cannot_start("tokenizer0", OSError(code, os.strerror(code)))
    assert err.transient is transient
    assert str(err).endswith("; trying again") is transient


async def test_a_child_killed_before_it_read_its_boot_is_a_startup_error(
    heartbeats: HeartbeatTable,
) -> None:
    """Killed before it read what it was sent (an actor's successor, by kill -9 or
    the OOM killer in its first 0.1 s), its socket reset: that ConnectionResetError
    escaped the handshake, and rt-serve exited 1. It is a start-up failure."""

    async def kill_it_at_once(others: set[int]) -> None:
        """The test process's new child (only it: a reaper may be another)."""
        while True:
            for pid in leaks.processes()[0].keys() - others:
                os.kill(pid, signal.SIGKILL)
                return
            await trio.sleep(0)

    for _ in range(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_it_at_once, set(leaks.processes()[0]))
            with pytest.raises(ActorStartupError, match="exited before reporting ready"):
                with trio.fail_after(20):
                    await spawn(_boot(heartbeats, Idle))


async def test_recv_is_an_end_when_the_peer_died_with_what_it_was_sent_unread() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.setblocking(False)
        await wire.send(ours, ("boot", b"x" * 100))
        theirs.close()  # unread
        assert await wire.recv(ours) is None  # (was ConnectionResetError)
