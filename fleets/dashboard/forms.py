"""Forms of the dashboard's action buttons (promote, demote, reconcile, cancel, drill, ...)."""

from __future__ import annotations

from django import forms

ACTIONS = (
    "promote",
    "demote",
    "reconcile",
    "provision",
    "stop",
    "cancel",
    "drill",
    "baseline",
    "rollout-pause",
    "rollout-resume",
    "rollout-promote",
    "rollout-abort",
)
ROLLOUT_ACTIONS = ("rollout-pause", "rollout-resume", "rollout-promote", "rollout-abort")


class ActionForm(forms.Form):
    """One confirmed action. `confirm` is set by the confirmation dialog (or page)."""

    target = forms.CharField(max_length=100, required=False)
    # A drill's mode (check or round_trip); the operation service checks the value.
    mode = forms.CharField(max_length=16, required=False)
    confirm = forms.BooleanField(required=False)

    def __init__(self, *args, action: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.action = action

    def clean(self):
        data = super().clean() or {}
        if self.action in ("promote", "demote", "provision", "stop") and not data.get("target"):
            self.add_error("target", "choose the domain to act on")
        if self.action == "cancel" and not data.get("target"):
            self.add_error("target", "name the operation to cancel")
        if self.action in ROLLOUT_ACTIONS and not data.get("target"):
            self.add_error("target", "name the rollout")
        return data
