"""Each step executor against a scripted supervisor and a fake clock: done, pending, failed."""

from __future__ import annotations

import httpx
import pytest
from django.db.models import F
from prometheus_client import REGISTRY

from fleets.core.policy import Policy
from fleets.models import Domain, Event, Fleet, Operation, Slot
from fleets.reconciler.steps import promote
from fleets.reconciler.steps.base import StepContext
from fleets.reconciler.supervisor.client import client_for
from fleets.services.operations import operation_request, operation_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def promotion(fleet, tick, domains):
    """A running promotion of west, after one heartbeat; returns a refresher for it."""
    tick()
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    operation_start(operation_id=op.operation.id)

    def current() -> Operation:
        return Operation.objects.select_related("fleet", "target_domain", "source_domain").get(
            pk=op.operation.id
        )

    return current


def ctx_for(op: Operation, step: str | None = None) -> StepContext:
    return StepContext(
        operation=op,
        policy=Policy.resolve(op.fleet.policy),
        step=step or op.current_step,
        client_for=client_for,
    )


def at_step(op_ref, step: str) -> Operation:
    Operation.objects.filter(pk=op_ref().pk).update(current_step=step)
    return op_ref()


def slot(domain, kind: str) -> Slot:
    return Slot.objects.get(domain=domain, kind=kind)


def kinds(op) -> list[str]:
    return list(Event.objects.filter(operation=op).order_by("id").values_list("kind", flat=True))


# -- stop_training ---------------------------------------------------------------------------


def test_stop_training_claims_slots_asks_once_and_finishes_when_idle(promotion, hosts, domains):
    west = hosts.hosts["west"]
    west.stop_polls = 2  # the trainer is still saving at the next two status reads
    op = promotion()

    first = promote.stop_training(ctx_for(op))
    assert first.status == "pending"
    assert slot(domains()["west"], "training").state == "stopping"
    second = promote.stop_training(ctx_for(op))
    assert second.status == "pending"
    # Re-entrant: the stop in progress is not asked for again.
    assert west.calls["POST /v1/training/stop"] == 1
    third = promote.stop_training(ctx_for(op))
    assert third.done
    assert slot(domains()["west"], "training").state == "idle"
    assert west.effects["trainer_stopped"] == 1


def test_a_stop_answer_that_lists_the_trainer_gone_needs_no_status_read(promotion, hosts, domains):
    west = hosts.hosts["west"]
    west.stop_lists_trainers = True  # as ours answers a failover's stop
    reads = west.calls["GET /v1/status"]
    assert promote.stop_training(ctx_for(promotion())).done
    assert west.calls["GET /v1/status"] == reads
    assert slot(domains()["west"], "training").state == "idle"


def test_a_stop_answer_that_lists_the_trainer_still_stopping_is_looked_at_again(
    promotion, hosts, domains
):
    west = hosts.hosts["west"]
    west.stop_lists_trainers, west.stop_polls = True, 1  # a planned stop's grace: it saves first
    reads = west.calls["GET /v1/status"]
    assert promote.stop_training(ctx_for(promotion())).status == "pending"
    assert west.calls["GET /v1/status"] == reads  # the answer said so: no read yet
    assert promote.stop_training(ctx_for(promotion())).status == "pending"
    assert promote.stop_training(ctx_for(promotion())).done  # read until it is gone
    assert west.calls["GET /v1/status"] == reads + 2
    assert west.calls["POST /v1/training/stop"] == 1


def stop_graces(host) -> list[int]:
    return [body["graceMs"] for _, url, body in host.requests if url.endswith("/v1/training/stop")]


def test_a_planned_promotion_gives_the_trainer_the_policys_grace(promotion, hosts):
    op = promotion()
    promote.stop_training(ctx_for(op))
    assert stop_graces(hosts.hosts["west"]) == [
        Policy.resolve(op.fleet.policy).training_stop_grace_ms
    ]


