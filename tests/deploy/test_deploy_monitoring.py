"""The Grafana dashboard and the alert rules ask only for metrics Haru exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import haru.asgi  # noqa: F401 - registers what a deployed server exports
from fleets.metrics.failover_guard import FailoverGuardCollector
from fleets.metrics.placement import GpuPlanCollector
from fleets.metrics.readiness import ReadinessCollector
from tests.deploy.real_tools import require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "haru-alerts.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
NAME = re.compile(r"\bharu_[a-z_]+\b")
# `haru_x{a="1", b=~"2|3"}`: the series and the labels a selector matches on.
SELECTOR = re.compile(r"\b(haru_[a-z_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
# What Prometheus derives from an exported family: counters gain _total, histograms their series.
SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _panels() -> list[dict]:
    return json.loads((ROOT / "deploy" / "grafana" / "haru-dashboard.json").read_text())["panels"]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p.get("targets", [])]


def _exported(client) -> set[str]:
    """Every sample name /metrics exposes (TYPE lines name the families, samples the series)."""
    return set(_exported_labels(client))


def _exported_labels(client) -> dict[str, set[str]]:
    """Each sample name /metrics exposes, with the label names its samples carry (none yet for
    a family declared without samples)."""
    text = client.get("/metrics").content.decode()
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family, kind = line.split()[2:4]
            labels.setdefault(family, set())
            if kind == "counter":
                labels.setdefault(f"{family}_total", set())
            if kind == "histogram":
                for suffix in SUFFIXES:
                    labels.setdefault(f"{family}{suffix}", set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            name = name.split(" ", 1)[0]
            keys = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest.rpartition("}")[0])
            labels.setdefault(name, set()).update(keys)
    return labels


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
        "HaruFailoverDamped",
        "HaruActiveHeldByDataPath",
    } <= names


def test_every_dashboard_panel_asks_for_a_series_haru_exports():
    for panel in _panels():
        exprs = [t["expr"] for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            assert NAME.search(expr), f"panel {panel['title']!r}: {expr!r} names no Haru series"


@pytest.mark.django_db
def test_selectors_and_groupings_name_labels_the_series_carry(client, seeded_fleet):
    """`haru_x{verdict="ready"}` or `by (fleet, gpu)` with a label the series lacks is empty."""
    labels = _exported_labels(client)
    wrong = []
    for expr in _alert_exprs() + _dashboard_exprs():
        named = [n for n in NAME.findall(expr) if labels.get(n)]
        carried = set().union(*(labels[n] for n in named)) | {"le", "quantile"}
        for name, matchers in SELECTOR.findall(expr):
            keys = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*[=!]~?", matchers))
            if labels.get(name) and not keys <= labels[name]:
                wrong.append(f"{expr}: {name} has no {sorted(keys - labels[name])}")
        for grouping in GROUPING.findall(expr):
            keys = {k.strip() for k in grouping.split(",") if k.strip()}
            if named and not keys <= carried:
                wrong.append(f"{expr}: no series carries {sorted(keys - carried)}")
    assert wrong == []


def test_the_dashboard_shows_readiness_drills_recovery_and_gpu_memory():
    """Every family of the readiness, GPU-plan and failover-guard collectors is on a panel."""
    collectors = (ReadinessCollector(), GpuPlanCollector(), FailoverGuardCollector())
    families = {m.name for c in collectors for m in c.describe()}
    assert {"haru_failover_readiness", "haru_recovery_seconds", "haru_gpu_memory_used_mib"} <= (
        families
    )
    shown = {name for expr in _dashboard_exprs() for name in NAME.findall(expr)}
    assert families - shown == set()


def test_promtool_checks_the_alert_rules():
    promtool = require("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _expected(alert: str, **labels: str) -> dict:
    """What promtool must see fire: the rule's labels and its annotations, rendered."""
    rules = yaml.safe_load(RULES.read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    annotations = {
        key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        for key, text in rule["annotations"].items()
    }
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def test_promtool_fires_the_damping_and_data_path_alerts_on_their_series(tmp_path):
    # Series as the failover guards export them (fleets/metrics/failover_guard.py): a fleet
    # damped for three minutes, and an active held by its data path for two.
    promtool = require("promtool")
    damped = _expected("HaruFailoverDamped", fleet="prod")
    held = _expected("HaruActiveHeldByDataPath", fleet="prod", domain="east")
    assert "supervisor unreachable, data path serving" in held["exp_annotations"]["summary"]
    cases = [
        ("HaruFailoverDamped", "1m", [damped]),
        ("HaruFailoverDamped", "4m", []),
        ("HaruActiveHeldByDataPath", "30s", []),  # for: 1m
        ("HaruActiveHeldByDataPath", "1m45s", [held]),
        ("HaruActiveHeldByDataPath", "4m", []),
    ]
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": 'haru_fleet_failover_damped{fleet="prod"}', "values": "0 1x12 0x8"},
                    {
                        "series": 'haru_fleet_active_held_by_data_path{fleet="prod",domain="east"}',
                        "values": "0 1x8 0x8",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": name, "exp_alerts": alerts}
                    for name, at, alerts in cases
                ],
            }
        ],
    }
    path = tmp_path / "guards.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_checks_the_scrape_config_with_a_target_per_worker_host():
    promtool = require("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(SCRAPE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {job["job_name"]: job for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    assert set(jobs) == {"haru", "haru-worker-hosts"}
    # The port `manage.py metrics_host` serves on, as haru-metrics.service starts it.
    unit = (ROOT / "deploy" / "systemd" / "haru-metrics.service").read_text()
    port = re.search(r"metrics_host .*--port (\d+)", unit).group(1)
    targets = [t for c in jobs["haru-worker-hosts"]["static_configs"] for t in c["targets"]]
    assert targets and all(t.endswith(f":{port}") for t in targets)


def test_the_supervisor_errors_alert_sums_a_server_host_and_a_worker_host(tmp_path):
    # Each host alone fails 0.3 calls a second (under the 0.5 threshold); the two targets'
    # series together fire it, as one deployment of many machines must.
    promtool = require("promtool")
    alert = _expected("HaruSupervisorCallsFailing", call="status")
    series = (
        'haru_supervisor_call_errors_total{{call="status",kind="timeout",job="{job}",'
        'instance="{host}"}}'
    )
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": series.format(job="haru", host="cp"), "values": "0+4.5x60"},
                    {
                        "series": series.format(job="haru-worker-hosts", host="worker-1:9708"),
                        "values": "0+4.5x60",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "12m",
                        "alertname": "HaruSupervisorCallsFailing",
                        "exp_alerts": [alert],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "hosts.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_fires_the_state_set_alerts_on_the_members_that_hold(tmp_path):
    # Series as /metrics exports them since issue 27 (fleets/metrics/reconcile.py, readiness.py):
    # a state set carries only the member that holds (1); the others are absent, not 0.
    # West is degraded for six minutes, then ready; the readiness verdict turns not_ready at 2m
    # (promtool: `_xN` is N missing samples, `1xN` is N+1 samples).
    promtool = require("promtool")
    no_standby = _expected("HaruNoViableStandby", fleet="prod")
    not_ready = _expected("HaruFailoverNotReady", fleet="prod", verdict="not_ready")
    started = _expected("HaruFailoverStarted", fleet="prod")
    cases = [
        ("HaruNoViableStandby", "4m", []),  # for: 5m
        ("HaruNoViableStandby", "5m30s", [no_standby]),
        ("HaruNoViableStandby", "8m", []),  # west ready since 6m
        ("HaruFailoverNotReady", "6m45s", []),  # for: 5m
        ("HaruFailoverNotReady", "7m15s", [not_ready]),
        ("HaruFailoverStarted", "1m", [started]),
        ("HaruFailoverStarted", "8m", []),  # the pending pair went stale (absent, not 0)
    ]
    role = 'haru_domain_role{fleet="prod",domain="%s",role="%s"}'
    state = 'haru_domain_state{fleet="prod",domain="%s",state="%s"}'
    verdict = 'haru_failover_readiness{fleet="prod",verdict="%s"}'
    series = [
        (role % ("east", "active"), "1x40"),
        (role % ("west", "standby"), "1x40"),
        (state % ("east", "ready"), "1x40"),
        (state % ("west", "degraded"), "1x24 stale"),
        (state % ("west", "ready"), "_x24 1x16"),
        (verdict % "ready", "1x8 stale"),
        (verdict % "not_ready", "_x8 1x32"),
        ('haru_operations_total{fleet="prod",kind="promote",outcome="pending"}', "1x8 stale"),
    ]
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": name, "exp_alerts": alerts}
                    for name, at, alerts in cases
                ],
            }
        ],
    }
    path = tmp_path / "state-sets.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
