"""Every operation step is named once: `fleets.core.states.Step`.

A step spelled as a string literal elsewhere is a place a new or renamed step would be missed;
the shipped code names steps by the enum's members. Tests may spell them where they check the
stored values or the wire.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from fleets.core.states import (
    BACK_LEG,
    DEMOTE_STEPS,
    DRILL_STEPS,
    PROMOTE_STEPS,
    ROUND_TRIP_DRILL_STEPS,
    Step,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fleets", "haru", "common", "supervisor")
HOME = "fleets/core/states.py"
STEP_VALUES = frozenset(step.value for step in Step)
# Words that are also the supervisor's actions and endpoints (`/v1/vllm/wake`, `/v1/probe`),
# the policy's `probe` object and event kinds: there a literal is not a step. It counts as one
# where it is used as one: compared with a step, passed as `step=`, or listed with other steps.
SHARED_WORDS = frozenset({"wake", "sleep", "probe"})


def _sources(suffixes: tuple[str, ...]) -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in suffixes and "migrations" not in path.parts:
                yield path


def _is_step_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in STEP_VALUES


def _is_step_member(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in Step.__members__


def _names_a_step(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "step" in text.lower() or _is_step_member(node) or _is_step_constant(node)


def _step_literals(tree: ast.AST) -> Iterator[str]:
    """Yield each string constant in `tree` that spells a step, used as one."""
    for node in ast.walk(tree):
        if _is_step_constant(node):
            assert isinstance(node, ast.Constant)
            if node.value not in SHARED_WORDS:
                yield node.value
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for side in sides:
                others = [s for s in sides if s is not side]
                if _is_step_constant(side) and any(_names_a_step(o) for o in others):
                    yield side.value  # type: ignore[attr-defined]
        elif isinstance(node, ast.keyword) and node.arg and "step" in node.arg:
            if _is_step_constant(node.value):
                yield node.value.value  # type: ignore[attr-defined]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            items = [item for item in items if item is not None]
            steps = [i for i in items if _is_step_constant(i) or _is_step_member(i)]
            # The supervisor's own {"sleep": ..., "wake": ...} is its actions, not steps.
            if any(_is_step_member(i) or i.value not in SHARED_WORDS for i in steps):  # type: ignore[attr-defined]
                yield from (i.value for i in steps if isinstance(i, ast.Constant))


def _modules_spelling_steps() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in _sources((".py",)):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for value in _step_literals(tree):
            found.setdefault(path.relative_to(ROOT).as_posix(), set()).add(value)
    quoted = re.compile(
        r"""["']({})["']""".format("|".join(sorted(STEP_VALUES - SHARED_WORDS, key=len)[::-1]))
    )
    for path in _sources((".html", ".js", ".json", ".txt")):
        for match in quoted.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(path.relative_to(ROOT).as_posix(), set()).add(match.group(1))
    return found


def test_a_step_name_is_spelled_as_a_literal_in_one_module_only():
    found = _modules_spelling_steps()
    assert set(found) == {HOME}, {k: sorted(v) for k, v in found.items() if k != HOME}


def test_the_finder_sees_a_step_spelled_as_a_step():
    # The check above would pass vacuously if it could not see these.
    spelled = """
if step == "wake": pass
Event.objects.filter(step="sleep")
PLAN = ("probe", Step.SWITCH_ROUTE)
EXECUTORS = {"switch_route": run}
"""
    assert set(_step_literals(ast.parse(spelled))) == {"wake", "sleep", "probe", "switch_route"}
    other = """
client.call("wake", "/v1/vllm/wake")
source = "probe"
if "sleep" in text: pass
ACTIONS = {"sleep": self.sleep, "wake": self.wake}
"""
    assert list(_step_literals(ast.parse(other))) == []


def test_every_plan_is_made_of_steps_and_a_back_leg_mirrors_the_promotion():
    for plan in (PROMOTE_STEPS, DEMOTE_STEPS, DRILL_STEPS, ROUND_TRIP_DRILL_STEPS):
        assert all(isinstance(step, Step) for step in plan)
    back = [step for step in Step if step.startswith(BACK_LEG)]
    assert [Step(step.removeprefix(BACK_LEG)) for step in back] == list(PROMOTE_STEPS)
    # Operation.current_step and Event.step are CharField(max_length=32).
    assert max(len(step) for step in Step) <= 32


def test_every_step_the_chart_draws_has_its_colour():
    # fleets/dashboard/chart.py draws the promotion's steps, each by its CSS class `s-<step>`.
    css = (ROOT / "haru" / "static" / "haru" / "dashboard.css").read_text(encoding="utf-8")
    missing = [step for step in PROMOTE_STEPS if f".s-{step} {{" not in css]
    assert missing == []
