"""End to end: a trainer that leaks GPU memory past its SIGKILL is caught before the wake, and
a host whose GPUs differ from the plan says so all the way to the dashboard.

The standby's trainer ignores SIGTERM and leaves memory behind when it is killed (a simulated
driver leak in the sim GPU state). The leak is small enough for verify_gpu's used/total ratio,
but too big for the models to wake into: the supervisor's pre-wake check refuses the wake with
`insufficient_gpu_memory`, the promotion fails with that code, and routing never moves.
"""

from __future__ import annotations

import json

import pytest

from fleets.models import Domain, Event, Operation
from supervisor.gpu.sim_state import SimGpuState
from tests.e2e.harness import SimHost
from tests.e2e.test_e2e_failover import (
    assert_nothing_in_flight,
    assert_routing_never_moved,
    finished,
    promote,
    seen,
)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

WEIGHTS_MIB = 32768  # two of them need 64 GiB free to wake on the 80 GiB simulated GPU
LEAK_MIB = 18000  # 19.5 GiB in use with the residues: under verify_gpu's 25 %


def test_a_leaked_trainer_stops_the_promotion_at_the_pre_wake_check(make_hosts, make_fleet, drive):
    memory = {"weights_mib": WEIGHTS_MIB, "planned_memory": True}
    east, west = make_hosts(
        east=memory,
        west={**memory, "trainer_args": ("--ignore-sigterm", "--leak-mib", str(LEAK_MIB))},
    )
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "failed"
    assert op.error["step"] == "wake"
    assert op.error["code"] == "insufficient_gpu_memory"
    assert "GPU 0:" in op.error["message"] and "MiB free, waking" in op.error["message"]
    # The trainer was SIGKILLed after its grace, and its leak outlived it.
    stop = Event.objects.get(operation=op, kind="operation.step.done", step="stop_training")
    assert stop.duration_ms >= 500
    leaks = [h for h in SimGpuState(west.dir / "sim-gpu.json").holders() if h.leaked]
    assert [h.mib for h in leaks] == [LEAK_MIB]
    # verify_gpu passed: the ratio alone could not see that the wake would not fit.
    assert Event.objects.filter(operation=op, kind="operation.step.done", step="verify_gpu")
    # No engine was asked to wake into memory it could not get.
    assert set(west.asleep().values()) == {True}
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    # Standby posture restored: models asleep, training restarted.
    assert Event.objects.get(operation=op, kind="operation.cleanup.training").data["ok"] is True
    assert Operation.objects.filter(fleet=fleet).count() == 1


def test_a_host_whose_gpus_differ_from_the_plan_says_so_up_to_the_dashboard(
    tmp_path, make_fleet, drive, client, django_user_model
):
    east, west = SimHost("east", tmp_path), SimHost("west", tmp_path, start_asleep=True)
    # The plan assumed an A100 with 40 GiB; the simulated host has an 80 GiB "SIM-H100".
    east.config["plan"] = {"gpus": [{"index": 0, "type": "A100", "memoryMiB": 40960}]}
    (east.dir / "config.json").write_text(json.dumps(east.config))
    try:
        east.start()
        west.start()
        mismatches = east.status()["planMismatches"]
        assert [m["code"] for m in mismatches] == ["gpu_type_mismatch"]
        assert "planMismatches" not in west.status()  # additive: absent when there is none

        fleet = make_fleet(east, west)
        drive(fleet, seen(fleet))
        reported = Domain.objects.get(fleet=fleet, slug="east").last_report
        assert reported["planMismatches"] == mismatches

        staff = django_user_model.objects.create_user(
            "ops", password="pw", is_staff=True, is_superuser=True
        )
        client.force_login(staff)
        html = client.get(f"/fleets/{fleet.slug}/live/").content.decode()
        assert "plan vs host: GPU 0 is planned as &#x27;A100&#x27;" in html
    finally:
        east.crash()
        west.crash()
