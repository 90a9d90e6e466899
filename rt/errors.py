"""Every exception rt raises, in one place.

The tree::

    RtError
    ├── ChannelError                  rings and mailboxes (rt/shm)
    │   ├── WouldBlock                send_nowait on a full ring / receive_nowait on an empty one
    │   ├── Closed                    *your* side closed the channel, then used it
    │   ├── Broken                    the *peer* is gone (died, or closed while you sent)
    │   ├── EndOfChannel              the peer closed cleanly and every frame has been received
    │   └── SegmentError              a shared-memory segment is missing, foreign or corrupt
    │       └── ResourceExhausted     the host is out, for now, of what a segment needs: retry later
    │           └── SharedMemoryFull  /dev/shm has no room for it (the message says how much)
    ├── ActorError                    supervision (rt/actors)
    │   ├── ActorStartupError         a child raised during start-up (carries its traceback)
    │   ├── ActorCrashed              a child exited abnormally (carries the exit reason)
    │   └── EscalationError           restart intensity exceeded: the run shuts down
    ├── FaultInjected                 raised on purpose by a fault plan (rt/actors/faults)
    ├── ConfigError(ValueError)       an option that cannot work, said at start-up
    ├── ModelLoadError                a model directory that cannot be loaded (rt/gpu)
    │   └── UnsupportedModelError     an architecture or feature rt does not implement
    ├── RequestError                  one request is refused or failed; others go on
    │   ├── InvalidRequestError(ValueError)   bad parameters: says what was expected and what arrived
    │   ├── ContextOverflowError      prompt + max_new_tokens do not fit the context or the KV pool
    │   ├── RequestTooLargeError      the request cannot fit the server's shared memory at all
    │   ├── RequestAborted            the request was aborted (client gone, admin abort)
    │   ├── RequestFailedError        a poison request (K crashes), or an internal error it alone hit
    │   └── ServiceUnavailableError   an actor it needs did not come back within the wait
    └── EngineShutdownError           the engine is stopping and accepts nothing new

As in trio, "you closed it" (``Closed``) and "the peer broke it" (``Broken``)
are different errors: the first is a bug in the caller, the second a fault
the supervisor recovers from. This module imports nothing, so every layer
(rt/gpu included, which never imports trio) can use it.
"""

from __future__ import annotations


class RtError(Exception):
    """Base of every error rt raises on purpose."""


class ChannelError(RtError):
    """A ring or mailbox cannot do what was asked."""


class WouldBlock(ChannelError):
    """The non-blocking call would have had to wait."""


class Closed(ChannelError):
    """This side of the channel was closed, and then used."""


class Broken(ChannelError):
    """The peer is gone: it died, or it closed the channel while we still sent."""


class EndOfChannel(ChannelError):
    """The peer closed its side cleanly and every frame has been received."""


class SegmentError(ChannelError):
    """A shared-memory segment is missing, not rt's, or its header is corrupt."""


class ResourceExhausted(SegmentError):
    """The host is out of something a segment needs (file descriptors, room in
    /dev/shm) for now. ``fits_ever``: whether trying again can ever succeed."""

    def __init__(self, message: str, fits_ever: bool = True) -> None:
        super().__init__(message)
        self.fits_ever = fits_ever


class SharedMemoryFull(ResourceExhausted):
    """/dev/shm (a tmpfs, 64 MiB in a default Docker container) has no room for a
    segment; ``fits_ever`` is False when it would not fit the filesystem empty."""


class ActorError(RtError):
    """Supervision of a child process failed."""


class ActorStartupError(ActorError):
    """A child raised before reporting ready. ``child_traceback`` holds its traceback;
    ``refused`` says it was a ConfigError: starting again would fail the same way;
    ``transient`` that no process could be made (out of fds): a later try may work."""

    def __init__(
        self,
        message: str,
        child_traceback: str = "",
        refused: bool = False,
        transient: bool = False,
    ) -> None:
        super().__init__(message if not child_traceback else f"{message}\n{child_traceback}")
        self.child_traceback = child_traceback
        self.refused = refused
        self.transient = transient


class ActorCrashed(ActorError):
    """A child exited abnormally. ``reason`` says how (exit code, signal, watchdog)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class EscalationError(ActorError):
    """A child restarted more than the intensity allows; the whole run stops."""


class FaultInjected(RtError):
    """Raised on purpose by a fault plan."""


class ConfigError(RtError, ValueError):
    """An option that cannot work. The message names the option and the accepted values."""


class ModelLoadError(RtError):
    """A model directory could not be loaded (missing file, bad config, bad weights)."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint needs an architecture or feature rt does not implement."""


class RequestError(RtError):
    """One request was refused or failed; the engine and other requests go on."""


class InvalidRequestError(RequestError, ValueError):
    """A request's parameters are out of range or of the wrong type."""


class ContextOverflowError(RequestError):
    """prompt + max_new_tokens is longer than the model's context or the KV pool."""


def no_room_for_prompt(max_new_tokens: int, context_length: int) -> str:
    """The overflow a prompt cannot fix: max_new_tokens alone fills the context (a
    prompt is one token at least, cut or not)."""
    return (
        f"max_new_tokens is {max_new_tokens}, which leaves no room for the "
        f"prompt in the context length {context_length}; lower max_new_tokens"
    )


class RequestTooLargeError(RequestError):
    """The request is larger than the server's shared memory can ever carry."""


def refused_for_room(err: ResourceExhausted) -> RequestError:
    """A request that could not be passed on between processes: /dev/shm (or the
    fd table) stayed full (ServiceUnavailableError: 503, try again), or it can
    never fit there (RequestTooLargeError: 413)."""
    if not err.fits_ever:
        return RequestTooLargeError(f"too large to pass on: {err}")
    return ServiceUnavailableError(f"no room to pass it on now: {err}")


class RequestAborted(RequestError):
    """The request was aborted before it finished."""


class RequestFailedError(RequestError):
    """The request failed alone: an actor crashed with it in hand K times (a poison
    request), or handling it raised an error that is a bug in rt."""


class EngineShutdownError(RtError):
    """The engine is shutting down and accepts no new work."""


class ServiceUnavailableError(RequestError):
    """A new request waited for a restarting actor longer than ``restart_wait_timeout``."""