@pytest.mark.parametrize("how", ["automatic", "active failed"])
def test_a_failover_stops_the_trainer_at_once(fleet, tick, domains, hosts, fake_clock, how):
    # The outage waits for the stop: no final save unless failoverTrainingStopGraceMs asks.
    tick()
    if how == "automatic":
        request = operation_request(
            fleet=fleet,
            kind="promote",
            target_domain_id=domains()["west"].id,
            reason="auto_failover",
            detected_at=fake_clock.now(),
        )
    else:
        Domain.objects.filter(pk=domains()["east"].pk).update(state="failed")
        request = operation_request(fleet=fleet, kind="promote", target_domain_id="west")
    operation_start(operation_id=request.operation.id)
    op = Operation.objects.select_related("fleet", "target_domain", "source_domain").get(
        pk=request.operation.id
    )
    promote.stop_training(ctx_for(op))
    assert stop_graces(hosts.hosts["west"]) == [1]
    Fleet.objects.filter(pk=fleet.pk).update(
        policy={**fleet.policy, "failoverTrainingStopGraceMs": 700}
    )
    Slot.objects.filter(domain=domains()["west"], kind="training").update(state="training")
    hosts.hosts["west"].trainer = "running"
    promote.stop_training(
        ctx_for(Operation.objects.select_related("fleet", "source_domain").get(pk=op.pk))
    )
    assert stop_graces(hosts.hosts["west"]) == [1, 700]


def test_training_that_will_not_die_times_out_and_restores_the_standby(
    promotion, hosts, tick, fake_clock, domains
):
    hosts.hosts["west"].ignore_stop = True
    tick()  # stop requested; still running
    fake_clock.advance(ms=15_001)  # stopTrainingTimeoutMs
    tick()
    op = promotion()
    assert op.state == "failed"
    assert op.error["code"] == "step_timeout" and op.error["step"] == "stop_training"
    assert "still running" in op.error["message"]
    # Routing never moved; the slot claimed for stopping went back to training.
    assert Fleet.objects.get(pk=op.fleet_id).route_revision == 1
    assert slot(domains()["west"], "training").state == "training"
    assert "operation.cleanup.sleep" in kinds(op)


# -- verify_gpu ------------------------------------------------------------------------------


def test_verify_gpu_waits_for_memory_then_fails_with_the_numbers(promotion, hosts, fake_clock):
    hosts.hosts["west"].leak_mib = 30_000  # a zombie keeps VRAM after the trainer exited
    op = at_step(promotion, "verify_gpu")
    hosts.hosts["west"].trainer = "idle"
    result = promote.verify_gpu(ctx_for(op))
    assert result.status == "pending"
    assert "GPU 0 holds" in result.message and "> 25.0%" in result.message

    hosts.hosts["west"].leak_mib = 0
    assert promote.verify_gpu(ctx_for(op)).done


def test_verify_gpu_is_a_no_op_without_training_slots(promotion, domains):
    Slot.objects.filter(domain=domains()["west"], kind="training").delete()
    op = at_step(promotion, "verify_gpu")
    result = promote.verify_gpu(ctx_for(op))
    assert result.done and result.data == {"gpus": []}


# -- wake ------------------------------------------------------------------------------------


def test_wake_moves_slots_through_waking_to_probing(promotion, hosts, domains):
    op = at_step(promotion, "wake")
    result = promote.wake(ctx_for(op))
    assert result.done
    assert slot(domains()["west"], "inference").state == "probing"
    assert hosts.hosts["west"].effects["woke"] == 2
    # Safe twice: the second nudge wakes nothing (the supervisor's wake is idempotent).
    assert promote.wake(ctx_for(op)).done
    assert hosts.hosts["west"].effects["woke"] == 2


@pytest.mark.parametrize("fault", ["wake_fails", "wake_noop"])
def test_a_wake_that_fails_or_hangs_ends_in_step_timeout_and_never_routes(
    promotion, hosts, tick, fake_clock, domains, fault
):
    setattr(hosts.hosts["west"], fault, True)
    tick()  # stop_training asked the trainer to stop
    tick()  # runs to wake, which stays pending
    assert promotion().current_step == "wake"
    fake_clock.advance(ms=30_001)  # wakeTimeoutMs
    tick()
    op = promotion()
    assert op.state == "failed" and op.error["code"] == "step_timeout"
    assert op.error["step"] == "wake"
    if fault == "wake_fails":
        assert "wake_failed" in op.error["message"]
    fleet = Fleet.objects.get(pk=op.fleet_id)
    assert fleet.route_revision == 1 and fleet.active_domain_id == domains()["east"].id
    # Standby posture restored: models still asleep (proven), training restarted.
    assert slot(domains()["west"], "inference").state == "sleeping"
    assert hosts.hosts["west"].trainer == "running"
    cleanup = Event.objects.get(operation=op, kind="operation.cleanup.training")
    assert cleanup.data["ok"] is True


