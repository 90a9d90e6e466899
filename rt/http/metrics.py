"""``/metrics``: Prometheus text, from a registry of the app's own (never
prometheus_client's global one, so two apps in one process do not collide).

Per-request figures are observed by the front as requests end (histograms,
counters); the engine's state (running and waiting requests, KV usage,
retractions, actor restarts) is read at scrape time by a collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rt.actors import ActorStatus
from rt.frontend.health import state_of
from rt.messages import SchedulerStats

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class EngineState:
    """What the collector reads at scrape time."""

    running: int  # requests the engine has not ended that have their first token
    waiting: int  # requests the engine has not ended still waiting for it
    scheduler: SchedulerStats | None  # the scheduler's last report (idle, or each second busy)
    retractions: int  # since start, by every incarnation of the scheduler
    actors: tuple[ActorStatus, ...]


class Metrics:
    def __init__(self, state: Callable[[], EngineState]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "rt_time_to_first_token_seconds",
            "From arrival to the first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "rt_inter_token_latency_seconds",
            "Between two tokens of one sequence",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "rt_e2e_request_latency_seconds",
            "From arrival to the last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "rt_queue_time_seconds",
            "From arrival until the scheduler first admitted the request (Meta.queue_time)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "rt_requests",
            "Requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "rt_finished_requests", "Generations ended, by finish reason", ["reason"], registry=r
        )
        self.aborted = Counter(
            "rt_aborted_requests",
            "Generations aborted before their end, by cause",
            ["cause"],
            registry=r,
        )
        self.prompt_tokens = Counter("rt_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter(
            "rt_cached_prompt_tokens", "Prompt tokens found in the prefix cache", registry=r
        )
        self.generation_tokens = Counter("rt_generation_tokens", "Generated tokens", registry=r)
        self.rejected = Counter(
            "rt_rejected_requests",
            "Requests refused with 503 past the queue limit (one a request, however many "
            "prompts and samples it asked for)",
            registry=r,
        )
        self.prompt_total = 0
        self.cached_total = 0
        r.register(_EngineCollector(state, self))

    def count_tokens(self, prompt: int, cached: int, generated: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(generated)
        self.prompt_total += prompt
        self.cached_total += cached

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, state: Callable[[], EngineState], metrics: Metrics) -> None:
        self._state = state
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        yield _gauge(
            "rt_num_running_reqs", "Requests in flight that have their first token", state.running
        )
        yield _gauge(
            "rt_num_queue_reqs", "Requests in flight waiting for their first token", state.waiting
        )
        prompt, cached = self._metrics.prompt_total, self._metrics.cached_total
        yield _gauge(
            "rt_cache_hit_rate",
            "Share of prompt tokens served from the prefix cache, since start",
            cached / prompt if prompt else 0.0,
        )
        stats = state.scheduler
        if stats is not None:
            total = stats.request_tokens + stats.cached_tokens + stats.free_tokens
            yield _gauge(
                "rt_kv_cache_usage",
                "Share of KV slots held by requests, at the scheduler's last report",
                stats.request_tokens / total if total else 0.0,
            )
            yield _gauge(
                "rt_kv_cache_cached_tokens",
                "KV slots the prefix cache alone holds (no running request reads them: "
                "evictable), at the scheduler's last report",
                stats.cached_tokens,
            )
        retractions = CounterMetricFamily(
            "rt_retractions",
            "Decode requests retracted for lack of KV, since start (every scheduler's)",
        )
        retractions.add_metric([], state.retractions)
        yield retractions
        restarts = CounterMetricFamily(
            "rt_actor_restarts", "Restarts of each actor", labels=["actor"]
        )
        up = GaugeMetricFamily(
            "rt_actor_up",
            "1 while the actor is running (0 from a SIGSTOP or a pending SIGKILL on, as the "
            "kernel tells it, as /health)",
            labels=["actor"],
        )
        for actor in state.actors:
            restarts.add_metric([actor.name], actor.restart_count)
            up.add_metric([actor.name], 1.0 if state_of(actor) == "running" else 0.0)
        yield restarts
        yield up


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
