"""Read samples out of a Prometheus text exposition (what GET /metrics returns)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for sample_name, sample_labels, value in samples(text)
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def by_label(text: str, name: str, label: str, **labels: str) -> dict[str, float]:
    """Samples called `name` (filtered by `labels`) summed per value of `label`."""
    result: dict[str, float] = {}
    for sample_name, sample_labels, value in samples(text):
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
            key = sample_labels.get(label, "")
            result[key] = result.get(key, 0.0) + value
    return result
