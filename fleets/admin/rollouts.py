"""The admin's rollouts: list and detail, read-only (every field moves by compare-and-swap in
fleets/services/rollouts.py), with the operator's actions (pause, resume, promote early,
abort) behind a confirmation page, calling the same services as the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin

from fleets.admin.actions import confirmed_action, pretty_json
from fleets.admin.history import _ReadOnlyAdmin
from fleets.base.errors import ServiceError
from fleets.dashboard.actions import ActionResult
from fleets.models import Rollout
from fleets.services.rollouts import (
    rollout_abort,
    rollout_pause,
    rollout_promote_early,
    rollout_resume,
)


def _run(service: Callable[..., Rollout], done: str) -> Callable[[Any, str], ActionResult]:
    """Call one operator action as the API does; report its outcome as an admin message."""

    def run(rollout: Rollout, actor: str) -> ActionResult:
        try:
            moved = service(fleet_id=rollout.fleet_id, rollout_id=str(rollout.id), actor=actor)
        except ServiceError as exc:
            return ActionResult(False, exc.status, exc.code, exc.message)
        return ActionResult(True, 200, moved.state, f"{done} (now {moved.state})")

    return run


def _label(rollout: Rollout) -> str:
    return f"{rollout.fleet.slug}/{rollout.model} {str(rollout.id)[:8]}"


@admin.register(Rollout)
class RolloutAdmin(_ReadOnlyAdmin):
    list_display = (
        "short_id",
        "fleet",
        "model",
        "state",
        "weight_percent",
        "step_index",
        "pinned",
        "started_by",
        "created_at",
        "finished_at",
    )
    list_filter = ("fleet", "state", "pinned", ("created_at", admin.DateFieldListFilter))
    search_fields = ("id", "model", "fleet__slug", "started_by", "why")
    date_hierarchy = "created_at"
    list_select_related = ("fleet",)
    readonly_fields = ("plan_json", "progress_json", "previous_json")
    exclude = ("candidate", "steps", "gates", "progress", "previous")
    actions = [
        confirmed_action(
            "pause_rollouts",
            description="Pause (and pin) the selected rollouts",
            title="Pause rollouts",
            text="Pause these rollouts? The weight stays where it is, no step is taken, and no "
            "automatic rollback overrides the pause until they are resumed:",
            run=_run(rollout_pause, "paused and pinned"),
            label=_label,
            related=("fleet",),
        ),
        confirmed_action(
            "resume_rollouts",
            description="Resume the selected paused rollouts",
            title="Resume rollouts",
            text="Resume these rollouts where they were paused (the step's dwell starts again):",
            run=_run(rollout_resume, "resumed"),
            label=_label,
            related=("fleet",),
        ),
        confirmed_action(
            "promote_rollouts",
            description="Promote the selected rollouts early (skip the remaining steps)",
            title="Promote rollouts early",
            text="Skip the remaining steps of these rollouts? The planned promotion of each "
            "candidate standby starts at once:",
            run=_run(rollout_promote_early, "promotion started"),
            label=_label,
            related=("fleet",),
        ),
        confirmed_action(
            "abort_rollouts",
            description="Abort the selected rollouts (roll back)",
            title="Abort rollouts",
            text="Abort these rollouts? Each candidate's weight goes to 0 in one "
            "compare-and-swap, then the standby's old version and posture are restored:",
            run=_run(rollout_abort, "rolling back"),
            label=_label,
            related=("fleet",),
        ),
    ]

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return str(obj.id)[:8]

    @admin.display(description="weight", ordering="weight_permille")
    def weight_percent(self, obj):
        return f"{obj.weight_permille / 10:g} %"

    @admin.display(description="candidate, steps and gates")
    def plan_json(self, obj):
        return pretty_json(
            {
                "candidate": obj.candidate,
                "swapMode": obj.swap_mode,
                "steps": obj.steps,
                "gates": obj.gates,
            }
        )

    @admin.display(description="progress")
    def progress_json(self, obj):
        return pretty_json(obj.progress)

    @admin.display(description="what each domain served before")
    def previous_json(self, obj):
        return pretty_json(obj.previous)
