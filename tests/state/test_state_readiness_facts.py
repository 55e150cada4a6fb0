"""The readiness verdict's facts read a standby's reported GPUs with the shared JSON kinds."""

from __future__ import annotations

import pytest

from fleets.core.policy import Policy
from fleets.models import Domain
from fleets.reads.readiness import standby_facts

pytestmark = pytest.mark.django_db


def _gpus(seeded_fleet, gpus: list) -> list[tuple[int, float, float]]:
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    # Held in memory only: a stored report could not hold NaN (PostgreSQL's JSON refuses it).
    west.last_report = {"gpus": gpus}
    facts = standby_facts(west, Policy())
    return [(g.index, g.used_mib, g.total_mib) for g in facts.gpus]


def test_a_reported_gpu_is_read_with_its_memory(seeded_fleet):
    assert _gpus(seeded_fleet, [{"index": 1, "usedMiB": 500, "totalMiB": 81_920.5}]) == [
        (1, 500.0, 81_920.5)
    ]


def test_true_is_not_gpu_one(seeded_fleet):
    assert _gpus(seeded_fleet, [{"index": True, "usedMiB": 500, "totalMiB": 81_920}]) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "500", None])
def test_a_memory_figure_that_is_not_a_finite_number_drops_the_gpu(seeded_fleet, bad):
    gpus = [{"index": 0, "usedMiB": bad, "totalMiB": 81_920}, {"index": 1, "totalMiB": 1}]
    assert _gpus(seeded_fleet, gpus) == []


ORIGINAL_STATUS = {  # what the original supervisor reports: no features, no checkpoint times
    "slots": [
        {
            "gpuIndex": 0,
            "kind": "inference",
            "models": [{"name": "qwen", "port": 1, "sleeping": True}],
        },
        {"gpuIndex": 0, "kind": "training", "training": {"state": "running", "pids": [7]}},
    ],
    "ready": False,
}


@pytest.mark.parametrize(
    ("report", "golden", "checkpoints"),
    [
        (ORIGINAL_STATUS, False, False),
        ({**ORIGINAL_STATUS, "features": ["probe.models", "sleep.drain"]}, False, True),
        ({**ORIGINAL_STATUS, "features": ["probe.golden"]}, True, True),
        ({}, True, True),  # no status yet: nothing is said about the supervisor
    ],
)
def test_what_the_standbys_supervisor_can_prove_is_read_from_its_features(
    seeded_fleet, report, golden, checkpoints
):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    west.last_report = report
    facts = standby_facts(west, Policy())
    assert (facts.golden_probes, facts.checkpoint_times) == (golden, checkpoints)
