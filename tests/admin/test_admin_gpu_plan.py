"""Admin: a domain's GPU plan is shown, re-checked on save, and refused with the planner's words."""

from __future__ import annotations

import json

import pytest
from django.contrib.messages import get_messages

from fleets.models import Domain, Slot
from fleets.services.gpu_plan import domain_gpus_adopt, gpus_from_report

pytestmark = pytest.mark.django_db


def _change_url(obj) -> str:
    return f"/admin/fleets/domain/{obj.pk}/change/"


def test_domain_page_shows_the_plan(superuser_client, seeded_fleet):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    html = superuser_client.get(_change_url(east)).content.decode()
    assert "qwen-small: GPUs [0], 6964 MiB awake (--gpu-memory-utilization 0.085)" in html
    assert "trainer on GPU 0: budget 40960 MiB" in html


def test_shrinking_the_gpu_is_refused_with_the_numbers(superuser_client, admin_form, seeded_fleet):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    data = admin_form(superuser_client.get(_change_url(east)).content.decode(), "domain_form")
    layout = json.loads(data["gpu_layout"])
    layout["gpus"][0]["memoryMiB"] = 40960  # a 40 GiB card: the trainer's 40 GiB no longer fits
    data["gpu_layout"] = json.dumps(layout)

    response = superuser_client.post(_change_url(east), data, follow=True)

    errors = [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "error"]
    assert errors == [
        "GPU plan of east: slot gpu0/training (trainer): refused on GPU 0: insufficient_memory "
        "(budget 40960 MiB > 38400 MiB: 40960 MiB total - 1536 MiB sleeping residue - "
        "1024 MiB margin)"
    ]
    # What the plan granted before is kept: a refused plan stores nothing.
    trainer = Slot.objects.get(domain=east, kind="training")
    assert trainer.allocation["budgetMiB"] == 40960


def test_a_malformed_gpu_description_is_a_field_error(superuser_client, admin_form, seeded_fleet):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    data = admin_form(superuser_client.get(_change_url(east)).content.decode(), "domain_form")
    data["gpu_layout"] = json.dumps({"gpus": [{"type": "H100"}]})
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    assert "gpus[0].memoryMiB: is required" in response.content.decode()


def test_gpus_can_be_described_from_the_supervisors_report(superuser_client, seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    report = {
        "gpus": [
            {"index": 0, "usedMiB": 1536, "totalMiB": 81559, "name": "NVIDIA H100 80GB HBM3"},
            {"index": 1, "usedMiB": 0, "totalMiB": 81559, "name": "NVIDIA H100 80GB HBM3"},
        ]
    }
    Domain.objects.filter(pk=west.pk).update(gpu_layout={}, last_report=report)

    response = superuser_client.post(
        "/admin/fleets/domain/",
        {"action": "adopt_reported_gpus", "_selected_action": [str(west.pk)]},
        follow=True,
    )

    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert shown == ["west: GPUs described and planned"], shown
    west.refresh_from_db()
    assert west.gpu_layout["gpus"] == [
        {"index": 0, "type": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559},
        {"index": 1, "type": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559},
    ]
    trainer = Slot.objects.get(domain=west, kind="training")
    assert trainer.allocation["budgetMiB"] == 40960


def test_a_report_without_gpus_cannot_describe_them(superuser_client, seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    assert domain_gpus_adopt(domain=west) == [
        "west: the last supervisor report names no GPU with its memory"
    ]


def test_mig_instances_in_a_report_become_named_targets():
    report = {
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA A100-SXM4-80GB",
                "usedMiB": None,
                "totalMiB": None,
                "mig": {
                    "enabled": True,
                    "instances": [
                        {"gpuInstanceId": 1, "usedMiB": 0, "totalMiB": 40192},
                        {"gpuInstanceId": 2, "usedMiB": 0, "totalMiB": 19968},
                    ],
                },
            }
        ]
    }
    assert gpus_from_report(report) == [
        {
            "index": 0,
            "type": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 60160,
            "mig": [{"name": "gi1", "memoryMiB": 40192}, {"name": "gi2", "memoryMiB": 19968}],
        }
    ]
