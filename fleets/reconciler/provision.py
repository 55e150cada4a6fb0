"""The provisioning tick: launch, watch and tear down driver-backed domains with the `sky` CLI.

Runs beside the reconcile tick (the loop and Celery call it after `tick_run`), never inside a
request and never inside a transaction: every `sky` call happens first, then its outcome is
written with one conditional UPDATE (`fleets.services.provisioning`). A fleet's provisioning
ticks do not overlap (their own lock, so slow cloud calls never hold up failover), and every
write is guarded by the domain's attempt counter, so a second worker can only lose a race.

Per managed domain:
- failed, not active, past `replaceFailedGraceMs`, policy allows: begin a replacement;
- provisioning: replace (down the old cluster), launch on the current candidate, wait for the
  request and the cluster, record its URLs; a failed launch backs off and moves to the next
  region/zone on capacity errors; past `provisionTimeoutMs` the domain goes failed with the
  driver's last error;
- ready standby in phase up: request a demotion (sleep, then training), then settle;
- stopping: stop or down, confirm, then stopped.
Static domains, and driver domains without launch settings, are never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.base.errors import InvalidTarget, OperationConflict
from fleets.base.supervisor_tokens import supervisor_token_for
from fleets.core import provisioning as core
from fleets.core.policy import Policy
from fleets.core.provisioning import Phase
from fleets.core.states import DomainState, OperationKind, Provider
from fleets.drivers.cloud_placement import (
    CloudPlacementError,
    DriverSettings,
    parse_cloud_placement,
    parse_driver_settings,
)
from fleets.drivers.render import cluster_name, render_for
from fleets.drivers.sky_cli import (
    DriverError,
    SkyCli,
    SkyClusterUnknown,
    SkyCommandFailed,
    SkySecretMissing,
    classify_failure,
)
from fleets.models import Domain, Fleet, Id, Operation
from fleets.reconciler.locks import LeaseLost, lease_held
from fleets.services import provisioning as svc
from fleets.services.events import event_record
from fleets.services.operations import operation_request
from fleets.services.transitions import domain_transition

log = logging.getLogger(__name__)

# A launch whose request id never got recorded (the worker died between the claim and the
# call) is looked at again after this long.
LOST_LAUNCH_S = 120
# A provisioning pass renews its lease per domain, and one domain's `sky` calls are capped
# (status --refresh at 90 s): the lease outlasts the worst domain, matching Celery's hard limit.
PROVISION_LEASE_S = 330.0


def sky_for() -> SkyCli:
    """Return the `sky` CLI of SkyPilot's own environment (HARU_SKY_VENV)."""
    return SkyCli(venv=haru_settings().sky_venv)


@dataclass(frozen=True)
class ProvisionResult:
    fleet_id: str
    ran: bool
    busy: bool = False  # something is in flight: look again soon


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def fleet_provision_tick(
    *, fleet_id: Id, sky_factory: Callable[[], SkyCli] = sky_for, actor: str = "provisioner"
) -> ProvisionResult:
    """Run one provisioning pass over the fleet's managed domains, under the fleet's
    provisioning lock; skip (ran=False) if another pass holds it."""
    with lease_held(f"provision:{fleet_id}", ttl_s=PROVISION_LEASE_S) as lease:
        if not lease:
            return ProvisionResult(str(fleet_id), ran=False)
        fleet = Fleet.objects.filter(pk=fleet_id).first()
        if fleet is None:
            return ProvisionResult(str(fleet_id), ran=True)
        policy = Policy.resolve(fleet.policy)
        domains = [d for d in Domain.objects.filter(fleet=fleet) if svc.is_managed(d)]
        if not domains:
            return ProvisionResult(str(fleet_id), ran=True)
        sky: SkyCli | None = None
        busy = False
        for domain in domains:
            try:
                lease.check()  # renewed per domain
            except LeaseLost as exc:
                log.warning("provisioning of fleet %s stopped: %s", fleet_id, exc)
                return ProvisionResult(str(fleet_id), ran=False)
            try:
                if sky is None and _needs_sky(domain):
                    sky = sky_factory()
                busy = _step(fleet, domain, policy, sky, actor) or busy
            except Exception:  # noqa: BLE001 - one domain's trouble must not stop the others
                log.exception("provisioning of domain %s failed unexpectedly", domain)
        return ProvisionResult(str(fleet_id), ran=True, busy=busy)


def _needs_sky(domain: Domain) -> bool:
    return domain.state in (DomainState.PROVISIONING, DomainState.STOPPING)


