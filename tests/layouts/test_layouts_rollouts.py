"""Layout apply beside rollouts: refused while one is in flight, and never silently behind one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fleets.base.errors import LayoutBehindRollout, LayoutRolloutConflict
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet, ModelBinding, Rollout
from fleets.services.layouts import layout_apply
from fleets.services.rollouts import binding_serving_move, rollout_create

pytestmark = pytest.mark.django_db

NEW_PROFILE = {"engine": "sim", "extraArgs": ["--weights-mib", "6144", "--ttft-ms", "30"]}


def start_rollout(fleet: Fleet) -> Rollout:
    return rollout_create(
        fleet=fleet,
        body={
            "model": "qwen-small",
            "candidate": {"kind": "same-weights", "profile": NEW_PROFILE},
            "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
        },
        actor="test",
    )


def bindings() -> dict:
    return {
        (b.domain.slug, b.name): (b.serving_url, b.profile)
        for b in ModelBinding.objects.select_related("domain")
    }


def moved_url(domain: str) -> str:
    return {"east": "http://127.0.0.1:19001", "west": "http://127.0.0.1:19011"}[domain]


def finish(rollout: Rollout, state: str = "succeeded") -> None:
    """What a rollout that succeeded leaves: both domains' binding on the new profile and the
    port their supervisor reported (the reconciler's binding_serving_move), the row finished."""
    for domain in Domain.objects.filter(fleet_id=rollout.fleet_id):
        binding = ModelBinding.objects.get(domain=domain, name=rollout.model)
        assert binding_serving_move(
            rollout=rollout,
            domain_id=domain.id,
            expected_url=binding.serving_url,
            serving_url=moved_url(domain.slug),
            profile=NEW_PROFILE,
            actor="test",
        )
    Rollout.objects.filter(pk=rollout.pk).update(state=state)


def qwen(data: dict, domain: int) -> dict:
    return next(
        m for m in data["domains"][domain]["slots"][0]["models"] if m["name"] == "qwen-small"
    )


# --- a rollout in flight ----------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_change_to_a_model_is_refused_while_a_rollout_is_in_flight(
    seeded_fleet, layout_data, dry_run
):
    rollout = start_rollout(seeded_fleet)
    before = bindings()
    qwen(layout_data, 1)["profile"] = {"engine": "sim", "extraArgs": ["--ttft-ms", "5"]}
    with pytest.raises(LayoutRolloutConflict) as caught:
        layout_apply(layout=parse_layout(layout_data), dry_run=dry_run)
    assert (caught.value.status, caught.value.code) == (409, "rollout_conflict")
    assert f"rollout {rollout.id} of model 'qwen-small' is in flight" in caught.value.errors[0]
    assert bindings() == before


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["domains"][0].update(priority=5),
        lambda d: d["domains"][1]["slots"][0]["models"].pop(),
        lambda d: d["domains"][1].update(servingBaseUrl="http://127.0.0.1:18099"),
        lambda d: d["domains"][1]["slots"][1].update(checkpointDir="/tmp/elsewhere"),
    ],
)
def test_domain_and_slot_changes_are_refused_too(seeded_fleet, layout_data, edit):
    start_rollout(seeded_fleet)
    before = (bindings(), sorted(Domain.objects.values_list("slug", "priority")))
    edit(layout_data)
    with pytest.raises(LayoutRolloutConflict):
        layout_apply(layout=parse_layout(layout_data))
    assert (bindings(), sorted(Domain.objects.values_list("slug", "priority"))) == before


def test_an_unchanged_file_or_a_fleet_level_change_applies_during_a_rollout(
    seeded_fleet, layout_data
):
    start_rollout(seeded_fleet)
    layout_apply(layout=parse_layout(layout_data))
    layout_data["displayName"] = "renamed during the rollout"
    report = layout_apply(layout=parse_layout(layout_data))
    assert report.updated == ["fleet demo (display_name)"]


def test_a_rollout_that_starts_between_batches_stops_the_apply(seeded_fleet, layout_data, settings):
    settings.HARU = {**settings.HARU, "layout_batch_rows": 1, "layout_batch_pause_ms": 0}
    for m in (qwen(layout_data, 0), qwen(layout_data, 1)):
        m["profile"] = {"engine": "sim", "extraArgs": ["--ttft-ms", "7"]}

    def started(done: int, total: int) -> None:
        if done == 1:
            start_rollout(seeded_fleet)

    with pytest.raises(LayoutRolloutConflict) as caught:
        layout_apply(layout=parse_layout(layout_data), on_batch=started)
    assert caught.value.batches_written >= 1
    # The model rows come after the fleet's row: neither moved once the rollout held them.
    assert all(
        p != {"engine": "sim", "extraArgs": ["--ttft-ms", "7"]} for _, p in bindings().values()
    )


