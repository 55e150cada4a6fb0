"""The rollout's pure core: the plan's checks, the state table, the gates, the answer checks."""

from __future__ import annotations

import pytest

from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.rollout import (
    FINAL_ROLLOUT_STATES,
    IN_FLIGHT_ROLLOUT_STATES,
    MAX_CHECKS,
    MAX_STEPS,
    AnswerCheck,
    CandidateKind,
    GateVerdict,
    MatchKind,
    RolloutInvalid,
    RolloutState,
    RolloutTransitionRefused,
    check_rollout_transition,
    checks_judge,
    gate_decide,
    gates_parse,
    plan_parse,
    steps_parse,
)

PROFILE = {"engine": "vllm", "modelPath": "/models/qwen-v2"}


def body(**over):
    out = {
        "model": "qwen-small",
        "candidate": {
            "kind": "new-weights",
            "profile": PROFILE,
            "checks": [{"prompt": "2+2?", "expect": "4"}],
        },
        "steps": [{"weight": 1, "dwellS": 60}, {"weight": 50, "dwellS": 60}, {"weight": 100}],
    }
    out.update(over)
    return out


def test_a_whole_plan_reads_with_its_defaults():
    plan = plan_parse(body())
    assert plan.model == "qwen-small"
    assert plan.swap_mode.value == "new-port"
    assert [s.weight for s in plan.steps] == [1, 50, 100]
    assert plan.gates.min_samples == 50
    assert plan.candidate.checks[0] == AnswerCheck("2+2?", "4", MatchKind.SUBSTRING, 32)


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([], "steps"),
        (
            [{"weight": 5, "dwellS": 60}, {"weight": 5, "dwellS": 60}, {"weight": 100}],
            "steps[1].weight",
        ),
        (
            [{"weight": 50, "dwellS": 60}, {"weight": 10, "dwellS": 60}, {"weight": 100}],
            "steps[1].weight",
        ),
        ([{"weight": 0, "dwellS": 60}, {"weight": 100}], "steps[0].weight"),
        ([{"weight": 101, "dwellS": 60}], "steps[0].weight"),
        ([{"weight": 5, "dwellS": 60}, {"weight": 50}], "steps[1].weight"),
        ([{"weight": 5, "dwellS": 1}, {"weight": 100}], "steps[0].dwellS"),
        ([{"weight": 5}, {"weight": 100}], "steps[0].dwellS"),
        ([{"weight": 5, "dwellS": 10**9}, {"weight": 100}], "steps[0].dwellS"),
        ([{"weight": 5, "dwellS": 60, "x": 1}, {"weight": 100}], "steps[0].x"),
        ([{"weight": i + 1, "dwellS": 10} for i in range(MAX_STEPS)] + [{"weight": 100}], "steps"),
    ],
)
def test_a_bad_step_plan_is_refused_naming_the_field(steps, field):
    with pytest.raises(RolloutInvalid) as refused:
        steps_parse(steps)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"model": "Qwen"}, "model"),
        ({"swapMode": "sideways"}, "swapMode"),
        ({"stickyHeader": "X Session"}, "stickyHeader"),
        ({"extra": 1}, "extra"),
        ({"candidate": {"kind": "other", "profile": PROFILE}}, "candidate.kind"),
        ({"candidate": {"kind": "same-weights", "profile": {}}}, "candidate.profile"),
        ({"candidate": {"kind": "new-weights", "profile": PROFILE}}, "candidate.checks"),
        (
            {"candidate": {"kind": "new-weights", "profile": PROFILE, "checks": [{"prompt": "p"}]}},
            "candidate.checks[0].expect",
        ),
        (
            {
                "candidate": {
                    "kind": "new-weights",
                    "profile": PROFILE,
                    "checks": [{"prompt": "p", "expect": "(", "match": "regex"}],
                }
            },
            "candidate.checks[0].expect",
        ),
        (
            {
                "candidate": {
                    "kind": "same-weights",
                    "profile": PROFILE,
                    "checks": [{"prompt": "p"}] * (MAX_CHECKS + 1),
                }
            },
            "candidate.checks",
        ),
        (
            {"candidate": {"kind": "same-weights", "profile": {"engine": "x" * 20_000}}},
            "candidate.profile",
        ),
        ({"gates": {"ttftP95Ratio": 0.5}}, "gates.ttftP95Ratio"),
        ({"gates": {"minSamples": 0}}, "gates.minSamples"),
        ({"gates": {"windowS": True}}, "gates.windowS"),
        ({"gates": {"nope": 1}}, "gates.nope"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(over, field):
    with pytest.raises(RolloutInvalid) as refused:
        plan_parse(body(**over))
    assert refused.value.field == field


def test_same_weights_needs_no_expected_content():
    plan = plan_parse(
        body(candidate={"kind": "same-weights", "profile": PROFILE, "checks": [{"prompt": "hi"}]})
    )
    assert plan.candidate.kind == CandidateKind.SAME_WEIGHTS
    assert plan.candidate.checks[0].expect == ""


def test_the_state_table():
    check_rollout_transition("pending", "preparing")
    check_rollout_transition("stepping", "rolling_back")
    check_rollout_transition("paused", "stepping")
    for final in FINAL_ROLLOUT_STATES:
        with pytest.raises(RolloutTransitionRefused):
            check_rollout_transition(final, "stepping")
    with pytest.raises(RolloutTransitionRefused):
        check_rollout_transition("pending", "stepping")  # never without the checks
    with pytest.raises(RolloutTransitionRefused):
        check_rollout_transition("checking", "succeeded")
    assert not IN_FLIGHT_ROLLOUT_STATES & FINAL_ROLLOUT_STATES
    assert set(RolloutState) == IN_FLIGHT_ROLLOUT_STATES | FINAL_ROLLOUT_STATES


GATES = gates_parse({"minSamples": 20, "ttftP95Ratio": 1.5, "maxErrorRateDelta": 0.02})


def arm(requests=100, errors=0, ttft=100.0, itl=None, itl_samples=0):
    return ArmWindow(
        requests=requests,
        errors=errors,
        ttft_samples=requests,
        ttft_p95_ms=ttft,
        itl_samples=itl_samples,
        itl_p95_ms=itl,
    )


def test_the_gates_wait_for_samples_on_both_arms():
    decision = gate_decide({Arm.STABLE: arm(), Arm.CANDIDATE: arm(requests=5)}, GATES)
    assert decision.verdict == GateVerdict.WAIT
    assert "candidate has 5/20" in decision.reason
    assert gate_decide({}, GATES).verdict == GateVerdict.WAIT


def test_a_candidate_twice_as_slow_to_first_token_fails():
    decision = gate_decide({Arm.STABLE: arm(ttft=100), Arm.CANDIDATE: arm(ttft=200)}, GATES)
    assert decision.verdict == GateVerdict.FAIL
    assert "time to first token" in decision.reason
    assert decision.figures["ttftP95Ratio"] == 2.0


def test_errors_are_compared_with_the_stable_arm_not_with_zero():
    same = gate_decide({Arm.STABLE: arm(errors=5), Arm.CANDIDATE: arm(errors=6)}, GATES)
    assert same.verdict == GateVerdict.PASS
    worse = gate_decide({Arm.STABLE: arm(errors=0), Arm.CANDIDATE: arm(errors=10)}, GATES)
    assert worse.verdict == GateVerdict.FAIL
    assert "error rate" in worse.reason


def test_inter_token_latency_is_judged_only_where_both_arms_stream():
    slow = arm(itl=50, itl_samples=100)
    unjudged = gate_decide({Arm.STABLE: arm(), Arm.CANDIDATE: arm(itl=500, itl_samples=5)}, GATES)
    assert unjudged.verdict == GateVerdict.PASS
    judged = gate_decide({Arm.STABLE: slow, Arm.CANDIDATE: arm(itl=200, itl_samples=100)}, GATES)
    assert judged.verdict == GateVerdict.FAIL
    assert "inter-token" in judged.reason


def test_a_healthy_candidate_passes():
    decision = gate_decide({Arm.STABLE: arm(ttft=100), Arm.CANDIDATE: arm(ttft=120)}, GATES)
    assert decision.verdict == GateVerdict.PASS


def test_same_weights_compare_with_the_stable_arm_never_the_candidates_own_answer():
    checks = [AnswerCheck("hi"), AnswerCheck("2+2?")]
    ok = checks_judge(CandidateKind.SAME_WEIGHTS, checks, ["hello", "4"], ["hello", "4"])
    assert ok.passed
    differs = checks_judge(CandidateKind.SAME_WEIGHTS, checks, ["hello", "5"], ["hello", "4"])
    assert not differs.passed and "stable arm '4'" in differs.message()
    # Without the stable arm's answers nothing is proven, whatever the candidate says.
    assert not checks_judge(CandidateKind.SAME_WEIGHTS, checks, ["hello", "4"], None).passed


def test_new_weights_need_their_expected_content():
    checks = [
        AnswerCheck("2+2?", "4"),
        AnswerCheck("capital of France?", r"\bParis\b", MatchKind.REGEX),
    ]
    assert checks_judge(CandidateKind.NEW_WEIGHTS, checks, ["It is 4.", "Paris."]).passed
    failed = checks_judge(CandidateKind.NEW_WEIGHTS, checks, ["It is 4.", "Lyon"])
    assert not failed.passed and "check 1" in failed.message()
    assert not checks_judge(CandidateKind.NEW_WEIGHTS, checks, ["It is 4.", None]).passed
