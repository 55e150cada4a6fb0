"""Invariants live in the database: raw ORM writes that bypass the services are refused.

Every case writes straight through the ORM (no service, no validation) and expects the database
itself to raise IntegrityError, on SQLite and on Postgres alike.
"""

from __future__ import annotations

import pytest
from django.db import DataError, IntegrityError, transaction

from fleets.base import clock
from fleets.models import Domain, Fleet, ModelBinding, Operation, Slot

pytestmark = pytest.mark.django_db


def refused(write, errors=(IntegrityError,)):
    """Assert `write()` is refused by the database, keeping the test transaction usable."""
    with pytest.raises(errors), transaction.atomic():
        write()


@pytest.fixture
def domain(db):
    fleet = Fleet.objects.create(slug="raw")
    return Domain.objects.create(
        fleet=fleet, slug="d1", state="ready", state_updated_at=clock.now()
    )


@pytest.fixture
def slot(domain):
    return Slot.objects.create(
        domain=domain, gpu_index=0, kind="inference", state="serving", state_updated_at=clock.now()
    )


@pytest.mark.parametrize("slug", ["Bad", "a_b", "a--b", "-a", "a-", "", "a b", "ümlaut"])
def test_fleet_slug_outside_the_pattern_is_refused(slug):
    refused(lambda: Fleet.objects.create(slug=slug))


def test_fleet_slug_longer_than_63_characters_is_refused():
    Fleet.objects.create(slug="a" * 63)
    # Postgres's varchar(63) refuses it as DataError before the CHECK; SQLite has the CHECK.
    refused(lambda: Fleet.objects.create(slug="b" * 64), (IntegrityError, DataError))


def test_domain_slug_outside_the_pattern_is_refused(domain):
    refused(
        lambda: Domain.objects.create(
            fleet=domain.fleet, slug="East_1", state="ready", state_updated_at=clock.now()
        )
    )


def test_duplicate_domain_slug_in_a_fleet_is_refused(domain):
    refused(
        lambda: Domain.objects.create(
            fleet=domain.fleet, slug=domain.slug, state="ready", state_updated_at=clock.now()
        )
    )


def test_same_domain_slug_in_two_fleets_is_allowed(domain):
    other = Fleet.objects.create(slug="other")
    Domain.objects.create(
        fleet=other, slug=domain.slug, state="ready", state_updated_at=clock.now()
    )


@pytest.mark.parametrize("revision", [0, -1])
def test_route_revision_below_one_is_refused(revision):
    refused(lambda: Fleet.objects.create(slug="rev", route_revision=revision))


def test_route_revision_cannot_be_updated_to_zero(domain):
    refused(lambda: Fleet.objects.filter(pk=domain.fleet_id).update(route_revision=0))


def test_negative_gpu_index_is_refused(domain):
    refused(
        lambda: Slot.objects.create(
            domain=domain,
            gpu_index=-1,
            kind="inference",
            state="serving",
            state_updated_at=clock.now(),
        )
    )


def test_duplicate_domain_gpu_kind_is_refused(slot):
    refused(
        lambda: Slot.objects.create(
            domain=slot.domain,
            gpu_index=slot.gpu_index,
            kind=slot.kind,
            state="sleeping",
            state_updated_at=clock.now(),
        )
    )


def test_inference_and_training_may_share_a_gpu(slot):
    Slot.objects.create(
        domain=slot.domain, gpu_index=0, kind="training", state="idle", state_updated_at=clock.now()
    )


@pytest.mark.parametrize(
    ("kind", "state"),
    [("inference", "idle"), ("inference", "training"), ("training", "serving"), ("training", "x")],
)
def test_slot_state_not_of_its_kind_is_refused(domain, kind, state):
    refused(
        lambda: Slot.objects.create(
            domain=domain, gpu_index=3, kind=kind, state=state, state_updated_at=clock.now()
        )
    )


def test_slot_state_cannot_be_updated_to_another_kinds_state(slot):
    refused(lambda: Slot.objects.filter(pk=slot.pk).update(state="idle"))


def test_duplicate_model_name_in_a_domain_is_refused(slot):
    ModelBinding.objects.create(
        domain=slot.domain, slot=slot, name="qwen", serving_url="http://127.0.0.1:1"
    )
    refused(
        lambda: ModelBinding.objects.create(
            domain=slot.domain, slot=slot, name="qwen", serving_url="http://127.0.0.1:2"
        )
    )


@pytest.mark.parametrize("name", ["Qwen", "QWEN-7B", "qwen 7b", "qwen\t"])
def test_model_name_with_upper_case_or_space_is_refused(slot, name):
    refused(
        lambda: ModelBinding.objects.create(
            domain=slot.domain, slot=slot, name=name, serving_url="http://127.0.0.1:1"
        )
    )


def test_unknown_domain_state_and_provider_are_refused(domain):
    refused(lambda: Domain.objects.filter(pk=domain.pk).update(state="sideways"))
    refused(lambda: Domain.objects.filter(pk=domain.pk).update(provider="azure-direct"))


def _operation(domain, state: str, kind: str = "promote") -> Operation:
    return Operation.objects.create(
        fleet=domain.fleet,
        kind=kind,
        state=state,
        target_domain=domain,
        created_at=clock.now(),
    )


@pytest.mark.parametrize(("first", "second"), [("pending", "pending"), ("pending", "running")])
def test_two_in_flight_operations_in_one_fleet_are_refused(domain, first, second):
    _operation(domain, first)
    refused(lambda: _operation(domain, second, kind="demote"))


def test_finished_operations_do_not_block_a_new_one(domain):
    for state in ("succeeded", "failed", "cancelled"):
        _operation(domain, state)
    _operation(domain, "pending")
    other = Fleet.objects.create(slug="other")
    other_domain = Domain.objects.create(
        fleet=other, slug="d1", state="ready", state_updated_at=clock.now()
    )
    _operation(other_domain, "running")  # one in flight per fleet, not per database
    assert Operation.objects.filter(state__in=["pending", "running"]).count() == 2


def test_finished_operation_cannot_be_reopened_beside_an_in_flight_one(domain):
    done = _operation(domain, "succeeded")
    _operation(domain, "pending")
    refused(lambda: Operation.objects.filter(pk=done.pk).update(state="running"))


def test_unknown_operation_state_and_kind_are_refused(domain):
    refused(lambda: _operation(domain, "paused"))
    refused(lambda: _operation(domain, "pending", kind="restart"))
