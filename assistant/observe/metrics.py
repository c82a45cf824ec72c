"""Prometheus metrics of a running assistant (``--metrics-port``), through prometheus-client.

Every latency comes from the turn record (:func:`assistant.observe.latency.build_record`): the
histograms observe ``record.metrics`` in seconds, so a scrape and the ``--log`` JSON lines
never disagree. Counters follow the pipeline's events and the decoder's start-up events
(:class:`~engines.progress.EngineProgress`); gauges are read when Prometheus scrapes.
Names follow Prometheus' conventions: base units (seconds, bytes), ``_total`` on counters.
``docs/monitoring.md`` lists them with the dashboard and the alert rules built on them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import time
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from assistant.config.sections import MetricsOptions
from assistant.events import AudioDeviceLost, BargeIn, Event, SpeculationDiscarded, TurnDone
from assistant.observe.duplex_metrics import DuplexMetrics
from assistant.observe.gpu import GpuMonitor, GpuUnreadable
from assistant.observe.latency import STAGES, TurnRecord
from assistant.observe.metrics_http import BoundedMetricsServer, start_metrics_server
from engines.base import Decoder
from engines.progress import CACHES, REBUILD_REASONS, Cache, EngineProgress, Stage

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "::1", "localhost")

# Bucket bounds in seconds. Whole turns (voice-to-voice, endpointing, first sentence) are judged
# against ~200 ms (the gap people leave between turns), 300 ms (the GPU goal), 500-800 ms (local
# peers) and 900 ms / 1.3 s (the CPU median and P95 targets): 100 ms steps up to 1 s keep
# histogram_quantile's linear interpolation within 50 ms there, and the tail reaches 10 s (a
# stalled turn is still counted in a bucket, not only in +Inf).
TURN_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0)
# The stages inside a turn are 5-100 ms on a GPU (TTFT, Smart Turn, TTS first audio) and up to a
# second or two on 2 CPU cores (ASR, TTFT after a long prompt): finer at the low end.
STAGE_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
)
# Decode rates: ~20-60 tok/s on 2 CPU cores, 100-500 on a GPU (batch 1), more with TensorRT.
RATE_BUCKETS = (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000)

HISTOGRAMS = {
    # turn-record metric: (Prometheus name, help, buckets); one per stage in latency.STAGES
    "endpointing_ms": ("assistant_endpointing_seconds", "Last speech sample to the endpoint", TURN_BUCKETS),
    "turn_detection_ms": (
        "assistant_turn_detection_seconds",
        "Smart Turn inference that ended the turn",
        STAGE_BUCKETS,
    ),
    "asr_ms": (
        "assistant_asr_seconds",
        "Endpoint (or the end of a wait for the turn before) to transcript (0 when done inside the wait)",
        STAGE_BUCKETS,
    ),
    "ttft_ms": ("assistant_ttft_seconds", "Prompt submitted to the first generated token", STAGE_BUCKETS),
    "first_sentence_ms": (
        "assistant_first_sentence_seconds",
        "Prompt submitted to the first spoken chunk of the reply",
        TURN_BUCKETS,
    ),
    "tts_first_audio_ms": (
        "assistant_tts_first_audio_seconds",
        "First chunk (or the endpoint, if later) to the first reply audio at the output",
        STAGE_BUCKETS,
    ),
    "voice_to_voice_ms": (
        "assistant_voice_to_voice_seconds",
        "Last speech sample to the first reply audio: what the user waits",
        TURN_BUCKETS,
    ),
}
assert tuple(HISTOGRAMS) == STAGES  # a stage added to the record gets its histogram here


class MetricsPortError(OSError):
    """The metrics port cannot be opened (in use, or not allowed)."""


def _label(text: str) -> str:
    """A free-text reason as a label value: ``no words recognised`` -> ``no_words_recognised``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


