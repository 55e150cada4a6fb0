"""The provisioning tick: launch, watch and tear down driver-backed domains through their driver.

A domain's `provider` names its driver in `fleets.drivers.registry`; the pass drives every
driver through the same phases (`fleets.core.provisioning`), retries, deadlines and events.
Runs beside the reconcile tick (the loop and Celery call it after `tick_run`), never inside a
request and never inside a transaction: every driver call happens first, then its outcome is
written with one conditional UPDATE (`fleets.services.provisioning`). A fleet's provisioning
ticks do not overlap (their own lock, so slow cloud calls never hold up failover), and every
write is guarded by the domain's attempt counter, so a second worker can only lose a race.

Per managed domain:
- failed, not active, past `replaceFailedGraceMs`, policy allows: begin a replacement;
- provisioning: replace (remove what an earlier life left), launch on the current candidate,
  describe until the host is up, record its URLs; a failed launch backs off and moves to the
  next candidate when the driver says the failure was about the place; past
  `provisionTimeoutMs` the domain goes failed with the driver's last error;
- ready standby in phase up: request a demotion (sleep, then training), then settle;
- stopping: stop or down, confirmed by the driver, then stopped.
Static domains, and driver domains without launch settings, are never touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from common.tls_identity import generate
from fleets.base import clock
from fleets.base.conf import haru
from fleets.base.errors import InvalidTarget, OperationConflict
from fleets.base.supervisor_tokens import supervisor_token_for
from fleets.core import provisioning as core
from fleets.core.policy import Policy
from fleets.core.provisioning import Phase
from fleets.core.states import DomainState, OperationKind
from fleets.core.timestamps import parse_iso
from fleets.drivers.base import (
    DriverError,
    DriverSettingsError,
    Progress,
    ProvisioningDriver,
    SettingsRefused,
    Target,
)
from fleets.drivers.registry import DriverRegistry, default_registry
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
# A provisioning pass renews its lease per domain, and one domain's driver calls are capped
# (each at most MAX_DRIVER_CALL_S, two per domain at worst): the lease outlasts the worst
# domain, matching Celery's hard limit.
PROVISION_LEASE_S = 330.0


def drivers_for() -> DriverRegistry:
    """Return the built-in drivers, configured from Haru's settings."""
    return default_registry(config=haru())


@dataclass(frozen=True)
class ProvisionResult:
    fleet_id: str
    ran: bool
    busy: bool = False  # something is in flight: look again soon


def fleet_provision_tick(
    *, fleet_id: Id, drivers: DriverRegistry | None = None, actor: str = "provisioner"
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
        registry = drivers or drivers_for()
        busy = False
        for domain in domains:
            try:
                lease.check()  # renewed per domain
            except LeaseLost as exc:
                log.warning("provisioning of fleet %s stopped: %s", fleet_id, exc)
                return ProvisionResult(str(fleet_id), ran=False)
            try:
                busy = _step(fleet, domain, policy, registry.get(domain.provider), actor) or busy
            except Exception:  # noqa: BLE001 - one domain's trouble must not stop the others
                log.exception("provisioning of domain %s failed unexpectedly", domain)
        return ProvisionResult(str(fleet_id), ran=True, busy=busy)


def _step(
    fleet: Fleet, domain: Domain, policy: Policy, driver: ProvisioningDriver, actor: str
) -> bool:
    """Advance one domain; return whether it is mid-flight (worth a quick second look)."""
    if domain.state == DomainState.FAILED:
        _maybe_replace(fleet, domain, policy, actor)
        return False
    if domain.state in (DomainState.PROVISIONING, DomainState.STOPPING):
        try:
            work = _Work(domain, policy, driver, _target(domain, driver), actor)
        except SettingsRefused as exc:
            _fail(domain, exc, actor)
            return False
        return (_provision if domain.state == DomainState.PROVISIONING else _teardown)(work)
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


@dataclass(frozen=True)
class _Work:
    """One managed domain in one pass, with its driver and validated settings."""

    domain: Domain
    policy: Policy
    driver: ProvisioningDriver
    target: Target
    actor: str

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.domain.driver_status or {})


def _target(domain: Domain, driver: ProvisioningDriver) -> Target:
    """Validate the domain's stored settings with its driver; raise SettingsRefused."""
    try:
        parsed = driver.validate(placement=domain.placement, settings=domain.driver)
    except DriverSettingsError as exc:
        raise SettingsRefused(str(exc)) from None
    fleet_slug = domain.fleet.slug
    return Target(
        fleet_slug=fleet_slug,
        domain_slug=domain.slug,
        domain_id=str(domain.id),
        name=driver.resource_name(fleet_slug=fleet_slug, domain_slug=domain.slug),
        settings=parsed,
    )


def _fail(domain: Domain, exc: DriverError, actor: str) -> None:
    # The layout loader refuses bad settings; a hand-edited row can still get here.
    if domain.state == DomainState.STOPPING:
        _note_error(domain, exc, actor)
    else:
        svc.domain_provision_fail(domain=domain, error=exc.as_dict(), actor=actor)


def _provision(work: _Work) -> bool:
    started = parse_iso(work.status.get("startedAt")) or work.domain.state_updated_at
    if core.budget_spent(started_at=started, now=clock.now(), policy=work.policy):
        _give_up(work)
        return False
    phase = work.status.get("phase", "")
    if phase in ("", Phase.REPLACE):
        return _replace(work)
    if phase == Phase.BACKOFF:
        next_at = parse_iso(work.status.get("nextAttemptAt"))
        if core.backoff_over(next_attempt_at=next_at, now=clock.now()):
            svc.domain_phase_advance(domain=work.domain, to_phase=Phase.LAUNCH, actor=work.actor)
            return True
        return False
    if phase == Phase.LAUNCH:
        return _launch(work)
    if phase == Phase.WAIT:
        return _wait(work)
    return False  # up: the heartbeat takes it from here


