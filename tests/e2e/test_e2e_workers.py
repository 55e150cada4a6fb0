"""Work shared across machines: two reconcile workers as two hosts (UTS and PID namespaces of
their own where this machine allows), one killed with a tick in flight (bench/scale_workers.py).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from bench.scale_workers import HANDOVER_SLACK_S, workers_run
from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.reconciler.locks import quiet_lease_for
from fleets.services.layouts import layout_apply
from haru.local.layouts import fleet_layout
from haru.local.supervisors import TOKEN

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FLEETS = 20
INTERVAL_MS = 2000  # the example environment's
LEASE_MS = 4000


def test_two_workers_never_tick_a_fleet_twice_and_hand_a_killed_ones_fleets_over_within_a_lease(
    make_hosts, tmp_path
):
    east, west = make_hosts()
    for n in range(FLEETS):
        layout_apply(layout=parse_layout(fleet_layout(east, west, slug=f"shared-{n}")))
    parts = urlsplit(os.environ["DATABASE_URL"])
    database_url = urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))

    result = workers_run(
        database_url=database_url,
        workers=2,
        interval_ms=INTERVAL_MS,
        lease_ms=LEASE_MS,
        settle_s=5,
        workdir=tmp_path,
        env={**os.environ, "HARU_SUPERVISOR_TOKEN": TOKEN},
    )

    assert len(result["hosts"]) == 2, result  # two holder identities: two hosts to the lease
    assert all(result["ticks_by_worker"].values()), result  # both ticked: the fleets shared
    assert result["double_ticks"] == 0, result
    assert result["handover_fleets"] > 0, result
    assert result["handover_s"] is not None, result  # none of its fleets starved
    # Within one lease, plus the retry slack and as late as the survivor ticked any fleet then
    # (on a busy shared machine every tick starts late, handed over or not).
    late = result["survivor_lateness_max_s"] or 0.0
    assert result["handover_s"] <= LEASE_MS / 1000 + HANDOVER_SLACK_S + late, result
    # A tick in flight at the kill: its lease is waited out (another host's dead holder cannot
    # be seen to be dead), not taken over at once; an idle tick holds its quiet share of it.
    for wait in result["inflight_wait_s"]:
        assert wait >= quiet_lease_for(LEASE_MS / 1000) - HANDOVER_SLACK_S, result
    assert Fleet.objects.count() == FLEETS
