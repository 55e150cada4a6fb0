"""Golden probes against a domain's supervisor: ask, judge against the baselines, record.

Shared by the promotion's probe step, the operator's "record baseline" action and the tick's
pass that baselines what the active serves (`active_baselines_fill`). The rules
(what matches, what a key is) are fleets.core.golden's; this module only gathers the inputs
from the database and the supervisor, outside any transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from common.adapter_manifest import EvalAnswer, engine_name, manifest_parse, store_id
from fleets.base import clock
from fleets.base.errors import InvalidTarget, SupervisorUnavailable
from fleets.core.adapter_route import AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import STORED_STATES, CopyState, distinguishing, probe_failure
from fleets.core.golden import (
    GOLDEN_SEED,
    BaselineReason,
    Judgement,
    Verdict,
    baseline_missing,
    judge,
    key_for,
    request_fingerprint,
    target_label,
)
from fleets.core.policy import Policy
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, DomainState, InferenceState
from fleets.models import (
    AdapterCopy,
    AdapterVersion,
    Domain,
    Fleet,
    GoldenBaseline,
    Id,
    ModelBinding,
    Operation,
    Slot,
)
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.reports import ProbeReport
from fleets.reconciler.supervisor.transport import CALL_CAP_S, Call
from fleets.services.adapters import copy_move
from fleets.services.baselines import (
    NewBaseline,
    baseline_probe_claim,
    baseline_record,
    baselines_for,
)

log = logging.getLogger(__name__)

# How often at most a fleet's active is probed for missing baselines: a missing key is a layout
# change or a new adapter, so once a minute is prompt enough and costs one few-token probe.
BASELINE_PROBE_INTERVAL_MS = 60_000


@dataclass(frozen=True)
class Target:
    """One thing a golden probe asks: a bound model, or one LoRA adapter of it."""

    binding: ModelBinding
    adapter: str  # "" for the base model

    @property
    def deterministic(self) -> bool:
        return self.binding.golden.get("deterministic", True) is not False


def targets_of(domain: Domain) -> list[Target]:
    """Every bound model of the domain and every LoRA adapter its layout names, by name."""
    return targets_from(ModelBinding.objects.filter(domain=domain).order_by("name"))


def targets_from(bindings: Iterable[ModelBinding]) -> list[Target]:
    """The targets of these bindings (already read, in name order), as `targets_of`."""
    out: list[Target] = []
    for binding in bindings:
        out.append(Target(binding, ""))
        out.extend(Target(binding, a) for a in binding.golden.get("adapters", ()))
    return out


def ask(
    client: SupervisorClient,
    targets: list[Target],
    policy: Policy,
    *,
    timeout: float,
    timeout_ms: int,
) -> Call[ProbeReport]:
    """Send one golden probe for every target (the supervisor probes them concurrently)."""
    models = list(dict.fromkeys(t.binding.name for t in targets))
    adapters: dict[str, list[str]] = {}
    for t in targets:
        if t.adapter:
            adapters.setdefault(t.binding.name, []).append(t.adapter)
    return client.probe(
        prompt=policy.probe_prompt,
        max_tokens=policy.probe_max_tokens,
        timeout_ms=timeout_ms,
        models=models,
        timeout=timeout,
        seed=GOLDEN_SEED,
        adapters=adapters,
    )


def judge_all(
    fleet_id: object, targets: list[Target], report: ProbeReport, policy: Policy
) -> list[tuple[Target, Judgement]]:
    """Judge every target's answer against the fleet's baselines."""
    request = request_fingerprint(policy.probe_prompt, policy.probe_max_tokens)
    if not report.golden:
        # A supervisor without `probe.golden` probed the base models only, plainly.
        targets = [t for t in targets if not t.adapter]
    answers = {t: report.result(t.binding.name, t.adapter) for t in targets}
    keys = [
        key_for(a, profile=t.binding.profile, request=request)
        for t, a in answers.items()
        if a is not None and a.ok
    ]
    recorded = baselines_for(str(fleet_id), keys)
    return [
        (
            t,
            judge(
                answers[t],
                model=t.binding.name,
                adapter=t.adapter,
                profile=t.binding.profile,
                request=request,
                deterministic=t.deterministic,
                golden=report.golden,
                baselines=recorded,
            ),
        )
        for t in targets
    ]


def unrecorded(judged: list[tuple[Target, Judgement]]) -> list[NewBaseline]:
    """The answers that become baselines: those with no baseline for their key yet."""
    return [
        NewBaseline(j.key, j.got)
        for _, j in judged
        if j.verdict == Verdict.UNRECORDED and j.key is not None and j.got is not None
    ]


def summary(judged: list[tuple[Target, Judgement]]) -> dict[str, str]:
    """What the step's event keeps: each target's verdict, by label."""
    return {
        (f"{t.binding.name}:{t.adapter}" if t.adapter else t.binding.name): j.verdict.value
        for t, j in judged
    }


# An operator's "record baseline" waits at most this long for the probe: a request thread.
RECORD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Recording:
    domain: Domain
    recorded: list[str]  # labels whose baseline was written (new, or a replaced drift)
    unchanged: list[str]  # labels that already had this very answer
    skipped: list[str]  # labels not comparable (deterministic: false)


def record_baselines(
    *,
    domain: Domain,
    policy: Policy,
    actor: str,
    client_for: Callable[[Domain], SupervisorClient],
    timeout_s: float = RECORD_TIMEOUT_S,
) -> Recording:
    """Probe a serving domain and record what it answers as the golden baselines.

    The operator's word that this domain is known good: an expected drift (an engine upgrade)
    is accepted this way, each write an event naming the answer it replaced. Refused, with
    nothing recorded, unless every bound model of the domain serves (a sleeping vLLM holds a
    request until it wakes), and when the supervisor cannot probe golden or a model fails.
    """
    targets = targets_of(domain)
    if not targets:
        raise InvalidTarget(f"domain {domain.slug} has no model bindings")
    if not domain.supervisor_url:
        raise InvalidTarget(f"domain {domain.slug} has no supervisor URL")
    slot_ids = {t.binding.slot_id for t in targets}
    idle = list(
        Slot.objects.filter(pk__in=slot_ids)
        .exclude(state=InferenceState.SERVING)
        .values_list("gpu_index", "state")
    )
    if idle:
        where = ", ".join(f"GPU {gpu} {state}" for gpu, state in idle)
        raise InvalidTarget(
            f"domain {domain.slug} is not serving ({where}): record baselines on a domain "
            "whose models are awake and known good, normally the active"
        )
    client = client_for(domain)
    result = ask(client, targets, policy, timeout=timeout_s, timeout_ms=int(timeout_s * 900))
    report = result.value
    if report is None:
        why = result.error.message if result.error is not None else "no answer"
        raise SupervisorUnavailable(f"probe of {domain.slug}: {why}")
    if not report.golden:
        raise InvalidTarget(
            f"the supervisor of {domain.slug} cannot run golden probes (feature probe.golden)"
        )
    judged = judge_all(domain.fleet_id, targets, report, policy)
    failures = [j.message for _, j in judged if j.verdict == Verdict.FAILED]
    if failures:
        raise InvalidTarget("probe failed, nothing recorded: " + "; ".join(failures))
    new = [
        NewBaseline(j.key, answer)
        for t, j in judged
        if j.key is not None and (answer := _answer_text(report, t)) is not None
    ]
    written = baseline_record(
        fleet_id=domain.fleet_id,
        domain_id=domain.id,
        baselines=new,
        reason=BaselineReason.OPERATOR,
        actor=actor,
        replace=True,
    )
    labels = [n.key.label for n in new]
    return Recording(
        domain=domain,
        recorded=written,
        unchanged=[label for label in labels if label not in written],
        skipped=[
            target_label(t.binding.name, t.adapter)
            for t, j in judged
            if j.verdict == Verdict.ANSWERED
        ],
    )


def _answer_text(report: ProbeReport, target: Target) -> str | None:
    result = report.result(target.binding.name, target.adapter)
    return result.answer if result is not None else None


def _serving_slots(domain: Domain, targets: list[Target]) -> bool:
    slot_ids = {t.binding.slot_id for t in targets}
    return not Slot.objects.filter(pk__in=slot_ids).exclude(state=InferenceState.SERVING).exists()


def missing_baselines(fleet_id: Id, targets: list[Target], policy: Policy) -> list[Target]:
    """The deterministic targets with no baseline for their profile and probe request at the
    engine version their server last reported (fleets.core.golden.baseline_missing).

    The version is the one the heartbeat keeps per binding, so an engine upgrade on the active
    is a missing key too: the active is probed for it before any standby on that version wakes
    and is judged. A binding whose supervisor never reported a version counts a baseline at any
    version, as before.
    """
    request = request_fingerprint(policy.probe_prompt, policy.probe_max_tokens)
    have = set(
        GoldenBaseline.objects.filter(fleet_id=fleet_id, request_fingerprint=request).values_list(
            "model_name", "adapter", "profile_fingerprint", "engine_version"
        )
    )
    return [
        t
        for t in targets
        if t.deterministic
        and baseline_missing(
            have,
            model=t.binding.name,
            adapter=t.adapter,
            profile=t.binding.profile,
            engine_version=t.binding.engine_version,
        )
    ]


def active_baselines_fill(
    *,
    fleet: Fleet,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    now: datetime,
    actor: str = "reconciler",
) -> list[str]:
    """Probe the serving active for the baselines it has none of, and record what it answers.

    So the first baseline of a new layout comes from what serves, never from a standby's first
    wake (which may be the very wake that broke it). Only with nothing in flight, a ready active
    whose bound models all serve, and a missing key; at most once per
    BASELINE_PROBE_INTERVAL_MS per fleet; one probe call bounded by the probe budget; outside
    any transaction. Each record is an event (`golden.baseline.recorded`, reason
    `active_serving`). Returns the labels recorded.
    """
    if fleet.active_domain_id is None:
        return []
    active = Domain.objects.filter(pk=fleet.active_domain_id).first()
    if active is None or active.state != DomainState.READY or not active.supervisor_url:
        return []
    if Operation.objects.filter(fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES).exists():
        return []  # a promotion's own probe step records what its target serves
    targets = targets_of(active)
    missing = missing_baselines(fleet.id, targets, policy)
    if not missing or not _serving_slots(active, targets):
        return []
    if not baseline_probe_claim(fleet_id=fleet.id, now=now, interval_ms=BASELINE_PROBE_INTERVAL_MS):
        return []
    timeout = min(CALL_CAP_S, policy.probe_timeout_ms / 1000)
    result = ask(
        client_for(active), missing, policy, timeout=timeout, timeout_ms=max(50, int(timeout * 900))
    )
    report = result.value
    if report is None or not report.golden:
        why = result.error.message if result.error is not None else "no golden probe support"
        log.info("fleet %s: baseline probe of the active %s: %s", fleet.slug, active.slug, why)
        return []
    judged = judge_all(fleet.id, missing, report, policy)
    return baseline_record(
        fleet_id=fleet.id,
        domain_id=active.id,
        baselines=unrecorded(judged),
        reason=BaselineReason.ACTIVE_SERVING,
        actor=actor,
        replace=False,
    )


# -- registered adapter versions (docs/adapters.md, "Load and probe", "Failover") -------------

# The promotion's probe asks each routed version this many of its evaluation prompts (those
# whose answer differs from the base model's first): enough to prove it is applied and the
# same, few enough for the outage it is part of.
PROMOTION_PROMPTS_PER_VERSION = 2


def adapter_answers(
    client: SupervisorClient,
    version: AdapterVersion,
    evals: Iterable[EvalAnswer],
    *,
    timeout: float,
) -> tuple[dict[str, str | None], str | None]:
    """Ask a loaded adapter version each of `evals`' prompts, golden (greedy, seeded), one call
    per prompt (each has its own prompt and length): prompt -> answer, and why nothing more
    could be asked, if so. A prompt the engine did not answer (a timeout, an error status) ends
    the asking with that why: no answer is not a wrong answer, and the caller decides whether
    to ask again (the registry) or to fail closed (a promotion)."""
    name = engine_name(version.name, version.version)
    answers: dict[str, str | None] = {}
    for e in evals:
        result = client.probe(
            prompt=e.prompt,
            max_tokens=e.max_tokens,
            timeout_ms=max(50, int(timeout * 900)),
            models=[version.base_model],
            timeout=timeout,
            seed=GOLDEN_SEED,
            adapters={version.base_model: [name]},
        )
        report = result.value
        if report is None:
            return answers, result.error.message if result.error else "no answer"
        if not report.golden:
            return answers, "the supervisor cannot run golden probes (feature probe.golden)"
        got = report.result(version.base_model, name)
        if got is None or not got.ok:
            said = (got.error if got is not None else None) or "not in the probe's report"
            return answers, f"no answer to eval prompt {e.prompt[:40]!r}: {said}"
        answers[e.prompt] = got.answer
    return answers, None


def routed_adapters_check(
    *,
    fleet_id: Id,
    domain: Domain,
    client: SupervisorClient,
    timeout: float,
    actor: str,
) -> list[str]:
    """Prove `domain` serves every adapter version the fleet's routes name: its copy stored
    there, loaded (asked again: the supervisor loads what it remembers on wake, and a load of
    one already loaded is a no-op), and answering its evaluation prompts as its manifest says
    the first time, as its own baseline after. Return the problems (none: each copy is
    `probed`, its baseline kept). Outside any transaction."""
    fleet = Fleet.objects.filter(pk=fleet_id).only("adapter_routes").first()
    try:
        routes = adapter_routes_parse(fleet.adapter_routes if fleet else None)
    except AdapterRouteInvalid as exc:
        return [f"adapter routes unreadable: {exc}"]
    if routes and not client.takes_adapters():
        return [f"the supervisor of {domain.slug} serves no adapters (feature adapters)"]
    problems: list[str] = []
    passed: list[tuple[AdapterCopy, dict[str, str | None]]] = []
    for name, route in sorted(routes.items()):
        for number in route.versions():
            label = engine_name(name, number)
            version = AdapterVersion.objects.filter(
                fleet_id=fleet_id, name=name, version=number
            ).first()
            copy = (
                AdapterCopy.objects.filter(adapter=version, domain=domain).first()
                if version is not None
                else None
            )
            if version is None or copy is None or copy.state not in STORED_STATES:
                problems.append(f"adapter {label} is not stored on {domain.slug}")
                continue
            load = client.adapter_load(
                model=version.base_model,
                name=label,
                store_id=store_id(version.digest),
                timeout=timeout,
            )
            if load.value is None or not load.value.loaded:
                said = load.error.message if load.error else "the server is not awake"
                problems.append(f"adapter {label} not loaded on {domain.slug}: {said}")
                continue
            evals = manifest_parse(version.manifest).eval
            asked = (distinguishing(evals) or list(evals))[:PROMOTION_PROMPTS_PER_VERSION]
            answers, trouble = adapter_answers(client, version, asked, timeout=timeout)
            wrong = trouble or probe_failure(asked, answers, copy.baseline or {})
            if wrong is not None:
                problems.append(f"adapter {label} on {domain.slug}: {wrong}")
                continue
            passed.append((copy, answers))
    if problems:
        return problems
    for copy, answers in passed:
        baseline = copy.baseline or {k: a for k, a in answers.items() if a is not None}
        copy_move(
            copy=copy,
            to_state=CopyState.PROBED,
            actor=actor,
            baseline=baseline,
            probed_at=clock.now(),
            loaded_at=copy.loaded_at or clock.now(),
        )
    return []
