"""The actors and rings of an engine, as a supervisor spec.

    front-tok{i} ──▶ tokenizer{i} ──tok{i}-sched──▶ scheduler ──sched-detok──▶ detokenizer
                        └──tok{i}-front──▶ frontend ◀──detok-front──┘
    frontend ──front-sched──▶ scheduler    frontend ──front-detok──▶ detokenizer

Children start detokenizer, scheduler, tokenizers (and stop in reverse), one
for one: a child's death restarts it alone.
"""

from __future__ import annotations

from rt.actors import ActorSpec, ActorState, RingDecl, Strategy, SupervisorSpec, SupervisorStatus
from rt.actors.affinity import split_cpus
from rt.config import EngineOptions
from rt.pipeline.detokenizer import DetokenizerActor
from rt.pipeline.scheduler import SchedulerActor
from rt.pipeline.tokenizer import TokenizerActor

SCHEDULER, DETOKENIZER = "scheduler", "detokenizer"


def tokenizer_name(i: int) -> str:
    return f"tokenizer{i}"


def render_limit(watchdog_timeout: float) -> float:
    """How long a chat template may take to render one request: a quarter of the
    watchdog's timeout, so that a render a client makes loop is refused alone (a 400)
    long before the worker counts as hung; 2 s at most (one takes milliseconds),
    under SILENT_AFTER_S: the worker beats between renders, not during one, and
    one longer than that made /health say the worker showed no sign of life."""
    return min(2.0, watchdog_timeout / 4)


def live_tokenizers(status: SupervisorStatus, workers: int) -> list[int]:
    """The tokenizer workers running and showing signs of life (a beat within
    SILENT_AFTER_S): a stopped or stuck one would hold what is sent to it."""
    silent = {a.name for a in status.silent()}
    return [
        i
        for i in range(workers)
        if status.actor(tokenizer_name(i)).state is ActorState.RUNNING
        and tokenizer_name(i) not in silent
    ]


def can_serve(status: SupervisorStatus, workers: int) -> bool:
    """Whether a new request can be served now: the scheduler and the detokenizer
    running, and one tokenizer worker at least alive (the others may restart)."""
    return (
        status.running
        and all(status.actor(name).state is ActorState.RUNNING for name in (SCHEDULER, DETOKENIZER))
        and bool(live_tokenizers(status, workers))
    )


def supervisor_spec(options: EngineOptions) -> SupervisorSpec:
    workers = options.tokenizer_workers
    context_length, vocab_size = options.model_limits()
    tokenizer_path = options.resolved_tokenizer_path()
    chat_template = options.chat_template_text()  # read here: a bad one stops the start
    cap = options.ring_capacity
    sched_cpus = other_cpus = None
    if options.scheduler_cpus is not None:
        sched_cpus, other_cpus = split_cpus(options.scheduler_cpus)
    rings = [
        RingDecl(name, cap) for name in ("front-sched", "sched-detok", "front-detok", "detok-front")
    ]
    tokenizers = []
    for i in range(workers):
        rings += [
            RingDecl(f"front-tok{i}", cap),
            RingDecl(f"tok{i}-sched", cap),
            RingDecl(f"tok{i}-front", cap),
        ]
        tokenizers.append(
            ActorSpec(
                name=tokenizer_name(i),
                factory=TokenizerActor,
                args=(
                    i,
                    tokenizer_path,
                    context_length,
                    vocab_size,
                    options.tokenizer_batch_size,
                    options.tokenizer_batch_wait_ms / 1000,
                    options.max_crashes_per_request,
                    chat_template,
                    render_limit(options.watchdog_timeout),
                ),
                inboxes=(f"front-tok{i}",),
                outboxes=(f"tok{i}-sched", f"tok{i}-front"),
                cpus=other_cpus,
            )
        )
    sched_inboxes = (*(f"tok{i}-sched" for i in range(workers)), "front-sched")
    scheduler = ActorSpec(
        name=SCHEDULER,
        factory=SchedulerActor,
        args=(options.engine_config(), sched_inboxes),
        inboxes=sched_inboxes,
        outboxes=("sched-detok",),
        startup_timeout=600.0,
        cpus=sched_cpus,
    )
    detokenizer = ActorSpec(
        name=DETOKENIZER,
        factory=DetokenizerActor,
        args=(tokenizer_path,),
        inboxes=("sched-detok", "front-detok"),
        outboxes=("detok-front",),
        cpus=other_cpus,
    )
    return SupervisorSpec(
        children=(detokenizer, scheduler, *tokenizers),
        strategy=Strategy.ONE_FOR_ONE,
        rings=tuple(rings),
        max_restarts=options.max_restarts,
        max_seconds=options.restart_window,
        watchdog_timeout=options.watchdog_timeout,
        shutdown_grace=options.shutdown_grace,
        name="engine",
    )