class Metrics:
    """The assistant's metrics in their own registry; an event sink and an engine-event sink.

    Call it with pipeline events (``fan_out(..., metrics)``), hand :meth:`engine_event` to the
    load as its engine progress, then :meth:`attach` the built session for the gauges and the
    info metric. Thread-safe: prometheus-client's metrics lock themselves.
    """

    def __init__(self, gpu: GpuMonitor | None = None) -> None:
        disable_created_metrics()  # no *_created series: Prometheus 2 would store each as a gauge
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU seconds, ...
        r = self.registry
        self.stages = {
            key: Histogram(name, text, buckets=buckets, registry=r)
            for key, (name, text, buckets) in HISTOGRAMS.items()
        }
        self.decode_rate = Histogram(
            "assistant_decode_tokens_per_second",
            "Decode rate of a reply (tokens after the first per second)",
            buckets=RATE_BUCKETS,
            registry=r,
        )
        self.turns = Counter(
            "assistant_turns", "Turns finished (answered or cancelled)", ["kind"], registry=r
        )
        self.cancelled = Counter(
            "assistant_turns_cancelled",
            "Turns that ended without a whole reply, by reason",
            ["reason"],
            registry=r,
        )
        self.barge_ins = Counter("assistant_barge_ins", "Replies interrupted by user speech", registry=r)
        self.asr_windows = Counter(
            "assistant_asr_transcripts",
            "Spoken turns' transcripts by Whisper window (fit, full) and whether the fitted one fell back",
            ["window", "fell_back"],
            registry=r,
        )
        self.discarded = Counter(
            "assistant_speculations_discarded",
            "Speculative ASR/LLM work thrown away because the user went on speaking",
            ["reason"],
            registry=r,
        )
        self.device_losses = Counter(
            "assistant_audio_device_losses", "Sound devices lost while running", ["kind"], registry=r
        )
        self.builds = Counter("assistant_engine_builds", "TensorRT engines built", registry=r)
        self.rebuilds = Counter(
            "assistant_engine_rebuilds",
            "Cached TensorRT engines built again, by reason",
            ["reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "assistant_backend_fallbacks",
            "Starts where --backend auto could not use the TensorRT it picked, by the backend used",
            ["used"],
            registry=r,
        )
        self.lookups = Counter(
            "assistant_cache_lookups",
            "Start-up cache lookups, by cache and result",
            ["cache", "result"],
            registry=r,
        )
        # Zeros are shown for the label values known in advance: a counter series that first
        # appears at 1 is invisible to rate() and increase() (they need two samples), so without
        # its zero the first turn of a kind, or the first device loss of a run, would not count.
        for cache in CACHES:
            for result in ("hit", "miss"):
                self.lookups.labels(cache, result)
        for kind in ("spoken", "typed"):
            self.turns.labels(kind)
        for kind in ("input", "output"):
            self.device_losses.labels(kind)
        for reason in REBUILD_REASONS:
            self.rebuilds.labels(reason)
        self.info = Info(
            "assistant_backend", "What decodes: backend, precision, models, TensorRT, GPU", registry=r
        )
        self.started = time.monotonic()
        Gauge("assistant_uptime_seconds", "Seconds since the metrics started", registry=r).set_function(
            lambda: time.monotonic() - self.started
        )
        self.gauges = _ScrapeTimeGauges(gpu if gpu is not None else GpuMonitor())
        r.register(self.gauges)
        self.duplex = DuplexMetrics(r)  # echo cancellation, speech over replies

    def __call__(self, event: Event) -> None:
        """Count one pipeline event; a finished turn's record feeds the histograms."""
        self.duplex(event)
        if isinstance(event, TurnDone) and isinstance(event.record, TurnRecord):
            self.observe(event.record)
        elif isinstance(event, BargeIn):
            self.barge_ins.inc()
        elif isinstance(event, SpeculationDiscarded):
            self.discarded.labels(_label(event.reason)).inc()
        elif isinstance(event, AudioDeviceLost):
            self.device_losses.labels(_label(event.kind)).inc()

    def observe(self, record: TurnRecord) -> None:
        """One turn: its stages (ms in the record, seconds here) and the counters."""
        self.turns.labels("spoken" if "speech_end" in record.timestamps_ns else "typed").inc()
        if record.cancelled:
            self.cancelled.labels(_label(record.cancelled)).inc()
        if record.asr_window:
            self.asr_windows.labels(record.asr_window, str(record.asr_fell_back).lower()).inc()
        for key, histogram in self.stages.items():
            value = record.metrics.get(key)
            if value is not None:
                histogram.observe(value / 1000.0)
        rate = record.metrics.get("tokens_per_s")
        if rate is not None:
            self.decode_rate.observe(rate)
        self.duplex.observe(record)

    def engine_event(self, event: EngineProgress) -> None:
        """Count cache hits and misses, engine builds and rebuilds from the decoder's start-up."""
        if event.stage in (Stage.CACHED, Stage.MISS, Stage.EXPORT) and event.cache:
            self.lookups.labels(event.cache, "hit" if event.stage == Stage.CACHED else "miss").inc()
        elif event.stage == Stage.DONE and event.cache == Cache.ENGINE:
            self.builds.inc()
        elif event.stage == Stage.REBUILD:
            self.rebuilds.labels(event.reason or "unknown").inc()

    def attach(self, decoder: Decoder, model: str, asr_model: str) -> None:
        """The built session's decoder and models: the info metric, the KV cache gauges and a fallback."""
        self.gauges.decoder = decoder
        identity = decoder.identity
        self.info.info(
            {
                "backend": identity.label,
                "precision": identity.precision,
                "model": model,
                "asr_model": asr_model,
                "tensorrt_version": identity.version,
                "gpu": self.gauges.gpu.name,
            }
        )
        if decoder.fallback:
            self.fallbacks.labels(identity.label).inc()

    def serve(self, options: MetricsOptions) -> BoundedMetricsServer:
        """Serve ``/metrics`` on ``options.host:options.port`` from a small fixed pool of threads.

        Raises:
            MetricsPortError: The port is taken (or not allowed), named with the flag to change.
        """
        if options.host not in LOOPBACK:
            logger.warning(
                "metrics on %s:%d are reachable from the network (--metrics-host): whoever reaches "
                "this machine can read them (timings, model and GPU names; never what was said)",
                options.host,
                options.port,
            )
        try:
            server = start_metrics_server(options.host, options.port, self.registry)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise MetricsPortError(
                    f"metrics port {options.port} on {options.host} is in use by another program; "
                    "choose another with --metrics-port PORT (or [metrics] port in the config)",
                ) from e
            raise MetricsPortError(
                f"cannot serve metrics on {options.host}:{options.port} ({e.strerror}); "
                "check --metrics-host and --metrics-port",
            ) from e  # fmt: skip
        logger.info("metrics on http://%s:%d/metrics", options.host, server.server_port)
        return server


class _ScrapeTimeGauges(Collector):
    """GPU utilisation and memory (NVML, when present) and the KV cache fill, read per scrape."""

    def __init__(self, gpu: GpuMonitor) -> None:
        self.gpu = gpu
        self.decoder: Decoder | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The current values; a GPU that cannot be read leaves its gauges out of this scrape."""
        if self.decoder is not None:
            yield GaugeMetricFamily(
                "assistant_kv_cache_tokens",
                "Tokens held in the decoder's KV cache (the conversation so far)",
                value=len(self.decoder.cached_ids),
            )
            yield GaugeMetricFamily(
                "assistant_kv_cache_capacity_tokens",
                "KV cache capacity in tokens (--context-tokens)",
                value=self.decoder.capacity_tokens,
            )
        try:
            sample = self.gpu.sample()
        except GpuUnreadable as e:
            logger.debug("GPU unreadable at scrape: %s", e)
            return
        if sample is None:
            return
        for name, text, value in (
            (
                "assistant_gpu_utilization_ratio",
                "GPU 0 busy share over NVML's last period",
                sample.utilization,
            ),
            (
                "assistant_gpu_memory_used_bytes",
                "GPU 0 memory in use (all processes)",
                sample.memory_used_bytes,
            ),
            ("assistant_gpu_memory_total_bytes", "GPU 0 memory", sample.memory_total_bytes),
        ):
            family = GaugeMetricFamily(name, text, labels=["gpu"])
            family.add_metric([sample.name], value)
            yield family


@contextlib.contextmanager
def serving(options: MetricsOptions) -> Iterator[Metrics | None]:
    """The metrics, served while the block runs, when ``options.port`` is set; else ``None``.

    Raises:
        MetricsPortError: The port is taken (before any model loads: callers enter this first).
    """
    if not options.port:
        yield None
        return
    metrics = Metrics()
    server = metrics.serve(options)
    try:
        yield metrics
    finally:
        server.shutdown()
        server.server_close()