def _give_up(work: _Work) -> None:
    """Past `provisionTimeoutMs`: fail the domain with the driver's last error, then remove
    what the launches left (a host still half-way through its launch is billed for nothing)."""
    last = work.status.get("lastError") or {
        "code": "provision_timeout",
        "message": f"not up within provisionTimeoutMs ({work.policy.provision_timeout_ms} ms)",
    }
    if svc.domain_provision_fail(domain=work.domain, error=last, actor=work.actor):
        try:
            work.driver.remove(work.target)
        except DriverError as exc:
            name = work.target.name
            log.warning("domain %s failed; removing %s failed too: %s", work.domain, name, exc)


def _replace(work: _Work) -> bool:
    """Remove whatever an earlier life of the domain left, then launch."""
    try:
        work.driver.remove(work.target)
    except DriverError as exc:
        _note_error(work.domain, exc, work.actor)
        return True
    svc.domain_phase_advance(
        domain=work.domain,
        to_phase=Phase.LAUNCH,
        actor=work.actor,
        event="domain.provision.replaced",
        event_data={"cluster": work.target.name},
    )
    return True


def _launch(work: _Work) -> bool:
    status, name = work.status, work.target.name
    candidates = work.driver.candidates(work.target.settings)
    index = int(status.get("candidate", 0)) % len(candidates)
    now = clock.now()
    # The host's TLS identity, made here so its pin is recorded with the claim, before the
    # host exists: the control plane never trusts a certificate it learned from the host.
    # Its key lives in this process until the driver hands it over, never in the database.
    tls = generate([name], now=now) if work.driver.ships_tls else None
    # Claim the launch first: exactly one worker wins this attempt and calls the driver.
    claimed = svc.domain_phase_advance(
        domain=work.domain,
        to_phase=Phase.WAIT,
        updates={
            "launchedAt": clock.iso(now),
            "where": candidates[index],
            "requestId": None,
            "launches": int(status.get("launches", 0)) + 1,
            "cluster": name,
            "tlsFingerprint": tls.fingerprint if tls is not None else None,
        },
        actor=work.actor,
    )
    if claimed is None:
        return True
    work = replace(work, domain=claimed)
    try:
        # The domain's own token (derived from the master key): the host never holds the key,
        # nor another domain's token.
        token = supervisor_token_for(claimed.id)
        handle = work.driver.launch(work.target, candidate=index, token=token, tls=tls)
    except DriverError as exc:
        _backoff(work, exc)
        return False
    claimed.driver_status["requestId"] = handle
    svc.domain_phase_advance(
        domain=claimed,
        to_phase=Phase.WAIT,
        actor=work.actor,
        event="domain.provision.launched",
        event_data={
            "cluster": name,
            "where": candidates[index],
            "requestId": handle,
            **({"tlsFingerprint": tls.fingerprint} if tls is not None else {}),
        },
    )
    return True


def _note_error(domain: Domain, exc: DriverError, actor: str) -> None:
    """Keep the latest driver error on the domain (it is what `failed` reports at the end)."""
    svc.domain_phase_advance(
        domain=domain,
        to_phase=Phase((domain.driver_status or {}).get("phase") or Phase.REPLACE),
        updates={"lastError": {**exc.as_dict(), "at": clock.iso(clock.now())}},
        actor=actor,
    )


def _backoff(work: _Work, exc: DriverError) -> None:
    status = work.status
    count = len(work.driver.candidates(work.target.settings))
    nxt = core.next_candidate(
        int(status.get("candidate", 0)), count, retry_elsewhere=exc.retry_elsewhere
    )
    now = clock.now()
    error = {**exc.as_dict(), "where": status.get("where"), "at": clock.iso(now)}
    retry_at = now + timedelta(milliseconds=work.policy.provision_retry_backoff_ms)
    svc.domain_phase_advance(
        domain=work.domain,
        to_phase=Phase.BACKOFF,
        updates={"candidate": nxt, "lastError": error, "nextAttemptAt": clock.iso(retry_at)},
        actor=work.actor,
        event="domain.provision.launch_failed",
        event_data={**error, "nextCandidate": nxt},
    )


def _wait(work: _Work) -> bool:
    handle = work.status.get("requestId")
    launched = parse_iso(work.status.get("launchedAt"))
    if not handle and launched and clock.now() - launched < timedelta(seconds=LOST_LAUNCH_S):
        return True  # the claiming worker is still calling the driver's launch
    try:
        found = work.driver.describe(work.target, handle=handle)
    except DriverError as exc:
        _note_error(work.domain, exc, work.actor)
        return True
    if found.progress == Progress.FAILED:
        _backoff(work, found.error or DriverError("the launch failed"))
        return False
    if found.progress == Progress.UP:
        svc.domain_endpoints_record(
            domain=work.domain,
            supervisor_url=found.supervisor_url,
            serving_base_url=found.serving_base_url,
            actor=work.actor,
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


def _teardown(work: _Work) -> bool:
    domain = work.domain
    mode = core.stop_mode(domain_mode=(domain.driver or {}).get("stopMode"), policy=work.policy)
    try:
        done = work.driver.stop(work.target, mode=mode)
    except DriverError as exc:
        _note_error(domain, exc, work.actor)
        return True
    if done.gone:
        svc.domain_stopped(domain=domain, mode=done.mode, actor=work.actor)
        return False
    return True
