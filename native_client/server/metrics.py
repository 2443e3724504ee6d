"""``GET /metrics``: the server's counters in Prometheus' text format, read from the service when
scraped (prometheus-client writes the format; nothing is counted twice)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class _ServiceCollector:
    """prometheus-client's collector protocol over one service's state."""

    def __init__(self, service, ready: bool):
        self.service = service
        self.ready = ready

    def collect(self):
        """The metric families, as the service stands now."""
        service, stats = self.service, self.service.engine.stats
        yield GaugeMetricFamily(
            "deepspeech_serve_ready",
            "1 while the server takes new streams (GET /ready)",
            value=int(self.ready),
        )
        yield GaugeMetricFamily(
            "deepspeech_serve_streams",
            "Open WebSocket streams and POST /stt requests",
            value=service.open_streams,
        )
        yield GaugeMetricFamily(
            "deepspeech_serve_queue_depth", "Jobs waiting for a model call", value=service.engine.queued
        )
        yield GaugeMetricFamily(
            "deepspeech_serve_largest_batch",
            "The most streams stepped in one model call",
            value=stats.largest_batch,
        )
        yield CounterMetricFamily("deepspeech_serve_model_calls", "Model calls", value=stats.calls)
        yield CounterMetricFamily(
            "deepspeech_serve_chunks", "Stream chunks run by the model", value=stats.chunks
        )
        yield CounterMetricFamily(
            "deepspeech_serve_decodes", "Results decoded (beam search)", value=stats.decodes
        )
        yield CounterMetricFamily(
            "deepspeech_serve_decode_seconds",
            "Time spent waiting for decoded results",
            value=stats.decode_seconds,
        )


def exposition(service, ready: bool) -> tuple[bytes, str]:
    """(the text exposition of ``service``'s metrics, its content type)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServiceCollector(service, ready))
    return generate_latest(registry), CONTENT_TYPE_LATEST