# -- probe -----------------------------------------------------------------------------------


def test_probe_failure_never_moves_routing(promotion, hosts, tick, domains):
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    tick()
    tick()
    op = promotion()
    assert op.state == "failed"
    assert op.error == {
        "step": "probe",
        "code": "probe_failed",
        "message": "probe failed: qwen-small: HTTP 500: boom",
    }
    fleet = Fleet.objects.get(pk=op.fleet_id)
    assert fleet.route_revision == 1 and fleet.active_domain_id == domains()["east"].id
    assert not Event.objects.filter(kind="fleet.route.switched").exists()
    # The woken target was put back to sleep and its training restarted.
    assert all(hosts.hosts["west"].models.values())
    assert hosts.hosts["west"].trainer == "running"
    assert slot(domains()["west"], "inference").state == "sleeping"


def test_probe_checks_only_layout_models(promotion, hosts):
    hosts.hosts["west"].models["extra-model"] = True  # asleep, not in the layout
    op = at_step(promotion, "probe")
    hosts.hosts["west"].models.update({"qwen-small": False, "llama-small": False})
    result = promote.probe(ctx_for(op))
    assert result.done, result.message


# -- supervisor errors -----------------------------------------------------------------------


def test_unauthorized_target_fails_at_once_with_supervisor_unauthorized(promotion, hosts, tick):
    hosts.hosts["west"].unauthorized = True
    tick()
    op = promotion()
    assert op.state == "failed"
    assert op.error["code"] == "supervisor_unauthorized"
    assert op.error["step"] == "stop_training"
    assert Fleet.objects.get(pk=op.fleet_id).route_revision == 1
    cleanup = Event.objects.get(operation=op, kind="operation.cleanup.sleep")
    assert cleanup.data["ok"] is False


def test_a_bad_body_stays_pending_until_the_budget_runs_out(promotion, hosts, tick, fake_clock):
    hosts.hosts["west"].bad_body = True
    tick()
    assert promotion().state == "running"
    fake_clock.advance(ms=15_001)
    tick()
    op = promotion()
    assert op.error["code"] == "step_timeout"
    assert "expected a list" in op.error["message"] or "not JSON" in op.error["message"]


def test_a_supervisor_that_comes_back_mid_step_lets_the_step_resume(
    promotion, hosts, tick, fake_clock
):
    west = hosts.hosts["west"]
    west.down = True
    tick()
    assert promotion().current_step == "stop_training"
    fake_clock.advance(ms=5_000)  # within the 15 s budget
    west.down = False
    for _ in range(6):
        tick()
        fake_clock.advance(ms=1_000)  # the old active sleeps once the switch has settled
    op = promotion()
    assert op.state == "succeeded", op.error


# -- switch_route ----------------------------------------------------------------------------


def test_switch_route_lost_to_a_concurrent_writer_fails_cas_lost(promotion, monkeypatch, domains):
    op = at_step(promotion, "switch_route")
    real = promote.route_switch

    def racing(**kwargs):
        # Someone bumps the revision between our read and our CAS.
        Fleet.objects.filter(pk=kwargs["fleet_id"]).update(route_revision=F("route_revision") + 1)
        return real(**kwargs)

    monkeypatch.setattr(promote, "route_switch", racing)
    result = promote.switch_route(ctx_for(op))
    assert result.failed and result.code == "cas_lost"
    assert Fleet.objects.get(pk=op.fleet_id).active_domain_id == domains()["east"].id


def test_switch_route_lost_to_our_own_twin_counts_as_done(promotion, monkeypatch, domains):
    op = at_step(promotion, "switch_route")
    real = promote.route_switch

    def twin_first(**kwargs):
        assert real(**kwargs) is not None  # a concurrent tick of the same operation wins
        return real(**kwargs)  # ours then loses the CAS

    monkeypatch.setattr(promote, "route_switch", twin_first)
    result = promote.switch_route(ctx_for(op))
    assert result.done and result.data["alreadyActive"] is True
    fleet = Fleet.objects.get(pk=op.fleet_id)
    assert fleet.active_domain_id == domains()["west"].id and fleet.route_revision == 2