def _step(fleet: Fleet, domain: Domain, policy: Policy, sky: SkyCli | None, actor: str) -> bool:
    """Advance one domain; return whether it is mid-flight (worth a quick second look)."""
    if domain.state == DomainState.FAILED:
        _maybe_replace(fleet, domain, policy, actor)
        return False
    if domain.state == DomainState.PROVISIONING and sky is not None:
        return _provision(domain, policy, sky, actor)
    if domain.state == DomainState.STOPPING and sky is not None:
        return _teardown(domain, policy, sky, actor)
    if domain.state in (DomainState.READY, DomainState.DEGRADED):
        if _fail_if_unreachable(fleet, domain, policy, actor):
            domain.refresh_from_db()
            _maybe_replace(fleet, domain, policy, actor)
            return False
        _settle(fleet, domain, actor)
    return False


def _failing_since(domain: Domain) -> datetime | None:
    """When the domain's heartbeat started failing (None while it answers)."""
    return domain.heartbeat_failing_since


def _fail_if_unreachable(fleet: Fleet, domain: Domain, policy: Policy, actor: str) -> bool:
    """Mark a non-active provisioned domain failed once its node has been unreachable for the
    replacement grace; return whether it moved."""
    active_id = Fleet.objects.filter(pk=fleet.id).values_list("active_domain_id", flat=True).get()
    if domain.id == active_id:
        return False  # the active is escalated by the reconcile tick, never here
    since = _failing_since(domain)
    if not core.unreachable_past_grace(failing_since=since, now=clock.now(), policy=policy):
        return False
    return domain_transition(
        domain_id=domain.id,
        to_state=DomainState.FAILED,
        from_states={domain.state},
        actor=actor,
        reason=f"unreachable since {clock.iso(since)}" if since else "unreachable",
    )


# -- replacement ------------------------------------------------------------------------------


def _was_active(fleet: Fleet, domain: Domain) -> bool:
    # The routing pointer moved off it in the last promotion that committed (its best-effort
    # steps on this very domain may still be running).
    last = (
        Operation.objects.filter(fleet=fleet, kind=OperationKind.PROMOTE, routing_committed=True)
        .order_by("-created_at")
        .values_list("source_domain_id", flat=True)
        .first()
    )
    return last == domain.id


def _maybe_replace(fleet: Fleet, domain: Domain, policy: Policy, actor: str) -> None:
    active_id = Fleet.objects.filter(pk=fleet.id).values_list("active_domain_id", flat=True).get()
    reason = core.should_replace(
        core.ReplaceCandidate(
            state=domain.state,
            managed=True,
            is_active=domain.id == active_id,
            was_active=_was_active(fleet, domain),
            failed_since=min(
                (t for t in (_failing_since(domain), domain.state_updated_at) if t), default=None
            ),
        ),
        now=clock.now(),
        policy=policy,
    )
    if reason is None:
        return
    try:
        if svc.domain_provision_begin(
            domain_id=domain.id,
            actor=actor,
            reason=reason,
            from_states=frozenset({DomainState.FAILED}),
        ):
            log.warning("domain %s failed; re-provisioning it (%s)", domain, reason)
    except svc.ProvisionRefused as exc:
        log.info("domain %s not replaced: %s", domain, exc)


# -- provisioning ----------------------------------------------------------------------------


def _fail(domain: Domain, error: dict[str, Any], actor: str) -> None:
    svc.domain_provision_fail(domain=domain, error=error, actor=actor)


