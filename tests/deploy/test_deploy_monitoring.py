"""The Grafana dashboard and the alert rules ask only for metrics Haru exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import haru.asgi  # noqa: F401 - registers what a deployed server exports

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bharu_[a-z_]+\b")
# What Prometheus derives from an exported family: counters gain _total, histograms their series.
SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "haru-alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "haru-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _exported(client) -> set[str]:
    """Every sample name /metrics exposes (TYPE lines name the families, samples the series)."""
    text = client.get("/metrics").content.decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family, kind = line.split()[2:4]
            names.add(family)
            if kind == "counter":
                names.add(f"{family}_total")
            if kind == "histogram":
                names.update(f"{family}{s}" for s in SUFFIXES)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.django_db
def test_every_query_names_a_metric_haru_exports(client, seeded_fleet):
    exported = _exported(client)
    asked = {
        (name, source)
        for source, exprs in (("alerts", _alert_exprs()), ("dashboard", _dashboard_exprs()))
        for expr in exprs
        for name in NAME.findall(expr)
    }
    assert asked, "no queries found"
    missing = sorted(f"{source}: {name}" for name, source in asked if name not in exported)
    assert missing == []


def test_the_alerts_cover_what_the_person_on_call_needs():
    names = {
        r["alert"]
        for g in yaml.safe_load((ROOT / "deploy" / "prometheus" / "haru-alerts.yml").read_text())[
            "groups"
        ]
        for r in g["rules"]
    }
    assert {
        "HaruFailoverStarted",
        "HaruNoViableStandby",
        "HaruStateStoreDown",
        "HaruRequestsHeldOrRefused",
    } <= names
