"""`manage.py supervisor_config`: the config comes from the plan; the supervisor accepts it."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fleets.layouts.loader import load_layout, parse_layout, read_layout_file
from fleets.models import Domain
from fleets.services.layouts import layout_apply
from fleets.services.supervisor_config import SupervisorConfigError, supervisor_config_render
from supervisor.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
THREE_DOMAIN = ROOT / "examples" / "fleet.three-domain.yaml"


def render(fleet: str, domain: str, *args: str) -> dict:
    out = StringIO()
    call_command("supervisor_config", fleet, domain, *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["east", "west"])
def test_shipped_supervisor_examples_are_what_the_command_renders(seeded_fleet, host):
    doc = render("demo", host, "--gpu-backend", "sim")
    assert doc == json.loads((ROOT / "examples" / f"supervisor-{host}.json").read_text())
    config = parse_config(doc, cwd=ROOT)  # the supervisor's own loader
    assert {m.name: m.profile.gpu_memory_utilization for m in config.models} == {
        "llama-small": 0.11,
        "qwen-small": 0.085,
    }
    assert config.training_slots[0].memory_limit_mib == 40960
    assert [(g.index, g.memory_mib) for g in config.plan.gpus] == [(0, 81920)]


@pytest.mark.django_db
def test_a_real_host_config_numbers_servers_without_ports_from_the_base_port(db):
    layout_apply(layout=load_layout(THREE_DOMAIN))
    with pytest.raises(CommandError, match="names no port; pass --base-port"):
        render("multi-region", "aws-use1")
    doc = render("multi-region", "aws-use1", "--base-port", "8000")
    assert doc["gpu"] == {"backend": "nvml"}
    config = parse_config(doc, cwd=ROOT)
    by_name = {m.name: m for m in config.models}
    assert (by_name["llama-3.1-8b-instruct"].gpu_index, by_name["qwen3-8b"].gpu_index) == (1, 0)
    assert by_name["qwen3-8b"].profile.gpu_memory_utilization == 0.987
    assert {m.port for m in config.models} == {8000, 8001}
    (trainer,) = config.training_slots
    assert (trainer.gpu_index, trainer.memory_limit_mib) == (1, 81559 - 3072 - 1024)


@pytest.mark.django_db
def test_a_tensor_parallel_server_gets_its_whole_gpu_group(db):
    data = copy.deepcopy(read_layout_file(THREE_DOMAIN))
    use1 = data["domains"][0]
    use1["gpus"] = [{"count": 4, "type": "H100", "memoryMiB": 81559}]
    use1["slots"].append(
        {
            "kind": "inference",
            "models": [
                {
                    "name": "llama-70b",
                    "servingUrl": "https://use1.gpu.example.internal:9000/70b",
                    "profile": {"engine": "vllm", "modelPath": "meta/70b", "tensorParallel": 2},
                }
            ],
        }
    )
    layout_apply(layout=parse_layout(data))
    config = parse_config(render("multi-region", "aws-use1", "--base-port", "8000"), cwd=ROOT)
    big = next(m for m in config.models if m.name == "llama-70b")
    assert big.profile.gpu_indices == (0, 1) and big.port == 9000


@pytest.mark.django_db
def test_mig_slots_are_refused_until_the_supervisor_addresses_instances(db):
    data = copy.deepcopy(read_layout_file(THREE_DOMAIN))
    spot = data["domains"][2]
    spot["gpus"] = [
        {"type": "A100", "memoryMiB": 81920, "mig": [{"name": "3g.40gb", "memoryMiB": 40192}]}
    ]
    layout_apply(layout=parse_layout(data))
    domain = Domain.objects.get(slug="aws-usw2-spot")
    with pytest.raises(SupervisorConfigError, match="MIG instance '3g.40gb'"):
        supervisor_config_render(domain=domain, base_port=8000)


@pytest.mark.django_db
def test_unknown_domain_is_a_clear_error(db):
    with pytest.raises(CommandError, match="no domain 'nope' in fleet 'demo'"):
        render("demo", "nope")