def _provision(domain: Domain, policy: Policy, sky: SkyCli, actor: str) -> bool:
    status = dict(domain.driver_status or {})
    now = clock.now()
    try:
        placement = parse_cloud_placement(domain.placement)
        driver = parse_driver_settings(domain.driver, provider=domain.provider)
    except CloudPlacementError as exc:
        # The layout loader refuses these; a hand-edited row can still get here.
        _fail(domain, {"code": "invalid_placement", "message": str(exc)}, actor)
        return False
    started = _parse_time(status.get("startedAt")) or domain.state_updated_at
    if core.budget_spent(started_at=started, now=now, policy=policy):
        last = status.get("lastError") or {
            "code": "provision_timeout",
            "message": f"not up within provisionTimeoutMs ({policy.provision_timeout_ms} ms)",
        }
        name = cluster_name(domain.fleet.slug, domain.slug)
        if svc.domain_provision_fail(domain=domain, error=last, actor=actor):
            # A node still half-way through its launch would be billed for nothing; its logs go
            # with it (the driver's last error is kept on the domain).
            try:
                (sky.serve_down if domain.provider == Provider.SKYSERVE else sky.down)(name)
            except DriverError as exc:
                log.warning("domain %s failed; tearing down %s failed too: %s", domain, name, exc)
        return False
    name = cluster_name(domain.fleet.slug, domain.slug)
    serve = domain.provider == Provider.SKYSERVE
    phase = status.get("phase", "")
    candidates = placement.candidates()

    if phase in ("", Phase.REPLACE):
        try:
            (sky.serve_down if serve else sky.down)(name)
        except DriverError as exc:
            _note_error(domain, exc, actor)
            return True
        svc.domain_phase_advance(
            domain=domain,
            to_phase=Phase.LAUNCH,
            actor=actor,
            event="domain.provision.replaced",
            event_data={"cluster": name},
        )
        return True

    if phase == Phase.BACKOFF:
        if core.backoff_over(next_attempt_at=_parse_time(status.get("nextAttemptAt")), now=now):
            svc.domain_phase_advance(domain=domain, to_phase=Phase.LAUNCH, actor=actor)
            return True
        return False

    if phase == Phase.LAUNCH:
        index = int(status.get("candidate", 0)) % len(candidates)
        where = candidates[index]
        # Claim the launch first: exactly one worker wins this attempt and calls `sky`.
        claimed = svc.domain_phase_advance(
            domain=domain,
            to_phase=Phase.WAIT,
            updates={
                "launchedAt": clock.iso(now),
                "where": where.label(),
                "requestId": None,
                "launches": int(status.get("launches", 0)) + 1,
                "cluster": name,
            },
            actor=actor,
        )
        if claimed is None:
            return True
        rendered = render_for(
            provider=domain.provider,
            name=name,
            placement=placement,
            settings=driver,
            candidate=where,
        )
        # The domain's own token (derived from the master key): the node never holds the key,
        # nor another domain's token.
        token = supervisor_token_for(domain.id)
        if not token:
            # The supervisor listens beyond loopback on a cloud node and refuses to without one.
            _backoff(
                claimed,
                SkySecretMissing(
                    "HARU_SUPERVISOR_MASTER_KEY is not set: a provisioned supervisor must "
                    "require a token"
                ),
                policy,
                len(candidates),
                actor,
            )
            return False
        try:
            request_id = sky.launch(
                cluster=name,
                yaml_text=rendered.text,
                secrets={n: token for n in rendered.secret_names},
                serve=serve,
            )
        except DriverError as exc:
            _backoff(claimed, exc, policy, len(candidates), actor)
            return False
        claimed.driver_status["requestId"] = request_id
        svc.domain_phase_advance(
            domain=claimed,
            to_phase=Phase.WAIT,
            actor=actor,
            event="domain.provision.launched",
            event_data={"cluster": name, "where": where.label(), "requestId": request_id},
        )
        return True

    if phase == Phase.WAIT:
        return _wait(domain, status, driver, name, serve, policy, sky, len(candidates), actor)
    return False  # up: the heartbeat takes it from here


def _note_error(domain: Domain, exc: DriverError, actor: str) -> None:
    """Keep the latest driver error on the domain (it is what `failed` reports at the end)."""
    svc.domain_phase_advance(
        domain=domain,
        to_phase=Phase((domain.driver_status or {}).get("phase") or Phase.REPLACE),
        updates={"lastError": {**exc.as_dict(), "at": clock.iso(clock.now())}},
        actor=actor,
    )


def _backoff(domain: Domain, exc: DriverError, policy: Policy, count: int, actor: str) -> None:
    status = domain.driver_status or {}
    current = int(status.get("candidate", 0))
    nxt = core.next_candidate(current, count, retry_elsewhere=exc.retry_elsewhere)
    now = clock.now()
    error = {**exc.as_dict(), "where": status.get("where"), "at": clock.iso(now)}
    retry_at = now + timedelta(milliseconds=policy.provision_retry_backoff_ms)
    svc.domain_phase_advance(
        domain=domain,
        to_phase=Phase.BACKOFF,
        updates={
            "candidate": nxt,
            "lastError": error,
            "nextAttemptAt": clock.iso(retry_at),
        },
        actor=actor,
        event="domain.provision.launch_failed",
        event_data={**error, "nextCandidate": nxt},
    )


