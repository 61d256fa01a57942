"""Stands in for a vLLM leader's /metrics where no GPU can run: the exact vLLM metric names
(spec-decode counters, serving gauges, counters and histograms) with counts that grow
linearly in time at known rates, so every rate, ratio and quantile has a known value.

    python -m e2e.support.vllm_exporter --port 9400   # serve one fake leader on 127.0.0.1
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# Acceptance of each draft position; they sum to the accepted tokens per draft (5.6).
PER_POSITION = (0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.3)
TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25)


@dataclass
class FakeLeader:
    model: str = "moonshotai/Kimi-K3"
    drafts_per_second: float = 10.0
    per_position: Sequence[float] = PER_POSITION
    running: float = 3.0
    waiting: float = 1.0
    kv_cache_usage: float = 0.42
    generation_tokens_per_second: float = 76.0
    prompt_tokens_per_second: float = 300.0
    preemptions_per_second: float = 0.05
    requests_per_second: float = 0.5
    # Fraction of observations at or below each bucket; p50 and p99 are known from these.
    ttft_cumulative: Sequence[float] = (0.1, 0.3, 0.6, 0.9, 0.995, 1.0)
    itl_cumulative: Sequence[float] = (0.2, 0.55, 0.9, 0.995, 1.0)
    started: float = field(default_factory=time.time)
    spec_decode: bool = True

    @property
    def k(self) -> int:
        return len(self.per_position)

    def expected(self) -> dict[str, float | list[float]]:
        accepted = sum(self.per_position)
        return {
            "acceptance_rate": accepted / self.k,
            "mean_acceptance_length": 1 + accepted,
            "per_position": list(self.per_position),
            "drafted_tokens_per_second": self.drafts_per_second * self.k,
            "accepted_tokens_per_second": self.drafts_per_second * accepted,
        }

    def collect(self, now: float | None = None) -> Iterator[Metric]:
        elapsed = max(0.0, (time.time() if now is None else now) - self.started)
        labels = ["model_name", "engine"]
        values = [self.model, "0"]

        def counter(name: str, doc: str, per_second: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, per_second * elapsed)
            return family

        if self.spec_decode:
            drafts = self.drafts_per_second
            yield counter("vllm:spec_decode_num_drafts", "Drafts", drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens", drafts * self.k)
            yield counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Accepted tokens",
                drafts * sum(self.per_position),
            )
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per position",
                labels=[*labels, "position"],
            )
            for i, p in enumerate(self.per_position):
                per_pos.add_metric([*values, str(i)], drafts * p * elapsed)
            yield per_pos
        for name, value in (
            ("vllm:num_requests_running", self.running),
            ("vllm:num_requests_waiting", self.waiting),
            ("vllm:kv_cache_usage_perc", self.kv_cache_usage),
        ):
            gauge = GaugeMetricFamily(name, name, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        yield counter("vllm:prompt_tokens", "Prompt tokens", self.prompt_tokens_per_second)
        yield counter(
            "vllm:generation_tokens", "Generated tokens", self.generation_tokens_per_second
        )
        yield counter("vllm:num_preemptions", "Preemptions", self.preemptions_per_second)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests", labels=[*labels, "finished_reason"]
        )
        success.add_metric([*values, "stop"], self.requests_per_second * elapsed)
        yield success
        for name, buckets, cumulative, per_second in (
            (
                "vllm:time_to_first_token_seconds",
                TTFT_BUCKETS,
                self.ttft_cumulative,
                self.requests_per_second,
            ),
            (
                "vllm:inter_token_latency_seconds",
                ITL_BUCKETS,
                self.itl_cumulative,
                self.generation_tokens_per_second,
            ),
        ):
            count = per_second * elapsed
            histogram = HistogramMetricFamily(name, name, labels=labels)
            points = [(str(b), c * count) for b, c in zip(buckets, cumulative, strict=True)]
            points.append(("+Inf", count))
            histogram.add_metric(values, points, sum_value=count * buckets[1])
            yield histogram

    def exposition(self, now: float | None = None) -> str:
        leader = self

        class _Collector:
            def collect(self) -> Iterator[Metric]:
                return leader.collect(now)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector())  # type: ignore[arg-type]
        return generate_latest(registry).decode()


def serve_text(
    text_for: Callable[[str], str | None], port: int = 0, host: str = "127.0.0.1"
) -> ThreadingHTTPServer:
    """Serves, in a background thread, the exposition ``text_for`` gives for a request's
    path (404 for None); .shutdown() stops it, .server_address[1] is its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = text_for(self.path)
            if text is None:
                self.send_error(404)
                return
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve(leader: FakeLeader, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serves the leader's /metrics (at every path) in a background thread."""
    return serve_text(lambda _path: leader.exposition(), port, host)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9400)
    args = parser.parse_args()
    server = serve(FakeLeader(), args.port)
    try:
        threading.Event().wait()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
