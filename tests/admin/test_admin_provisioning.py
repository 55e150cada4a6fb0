"""Admin actions stop and provision Haru-provisioned domains through the same services."""

from __future__ import annotations

from fleets.core.states import DomainState
from fleets.models import Domain, Event
from tests.drivers.managed_layout import seed_managed_fleet


def _action(client, action: str, pks, confirm: bool):
    data = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    if confirm:
        data["confirm"] = "yes"
    return client.post("/admin/fleets/domain/", data, follow=confirm)


def test_stop_and_provision_actions_confirm_then_move_the_domain(superuser_client, db):
    seed_managed_fleet()
    west = Domain.objects.get(slug="west")
    page = _action(superuser_client, "stop_domain", [west.pk], confirm=False)
    assert page.status_code == 200
    assert Domain.objects.get(pk=west.pk).state == DomainState.PROVISIONING  # nothing yet

    done = _action(superuser_client, "stop_domain", [west.pk], confirm=True)
    assert "west is stopping" in done.content.decode()
    assert Event.objects.get(kind="domain.stopping").actor == "admin:root"

    Domain.objects.filter(pk=west.pk).update(state=DomainState.STOPPED)
    done = _action(superuser_client, "provision_domain", [west.pk], confirm=True)
    assert "west is provisioning" in done.content.decode()
    assert Domain.objects.get(pk=west.pk).state == DomainState.PROVISIONING


def test_actions_on_a_static_domain_report_the_refusal(superuser_client, db):
    seed_managed_fleet()
    east = Domain.objects.get(slug="east")
    done = _action(superuser_client, "stop_domain", [east.pk], confirm=True)
    assert "not provisioned by Haru" in done.content.decode()
    assert Domain.objects.get(pk=east.pk).state == DomainState.READY