# -- best-effort steps on the old active -----------------------------------------------------


def test_unproven_sleep_skips_training_on_the_old_active(promotion, hosts, tick, fake_clock):
    hosts.hosts["east"].down = True
    for _ in range(4):
        tick()
        fake_clock.advance(ms=15_001)
    op = promotion()
    assert op.state == "succeeded"
    assert hosts.hosts["east"].effects["trainer_started"] == 0
    skipped = Event.objects.get(operation=op, kind="operation.step.skipped")
    assert skipped.step == "demote_old_train"
    assert Fleet.objects.get(pk=op.fleet_id).domains.get(slug="east").state == "degraded"


def test_a_pid_less_trainer_never_counts_as_training(promotion, hosts, tick, fake_clock, domains):
    hosts.hosts["east"].start_without_pid = True
    for _ in range(4):
        tick()
        fake_clock.advance(ms=15_001)
    op = promotion()
    assert op.state == "succeeded"
    train = Event.objects.get(operation=op, step="demote_old_train")
    assert train.kind == "operation.step.timeout_best_effort"
    assert slot(domains()["east"], "training").state == "idle"


def original_style_probe(west):
    """Make west refuse the body's `models` field, as the original supervisor does."""
    original = west._route
    seen = []

    def strict(method, path, body):
        if path == "/v1/probe":
            seen.append(sorted(body))
            if "models" in body:
                return httpx.Response(
                    400, json={"error": {"code": "invalid_request", "message": "unknown field"}}
                )
        return original(method, path, body)

    west._route = strict
    west.features = ()
    west.models.update({"qwen-small": False, "llama-small": False})
    return seen


def probe_errors() -> float:
    value = REGISTRY.get_sample_value(
        "haru_supervisor_call_errors_total", {"call": "probe", "kind": "http"}
    )
    return value or 0.0


def test_probe_learns_from_status_that_the_supervisor_refuses_the_models_field(promotion, hosts):
    seen = original_style_probe(hosts.hosts["west"])
    before = probe_errors()
    client_for(Domain.objects.get(slug="west")).status(
        timeout=1
    )  # a heartbeat whose answer lists no `features`
    result = promote.probe(ctx_for(at_step(promotion, "probe")))
    assert result.done, result.message
    assert seen == [["maxTokens", "prompt", "timeoutMs"]]  # one call, no `models`
    assert probe_errors() == before


def test_probe_falls_back_once_and_remembers_it_for_that_supervisor(promotion, hosts):
    seen = original_style_probe(hosts.hosts["west"])
    before = probe_errors()
    for _ in range(2):
        result = promote.probe(ctx_for(at_step(promotion, "probe")))
        assert result.done, result.message
    # The promotion's earlier status reads learned ours (probe.models, probe.golden); the
    # original that replaced it refuses both, and the resend carries neither.
    with_models = ["maxTokens", "models", "prompt", "seed", "timeoutMs"]
    without = ["maxTokens", "prompt", "timeoutMs"]
    assert seen == [with_models, without, without]  # the second probe asks once
    assert probe_errors() == before  # the refused first try is not a supervisor error


# -- demote ----------------------------------------------------------------------------------


def test_demote_refuses_a_target_that_became_active(fleet, tick, domains, hosts):
    west = domains()["west"]
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=west.id).operation
    # The pointer moved to west after the demotion was accepted (simulated directly).
    Fleet.objects.filter(pk=fleet.pk).update(active_domain=west)
    tick()
    op.refresh_from_db()
    assert op.state == "failed"
    assert op.error["code"] == "target_is_active" and op.error["step"] == "sleep"
    assert hosts.hosts["west"].calls["POST /v1/vllm/sleep"] == 0


def test_demote_of_an_unauthorized_standby_fails_at_once(fleet, tick, domains, hosts):
    hosts.hosts["west"].unauthorized = True
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    tick()
    op.operation.refresh_from_db()
    assert op.operation.error["code"] == "supervisor_unauthorized"
