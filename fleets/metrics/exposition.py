"""The text exposition of one `/metrics` answer, written faster than prometheus_client's.

At 1,000 fleets a scrape holds tens of thousands of gauge samples read from the database, and
`prometheus_client.generate_latest` spends most of its time on each sample's labels: it sorts
them, validates every label name and escapes every value, sample after sample. The families
here repeat the same label names and the same values (the fleet and domain slugs) thousands of
times, so `render` validates each label-name set once and escapes each value once per answer.
The bytes are the same as `generate_latest`'s (tests/reconciler/test_metrics_exposition.py
compares them); a family this fast path does not handle (histograms, a sample with a timestamp
or an OpenMetrics-only sample, a name outside the legacy character set) is written by
prometheus_client itself. `bench/scale_reads.py` times the whole answer (`metrics_ms`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

# The Prometheus data model's classic names (its documentation, "Metric names and labels"),
# which the text format writes unquoted; a name outside them goes to prometheus_client.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# The types written here: what Haru's database collectors build (GaugeMetricFamily and
# CounterMetricFamily without `created`).
_FAST_TYPES = {"gauge": "", "counter": "_total"}


class _One:
    """A registry of one family, for prometheus_client's own writer (`collect()` is all it uses)."""

    __slots__ = ("_metric",)

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self._metric


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Writer:
    """Caches shared by every family of one answer."""

    __slots__ = ("_names_ok", "_values")

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._names_ok: dict[tuple[str, ...], bool] = {}

    def _labels_valid(self, names: tuple[str, ...]) -> bool:
        ok = self._names_ok.get(names)
        if ok is None:
            # Names starting with "__" are reserved for Prometheus' own use.
            ok = all(_LABEL_NAME.fullmatch(n) and not n.startswith("__") for n in names)
            self._names_ok[names] = ok
        return ok

    def family(self, metric: Metric) -> str | None:
        """The family's text, or None when prometheus_client must write it."""
        suffix = _FAST_TYPES.get(metric.type)
        if suffix is None:
            return None
        name = metric.name + suffix
        if not _METRIC_NAME.fullmatch(name):
            return None
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out = [f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n"]
        values = self._values
        for sample in metric.samples:
            if sample.name != name or sample.timestamp is not None:
                return None  # e.g. a counter's _created: prometheus_client orders those
            labels = sample.labels
            if labels:
                keys = tuple(sorted(labels))
                if not self._labels_valid(keys):
                    return None
                parts = []
                for key in keys:
                    raw = labels[key]
                    text = values.get(raw)
                    if text is None:
                        text = values[raw] = _escape(raw)
                    parts.append(f'{key}="{text}"')
                out.append(f"{name}{{{','.join(parts)}}} {floatToGoString(sample.value)}\n")
            else:
                out.append(f"{name} {floatToGoString(sample.value)}\n")
        return "".join(out)


def render(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of `families`, byte for byte `generate_latest`'s."""
    writer = _Writer()
    chunks: list[str] = []
    for metric in families:
        text = writer.family(metric)
        if text is None:
            chunks.append(generate_latest(_One(metric)).decode("utf-8"))
        else:
            chunks.append(text)
    return "".join(chunks).encode("utf-8")