# --- after a rollout ------------------------------------------------------------------------


def test_a_file_behind_a_finished_rollout_is_refused_with_what_to_write(seeded_fleet, layout_data):
    rollout = start_rollout(seeded_fleet)
    finish(rollout)
    after = bindings()
    with pytest.raises(LayoutBehindRollout) as caught:
        layout_apply(layout=parse_layout(layout_data))
    assert (caught.value.status, caught.value.code) == (409, "layout_behind_rollout")
    [east, west] = sorted(caught.value.errors)
    assert east.startswith("model demo/east/qwen-small: the layout file is behind rollout ")
    assert str(rollout.id) in east and "(succeeded)" in east
    assert "old profile and servingUrl" in east
    assert '"profile"' in east and "differing keys: extraArgs" in east
    assert f'"servingUrl" to {moved_url("east")!r}' in east and "--revert-rollout" in east
    assert moved_url("west") in west
    assert bindings() == after


def test_a_file_updated_to_the_rollouts_version_applies_unchanged(seeded_fleet, layout_data):
    finish(start_rollout(seeded_fleet))
    after = bindings()
    for i, slug in ((0, "east"), (1, "west")):
        qwen(layout_data, i).update(profile=copy.deepcopy(NEW_PROFILE), servingUrl=moved_url(slug))
    layout_apply(layout=parse_layout(layout_data))
    # The file's profile, with what the planner adds to it (its GPUs, its memory share).
    for (_, name), (url, profile) in bindings().items():
        if name == "qwen-small":
            assert url in after[("east", name)][0] + after[("west", name)][0]
            assert {k: profile[k] for k in NEW_PROFILE} == NEW_PROFILE


def test_half_updated_file_is_still_behind(seeded_fleet, layout_data):
    finish(start_rollout(seeded_fleet))
    for i in (0, 1):
        qwen(layout_data, i)["profile"] = copy.deepcopy(NEW_PROFILE)  # the URL is still the old
    with pytest.raises(LayoutBehindRollout, match="old servingUrl"):
        layout_apply(layout=parse_layout(layout_data))


def test_revert_rollout_puts_the_files_values_back_and_says_the_hosts_are_not_changed(
    seeded_fleet, layout_data
):
    before = bindings()
    finish(start_rollout(seeded_fleet))
    report = layout_apply(layout=parse_layout(layout_data), revert_rollout=True)
    assert bindings() == before
    assert sum("the hosts are not changed" in n for n in report.notes) == 2


def test_a_third_version_in_the_file_is_an_ordinary_edit(seeded_fleet, layout_data):
    finish(start_rollout(seeded_fleet))
    third = {"engine": "sim", "extraArgs": ["--ttft-ms", "3"]}
    for i, slug in ((0, "east"), (1, "west")):
        qwen(layout_data, i).update(profile=copy.deepcopy(third), servingUrl=moved_url(slug))
    layout_apply(layout=parse_layout(layout_data))
    profiles = [p for (_, name), (_, p) in bindings().items() if name == "qwen-small"]
    assert [p["extraArgs"] for p in profiles] == [third["extraArgs"]] * 2


def test_a_rollout_rolled_back_to_the_old_version_does_not_hold_the_file(seeded_fleet, layout_data):
    rollout = start_rollout(seeded_fleet)
    Rollout.objects.filter(pk=rollout.pk).update(state="rolled_back")  # restored: old profile
    qwen(layout_data, 1)["profile"] = {"engine": "sim", "extraArgs": ["--ttft-ms", "9"]}
    layout_apply(layout=parse_layout(layout_data))


def test_seed_layout_refuses_a_file_behind_a_rollout_and_reverts_with_the_flag(
    seeded_fleet, layout_data, tmp_path: Path
):
    before = bindings()
    finish(start_rollout(seeded_fleet))
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout_data))
    with pytest.raises(CommandError, match="refused, nothing written(.|\n)*behind rollout"):
        call_command("seed_layout", config=str(path))
    call_command("seed_layout", config=str(path), revert_rollout=True)
    assert bindings() == before