def _wait(
    domain: Domain,
    status: dict[str, Any],
    driver: DriverSettings,
    name: str,
    serve: bool,
    policy: Policy,
    sky: SkyCli,
    count: int,
    actor: str,
) -> bool:
    request_id = status.get("requestId")
    launched = _parse_time(status.get("launchedAt"))
    state: str | None = None
    try:
        if request_id:
            state = sky.request_status(request_id)
            if state in ("FAILED", "CANCELLED"):
                logs = sky.request_logs(request_id)
                exc = classify_failure(logs, what=f"launch {name}")
                if isinstance(exc, SkyCommandFailed) and state == "CANCELLED":
                    exc = SkyCommandFailed(f"launch {name}: request cancelled")
                if serve:
                    sky.serve_down(name)  # a failed service keeps its name taken
                _backoff(domain, exc, policy, count, actor)
                return False
        elif launched and clock.now() - launched < timedelta(seconds=LOST_LAUNCH_S):
            return True  # the claiming worker is still calling `sky launch`
        if serve:
            record = sky.serve_status(name)
            if record is None or record.status != "READY" or not record.replica_endpoints:
                if record is not None and record.status == "FAILED":
                    sky.serve_down(name)
                    _backoff(
                        domain, SkyCommandFailed(f"service {name} FAILED"), policy, count, actor
                    )
                    return False
                return True
            host = record.replica_endpoints[0].rsplit(":", 1)[0]
            supervisor_url = f"{host}:{driver.supervisor_port}"
            serving = sky.serve_endpoint(name)
        else:
            cluster = sky.status(name)
            if cluster is None:
                if request_id is None or state == "SUCCEEDED":
                    # No launch in flight and no cluster: the launch was lost; launch again.
                    _backoff(
                        domain,
                        SkyClusterUnknown(f"cluster {name} not found after launch"),
                        policy,
                        count,
                        actor,
                    )
                    return False
                return True
            if cluster.status != "UP":
                return True
            supervisor_url = sky.endpoint(name, driver.supervisor_port)
            serving = (
                sky.endpoint(name, driver.serving_port) if driver.serving_port is not None else ""
            )
    except DriverError as exc:
        _note_error(domain, exc, actor)
        return True
    svc.domain_endpoints_record(
        domain=domain, supervisor_url=supervisor_url, serving_base_url=serving, actor=actor
    )
    return True


# -- standby posture --------------------------------------------------------------------------


def _settle(fleet: Fleet, domain: Domain, actor: str) -> None:
    """Once a provisioned standby is ready, ask for its posture: models asleep, training."""
    if (domain.driver_status or {}).get("phase") != Phase.UP:
        return
    active_id = Fleet.objects.filter(pk=fleet.id).values_list("active_domain_id", flat=True).get()
    if domain.id != active_id:
        try:
            result = operation_request(
                fleet=fleet,
                kind=OperationKind.DEMOTE,
                target_domain_id=str(domain.id),
                actor=actor,
                reason="provisioned_standby",
            )
        except OperationConflict:
            return  # another operation runs; ask again next pass
        except InvalidTarget as exc:
            log.info("domain %s: standby posture not requested: %s", domain, exc)
            return
        event_record(
            fleet_id=fleet.id,
            domain_id=domain.id,
            operation_id=result.operation.id if result.operation else None,
            kind="domain.provision.standby_posture",
            actor=actor,
            data={"operationId": str(result.operation.id) if result.operation else None},
        )
    svc.domain_phase_advance(domain=domain, to_phase=Phase.SETTLED, actor=actor)


# -- teardown ---------------------------------------------------------------------------------


def _teardown(domain: Domain, policy: Policy, sky: SkyCli, actor: str) -> bool:
    name = cluster_name(domain.fleet.slug, domain.slug)
    mode = core.stop_mode(domain_mode=(domain.driver or {}).get("stopMode"), policy=policy)
    try:
        if domain.provider == Provider.SKYSERVE:
            mode = "down"  # a service has no stopped state
            sky.serve_down(name)
            gone = sky.serve_status(name) is None
        else:
            (sky.stop if mode == "stop" else sky.down)(name)
            record = sky.status(name)
            gone = record is None or (mode == "stop" and record.status == "STOPPED")
    except DriverError as exc:
        if not isinstance(exc, SkyClusterUnknown):
            _note_error(domain, exc, actor)
            return True
        gone = True  # nothing to stop
    if gone:
        svc.domain_stopped(domain=domain, mode=mode, actor=actor)
        return False
    return True
