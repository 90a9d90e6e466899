"""The supervisor's decisions, as pure functions of time and history.

No trio, no processes: which children restart, whether the intensity allows
it, and how long to back off. Times are plain floats in seconds.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from rt.actors.spec import Restart, Strategy


def should_restart(restart: Restart, abnormal: bool) -> bool:
    """Whether a child of this restart type is started again after its exit."""
    if restart is Restart.PERMANENT:
        return True
    if restart is Restart.TRANSIENT:
        return abnormal
    return False


def affected(strategy: Strategy, failed: int, count: int) -> range:
    """Indices (in start order) of the children to stop and restart when child
    ``failed`` of ``count`` fails."""
    if not 0 <= failed < count:
        raise IndexError(f"child {failed} of {count}")
    if strategy is Strategy.ONE_FOR_ONE:
        return range(failed, failed + 1)
    if strategy is Strategy.REST_FOR_ONE:
        return range(failed, count)
    return range(count)


@dataclass
class RestartIntensity:
    """At most ``max_restarts`` restarts within any ``max_seconds`` window, of
    all the supervisor's children together (as Erlang/OTP counts them)."""

    max_restarts: int
    max_seconds: float
    _times: deque[tuple[float, str]] = field(default_factory=deque)  # (when, whose)

    def record(self, now: float, who: str = "") -> bool:
        """Count one restart (of child ``who``) at ``now``. False: the intensity
        is exceeded, escalate."""
        self._times.append((now, who))
        while self._times and self._times[0][0] <= now - self.max_seconds:
            self._times.popleft()
        return len(self._times) <= self.max_restarts

    def recent(self, now: float) -> int:
        """Restarts counted within the window ending at ``now``."""
        return sum(1 for t, _ in self._times if t > now - self.max_seconds)

    def exceeded(self) -> str:
        """Why an escalation for the intensity: the limit, and whose restarts spent it
        (the child that exited last may have had few of them)."""
        counts = Counter(who for _, who in self._times)
        return (
            f"exited once too often: more than {self.max_restarts} restarts within "
            f"{self.max_seconds:g} s, counting every actor of the supervisor ("
            + ", ".join(f"{who} {n}" for who, n in counts.items())
            + ")"
        )


@dataclass
class Backoff:
    """Delay before restarting a crash-looping child.

    A crash after the child ran at least ``reset_after`` seconds starts a new
    streak (delay 0); each further quick crash doubles the delay from
    ``initial``, capped at ``maximum``. A crash charged to the requests the
    child had in hand (``with_requests``) counts in the streak but waits at
    most ``initial``.
    """

    initial: float
    maximum: float
    reset_after: float
    streak: int = 0

    def next_delay(self, ran_for: float, *, with_requests: bool = False) -> float:
        if ran_for >= self.reset_after:
            self.streak = 0
        self.streak += 1
        if self.streak == 1 or self.initial == 0:
            return 0.0
        delay = min(self.maximum, self.initial * 2.0 ** (self.streak - 2))
        # An actor refuses a poison request only once it has crashed with it in
        # hand K times, and every other request waits on those restarts: doubling
        # would make isolating n poison requests cost up to n * K * maximum. The
        # initial delay still keeps a floor under the restart rate of an actor
        # that crashes at every request.
        return min(delay, self.initial) if with_requests else delay
