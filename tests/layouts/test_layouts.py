"""Layouts: validation names the path and the rule; apply is one transaction that never routes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from jsonschema import Draft202012Validator

from fleets.base.errors import LayoutError
from fleets.layouts.loader import SCHEMA_PATH, load_layout, parse_layout, read_layout_file
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Rollout, Slot
from fleets.services.layouts import layout_apply, layout_export
from fleets.services.operations import operation_request
from fleets.services.rollouts import rollout_create

ROOT = Path(__file__).resolve().parents[2]
TWO_DOMAIN = ROOT / "examples" / "fleet.two-domain.json"
THREE_DOMAIN = ROOT / "examples" / "fleet.three-domain.yaml"


def db_state() -> dict:
    """Return every row that a layout apply may touch, for before/after comparisons."""
    return {
        "fleets": sorted(Fleet.objects.values_list("slug", "display_name", "route_revision")),
        "pointers": sorted(
            (slug, str(active))
            for slug, active in Fleet.objects.values_list("slug", "active_domain")
        ),
        "policies": sorted(
            json.dumps(p, sort_keys=True) for p in Fleet.objects.values_list("policy", flat=True)
        ),
        "domains": sorted(
            Domain.objects.values_list("fleet__slug", "slug", "state", "supervisor_url")
        ),
        "slots": sorted(Slot.objects.values_list("domain__slug", "gpu_index", "kind", "state")),
        "models": sorted(ModelBinding.objects.values_list("domain__slug", "name", "serving_url")),
        "events": Event.objects.count(),
    }


def write(tmp_path: Path, data: dict, name: str = "layout.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# --- validation ----------------------------------------------------------------------------


def _two_inference_slots_on_gpu0(d):
    d["domains"][0]["slots"][0]["gpuIndex"] = 0
    d["domains"][0]["slots"].append(
        {"kind": "inference", "gpuIndex": 0, "models": [{"name": "extra", "memoryMiB": 1024}]}
    )


MISTAKES = {
    "bad fleet slug": (
        lambda d: d.update(slug="Demo_Fleet"),
        "slug: must be lowercase letters and digits separated by single hyphens "
        "(at most 63 characters)",
    ),
    "bad domain slug": (
        lambda d: d["domains"][1].update(slug="west-"),
        "domains[1].slug: must be lowercase letters and digits separated by single hyphens "
        "(at most 63 characters)",
    ),
    "upper-case model name": (
        lambda d: d["domains"][1]["slots"][0]["models"][1].update(name="Qwen-Small"),
        "domains[1].slots[0].models[1].name: must be lowercase "
        "(the routing key equals the served model name)",
    ),
    "duplicate model in a domain": (
        lambda d: d["domains"][1]["slots"][0]["models"].append({"name": "qwen-small"}),
        "domains[1].slots[0].models[2].name: duplicate model 'qwen-small' in domain 'west' "
        "(also domains[1].slots[0].models[1])",
    ),
    "two inference slots on one gpu": (
        _two_inference_slots_on_gpu0,
        "domains[0].slots[2].gpuIndex: duplicate inference slot on GPU 0 "
        "(also domains[0].slots[0])",
    ),
    "unknown field": (
        lambda d: d["domains"][0].update(supervisorURL="http://127.0.0.1:1"),
        "domains[0].supervisorURL: unknown field",
    ),
    "unknown top-level field": (
        lambda d: d.update(activeDomain="east"),
        "activeDomain: unknown field",
    ),
    "declared active not in the fleet": (
        lambda d: d.update(activeDomainSlug="south"),
        "activeDomainSlug: 'south' is not a domain of this fleet (domains: east, west)",
    ),
    "bad policy value": (
        lambda d: d["policy"].update(wakeTimeoutMs=0),
        "policy.wakeTimeoutMs: must be between 1 and 2147483647",
    ),
    "misspelled policy key": (
        lambda d: d["policy"].update(autoFailver=True),
        "policy.autoFailver: unknown field",
    ),
    "negative gpu index": (
        lambda d: d["domains"][0]["slots"][1].update(gpuIndex=-1),
        "domains[0].slots[1].gpuIndex: must be at least 0",
    ),
    "unknown slot kind": (
        lambda d: d["domains"][0]["slots"][0].update(kind="batch"),
        'domains[0].slots[0].kind: must be "inference" or "training"',
    ),
    "missing training command": (
        lambda d: d["domains"][0]["slots"][1].pop("command"),
        "domains[0].slots[1].command: is required",
    ),
    "sleep level 2": (
        lambda d: d["domains"][0]["slots"][0].update(sleepLevel=2),
        "domains[0].slots[0].sleepLevel: must be 1 (level-1 sleep is the only supported level)",
    ),
    "non-http url": (
        lambda d: d["domains"][1].update(supervisorUrl="ftp://127.0.0.1"),
        "domains[1].supervisorUrl: must be an http:// or https:// URL",
    ),
    "duplicate domain": (
        lambda d: d["domains"][1].update(slug="east"),
        "domains[1].slug: duplicate domain 'east' (also domains[0])",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=str)
def test_layout_mistake_is_refused_naming_the_path_and_rule(layout_data, mistake):
    mutate, expected = MISTAKES[mistake]
    mutate(layout_data)
    with pytest.raises(LayoutError) as caught:
        parse_layout(layout_data)
    assert expected in caught.value.errors


@pytest.mark.django_db
@pytest.mark.parametrize("mistake", MISTAKES, ids=str)
def test_seed_layout_with_a_mistake_writes_nothing(seeded_fleet, tmp_path, layout_data, mistake):
    mutate, expected = MISTAKES[mistake]
    changed = copy.deepcopy(layout_data)
    changed["displayName"] = "renamed"  # a valid change that must not land either
    mutate(changed)
    before = db_state()
    with pytest.raises(CommandError) as caught:
        call_command("seed_layout", "--config", str(write(tmp_path, changed)))
    assert expected in str(caught.value)
    assert "nothing written" in str(caught.value)
    assert db_state() == before


def test_every_error_is_reported_at_once(layout_data):
    layout_data["slug"] = "Bad"
    layout_data["domains"][0]["slots"][0]["models"][0]["name"] = "Llama"
    with pytest.raises(LayoutError) as caught:
        parse_layout(layout_data)
    assert len(caught.value.errors) == 2


@pytest.mark.parametrize("data", [None, [], "slug: demo", 3])
def test_a_document_that_is_not_an_object_is_refused(data):
    with pytest.raises(LayoutError) as caught:
        parse_layout(data)
    assert caught.value.errors == ["(root): must be of type object"]


def test_unreadable_and_malformed_files_name_the_file(tmp_path):
    with pytest.raises(LayoutError, match="cannot read layout file"):
        load_layout(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(LayoutError, match=r"broken\.json: not valid json"):
        load_layout(broken)


def test_model_without_serving_url_inherits_the_domains_base_url(layout_data):
    layout_data["domains"][0]["slots"][0]["models"][0].pop("servingUrl")
    layout = parse_layout(layout_data)
    assert layout.domains[0].slots[0].models[0].serving_url == "http://127.0.0.1:18001"
    layout_data["domains"][0].pop("servingBaseUrl")
    with pytest.raises(LayoutError) as caught:
        parse_layout(layout_data)
    assert caught.value.errors == [
        "domains[0].slots[0].models[0].servingUrl: required when the domain has no servingBaseUrl"
    ]


@pytest.mark.parametrize("path", [TWO_DOMAIN, THREE_DOMAIN], ids=lambda p: p.name)
def test_shipped_examples_validate_against_the_schema(path):
    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    Draft202012Validator(schema).validate(read_layout_file(path))
    load_layout(path)  # and the rules beyond the schema


# --- apply ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_new_fleet_starts_on_its_declared_active_at_revision_1(seeded_fleet):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    assert (seeded_fleet.active_domain_id, seeded_fleet.route_revision) == (east.id, 1)
    postures = dict(
        ((s.domain.slug, s.kind), s.state)
        for s in Slot.objects.filter(domain__fleet=seeded_fleet).select_related("domain")
    )
    assert postures == {
        ("east", "inference"): "serving",
        ("east", "training"): "idle",
        ("west", "inference"): "sleeping",
        ("west", "training"): "idle",
    }
    assert set(Domain.objects.values_list("state", flat=True)) == {"ready"}  # static hosts
    assert Event.objects.filter(kind="layout.applied").count() == 1


@pytest.mark.django_db
def test_three_domain_yaml_example_loads(db):
    report = layout_apply(layout=load_layout(THREE_DOMAIN))
    fleet = Fleet.objects.get(slug="multi-region")
    assert fleet.active_domain.slug == "aws-use1"
    assert fleet.policy["probe"] == {"prompt": "Reply with one word.", "maxTokens": 8}
    domains = list(Domain.objects.filter(fleet=fleet).order_by("priority"))
    assert [(d.slug, d.provider, d.state) for d in domains] == [
        ("aws-use1", "skypilot", "provisioning"),
        ("gcp-usc1", "skypilot", "provisioning"),
        ("aws-usw2-spot", "skyserve", "provisioning"),
    ]
    spot_urls = set(
        ModelBinding.objects.filter(domain__slug="aws-usw2-spot").values_list(
            "serving_url", flat=True
        )
    )
    assert spot_urls == {"https://usw2.gpu.example.internal"}
    assert len(report.created) == 17 and not report.updated


def _changed_example(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["policy"]["wakeTimeoutMs"] = 45000
    data["domains"][0]["slots"][0]["models"].append(
        {"name": "mistral-small", "servingUrl": "http://127.0.0.1:18003", "memoryMiB": 4096}
    )
    return data


@pytest.mark.django_db
def test_reapply_with_changed_policy_and_a_new_model_updates_in_place(seeded_fleet, layout_data):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    # The pointer has moved since the first seed (revision 4, west serves): re-applying a file
    # that still declares east must leave it exactly there.
    Fleet.objects.filter(pk=seeded_fleet.pk).update(active_domain=west, route_revision=4)
    ids_before = set(Slot.objects.values_list("id", flat=True))

    report = layout_apply(layout=parse_layout(_changed_example(layout_data)))

    assert report.created == ["model demo/east/mistral-small"]
    # The new server's grant is planned into its slot's allocation.
    assert report.updated == ["fleet demo (policy)", "slot demo/east/gpu0/inference (allocation)"]
    assert report.extra == [] and report.pruned == []
    assert report.notes == [
        "activeDomainSlug 'east' is not applied: the fleet routes to 'west' (revision 4); "
        "a layout never moves routing, promote 'east' to switch"
    ]
    assert len(report.unchanged) == 9  # 2 domains, 3 slots, 4 models
    seeded_fleet.refresh_from_db()
    assert (seeded_fleet.active_domain_id, seeded_fleet.route_revision) == (west.id, 4)
    assert seeded_fleet.policy["wakeTimeoutMs"] == 45000
    assert set(Slot.objects.values_list("id", flat=True)) == ids_before  # updated, not recreated
    added = ModelBinding.objects.get(domain=east, name="mistral-small")
    assert added.slot.kind == "inference" and added.slot.gpu_index == 0


@pytest.mark.django_db
def test_reapply_updates_urls_names_and_specs(seeded_fleet, layout_data):
    layout_data["domains"][1]["supervisorUrl"] = "http://127.0.0.1:9702"
    layout_data["domains"][1]["displayName"] = "west, moved"
    layout_data["domains"][1]["slots"][1]["command"] = ["python", "-m", "trainer", "--fast"]
    layout_data["domains"][1]["slots"][0]["models"][0]["servingUrl"] = "http://127.0.0.1:19012"
    report = layout_apply(layout=parse_layout(layout_data))
    assert report.updated == [
        "domain demo/west (display_name, supervisor_url)",
        "model demo/west/llama-small (serving_url)",
        "slot demo/west/gpu0/training (spec)",
    ]
    train = Slot.objects.get(domain__slug="west", kind="training")
    assert train.spec["command"] == ["python", "-m", "trainer", "--fast"]
    assert train.state == "idle"  # state is never touched by a re-apply


@pytest.mark.django_db
def test_new_inference_slots_follow_the_live_pointer(seeded_fleet, layout_data):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    Fleet.objects.filter(pk=seeded_fleet.pk).update(active_domain=west, route_revision=2)
    for i, domain in enumerate(layout_data["domains"]):
        domain["gpus"][0]["count"] = 2
        domain["slots"].append(
            {
                "kind": "inference",
                "gpuIndex": 1,
                "models": [{"name": f"big-{i}", "exclusive": True}],
            }
        )
    layout_apply(layout=parse_layout(layout_data))
    new = dict(Slot.objects.filter(gpu_index=1).values_list("domain__slug", "state"))
    assert new == {"east": "sleeping", "west": "serving"}


@pytest.mark.django_db
def test_dry_run_reports_the_difference_and_writes_nothing(seeded_fleet, layout_data, tmp_path):
    before = db_state()
    report = layout_apply(layout=parse_layout(_changed_example(layout_data)), dry_run=True)
    assert report.dry_run is True
    assert report.created == ["model demo/east/mistral-small"]
    assert report.updated == ["fleet demo (policy)", "slot demo/east/gpu0/inference (allocation)"]
    assert db_state() == before

    path = write(tmp_path, _changed_example(layout_data))
    call_command("seed_layout", "--config", str(path), "--dry-run", stdout=(out := _Buffer()))
    assert "would apply" in out.text and "created: model demo/east/mistral-small" in out.text
    assert db_state() == before


@pytest.mark.django_db
def test_dry_run_of_a_new_fleet_creates_nothing(db):
    report = layout_apply(layout=load_layout(TWO_DOMAIN), dry_run=True)
    assert "fleet demo" in report.created
    assert not Fleet.objects.exists() and not Event.objects.exists()


class _Buffer:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def _without_west_training_and_llama(data: dict) -> dict:
    data = copy.deepcopy(data)
    west = data["domains"][1]
    west["slots"] = [west["slots"][0]]
    west["slots"][0]["models"] = [
        m for m in west["slots"][0]["models"] if m["name"] != "llama-small"
    ]
    return data


@pytest.mark.django_db
def test_rows_missing_from_the_file_are_reported_and_kept_without_prune(seeded_fleet, layout_data):
    report = layout_apply(layout=parse_layout(_without_west_training_and_llama(layout_data)))
    assert report.extra == ["model demo/west/llama-small", "slot demo/west/gpu0/training"]
    assert report.pruned == []
    assert Slot.objects.filter(domain__slug="west", kind="training").exists()
    assert ModelBinding.objects.filter(domain__slug="west", name="llama-small").exists()


@pytest.mark.django_db
def test_prune_removes_rows_missing_from_the_file(seeded_fleet, layout_data):
    report = layout_apply(
        layout=parse_layout(_without_west_training_and_llama(layout_data)), prune=True
    )
    assert report.pruned == ["model demo/west/llama-small", "slot demo/west/gpu0/training"]
    assert not Slot.objects.filter(domain__slug="west", kind="training").exists()
    assert not ModelBinding.objects.filter(domain__slug="west", name="llama-small").exists()
    assert ModelBinding.objects.filter(domain__slug="east", name="llama-small").exists()


@pytest.mark.django_db
def test_prune_removes_a_standby_domain(seeded_fleet, layout_data):
    layout_data["domains"] = layout_data["domains"][:1]
    report = layout_apply(layout=parse_layout(layout_data), prune=True)
    assert "domain demo/west" in report.pruned
    assert list(Domain.objects.values_list("slug", flat=True)) == ["east"]


@pytest.mark.django_db
def test_prune_of_a_domain_keeps_the_operations_that_targeted_it(seeded_fleet, layout_data):

    west = Domain.objects.get(slug="west")
    op = operation_request(fleet=seeded_fleet, kind="demote", target_domain_id=west.id).operation
    Operation.objects.filter(pk=op.pk).update(state="succeeded")
    layout_data["domains"] = layout_data["domains"][:1]

    layout_apply(layout=parse_layout(layout_data), prune=True)

    kept = Operation.objects.get(pk=op.pk)
    assert kept.target_domain_id is None
    assert kept.target_slug == "west"
    assert kept.events.filter(kind="operation.requested.demote").exists()


@pytest.mark.django_db
def test_prune_refuses_to_remove_the_active_domain(seeded_fleet, layout_data, tmp_path):
    layout_data["domains"] = layout_data["domains"][1:]
    layout_data["activeDomainSlug"] = "west"
    layout_data["displayName"] = "renamed"
    before = db_state()
    with pytest.raises(LayoutError) as caught:
        layout_apply(layout=parse_layout(layout_data), prune=True)
    assert caught.value.errors == [
        "domains: cannot prune 'east': it is the active domain; promote another domain first"
    ]
    assert db_state() == before  # the whole apply rolled back, the rename included
    with pytest.raises(CommandError, match="cannot prune 'east'"):
        call_command("seed_layout", "--config", str(write(tmp_path, layout_data)), "--prune")
    assert db_state() == before


@pytest.mark.django_db
def test_prune_refuses_while_an_operation_is_in_flight(seeded_fleet, layout_data):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
    before = db_state()
    with pytest.raises(LayoutError, match="in flight"):
        layout_apply(layout=parse_layout(_without_west_training_and_llama(layout_data)), prune=True)
    assert db_state() == before
    assert Operation.objects.count() == 1


# --- export --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_export_of_the_seeded_example_equals_the_example_file(seeded_fleet):
    exported = layout_export(seeded_fleet)
    example = json.loads(TWO_DOMAIN.read_text())
    assert exported == example
    # Same key order as well, so an exported file diffs cleanly against the shipped one.
    assert json.dumps(exported) == json.dumps(example)


@pytest.mark.django_db
@pytest.mark.parametrize("path", [TWO_DOMAIN, THREE_DOMAIN], ids=lambda p: p.name)
def test_reapplying_an_export_changes_nothing(db, path):
    layout_apply(layout=load_layout(path))
    fleet = Fleet.objects.get()
    exported = layout_export(fleet)
    Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(exported)
    before = db_state()
    report = layout_apply(layout=parse_layout(exported))
    assert (report.created, report.updated, report.extra, report.notes) == ([], [], [], [])
    before["events"] += 1  # the apply itself is audited
    assert db_state() == before


# --- the command in a real process ---------------------------------------------------------


@pytest.mark.integration
def test_seed_layout_process_exits_non_zero_on_a_bad_layout(tmp_path, layout_data):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "HARU_FLEET_LAYOUT"}
    }
    env["HARU_VAR_DIR"] = str(tmp_path / "var")

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert manage("migrate", "--noinput", "-v0").returncode == 0
    good = manage("seed_layout")  # default: the shipped two-domain example
    assert good.returncode == 0, good.stderr
    assert "created: fleet demo" in good.stdout

    layout_data["domains"][1]["slots"][0]["models"][0]["name"] = "Llama-Small"
    layout_data["displayName"] = "must not land"
    bad = manage("seed_layout", "--config", str(write(tmp_path, layout_data)))
    assert bad.returncode == 1
    assert "domains[1].slots[0].models[0].name: must be lowercase" in bad.stderr

    check = manage("seed_layout", "--dry-run", "--json")
    report = json.loads(check.stdout)
    assert (report["created"], report["updated"]) == ([], [])  # the bad run left no trace


# -- hostile files: refused fast, with where, nothing written ---------------------------------

BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(3)
    ]
)


def test_a_yaml_alias_is_refused_before_anything_is_expanded(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    with pytest.raises(LayoutError, match=r"bomb\.yaml: not valid yaml .*aliases .* not allowed"):
        load_layout(bomb)


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (
            "dup.json",
            '{"slug": "demo", "policy": {"autoFailover": true, "autoFailover": false}}',
            r"policy\.autoFailover: duplicate key",
        ),
        (
            "dup.yaml",
            "slug: demo\npolicy:\n  autoFailover: true\n  autoFailover: false\n",
            r"duplicate key 'autoFailover'.*line 4",
        ),
    ],
)
def test_a_repeated_key_is_refused_with_where_it_is(tmp_path, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LayoutError, match=where):
        load_layout(path)


@pytest.mark.parametrize(
    ("name", "text"), [("deep.json", "[" * 100_000), ("deep.yaml", "[" * 100_000)]
)
def test_deep_nesting_is_a_layout_error_not_a_recursion_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LayoutError, match="nested deeper than|not valid"):
        load_layout(path)


def test_a_layout_past_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"slug": "demo", "pad": "' + "x" * 5000 + '"}')
    with pytest.raises(LayoutError, match=r"big\.json: 50\d\d bytes; a layout may be at most 4096"):
        load_layout(path, max_bytes=4096)


@pytest.mark.django_db
def test_seed_layout_prints_a_clear_error_for_hostile_json(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(CommandError, match=r"refused, nothing written:\n  .*nested deeper than"):
        call_command("seed_layout", "--config", str(path))


@pytest.mark.django_db
def test_golden_probe_settings_are_stored_per_binding_and_exported_back(layout_data):
    data = copy.deepcopy(layout_data)
    qwen = data["domains"][0]["slots"][0]["models"][1]
    assert qwen["name"] == "qwen-small"
    qwen.update(deterministic=False, adapters=["qwen-sql", "qwen-chat"])
    layout_apply(layout=parse_layout(data))
    fleet = Fleet.objects.get()
    binding = ModelBinding.objects.get(domain__slug="east", name="qwen-small")
    assert binding.golden == {"deterministic": False, "adapters": ["qwen-sql", "qwen-chat"]}
    assert ModelBinding.objects.get(domain__slug="east", name="llama-small").golden == {}
    exported = layout_export(fleet)
    again = exported["domains"][0]["slots"][0]["models"][1]
    assert (again["deterministic"], again["adapters"]) == (False, ["qwen-sql", "qwen-chat"])
    report = layout_apply(layout=parse_layout(exported))
    assert report.updated == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("adapters", "qwen-sql"), ("adapters", [""]), ("adapters", ["a", "a"]), ("deterministic", 0)],
)
def test_bad_golden_probe_settings_are_refused(layout_data, field, value):
    data = copy.deepcopy(layout_data)
    data["domains"][0]["slots"][0]["models"][1][field] = value
    with pytest.raises(LayoutError) as caught:
        parse_layout(data)
    assert any(f".models[1].{field}" in e for e in caught.value.errors), caught.value.errors


@pytest.mark.django_db
def test_prune_refuses_while_a_rollout_is_in_flight(seeded_fleet, layout_data):
    rollout_create(
        fleet=seeded_fleet,
        body={
            "model": "qwen-small",
            "candidate": {"kind": "same-weights", "profile": {"engine": "sim"}},
            "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
        },
        actor="test",
    )
    layout_data["domains"] = layout_data["domains"][:1]
    with pytest.raises(LayoutError, match="rollout is in flight"):
        layout_apply(layout=parse_layout(layout_data), prune=True)
    assert Domain.objects.filter(slug="west").exists()
    assert Rollout.objects.get().candidate_domain.slug == "west"
