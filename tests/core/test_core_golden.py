"""The golden-probe judge: what matches, what a key is, what falls back to "it answers"."""

from __future__ import annotations

from fleets.core.golden import (
    GoldenKey,
    ProbeAnswer,
    Recorded,
    Verdict,
    answer_sha256,
    baseline_missing,
    judge,
    profile_fingerprint,
    request_fingerprint,
)

PROFILE = {"engine": "vllm", "modelPath": "/models/qwen", "tensorParallel": 2}
REQUEST = request_fingerprint("ping", 4)


def answer(text: str | None = "Hello there", *, ok: bool = True, adapter: str = "", engine="0.9"):
    return ProbeAnswer("qwen", adapter, ok, None if ok else "HTTP 500: boom", text, engine)


def key(adapter: str = "", engine: str = "0.9", profile=PROFILE) -> GoldenKey:
    return GoldenKey("qwen", adapter, profile_fingerprint(profile), engine, REQUEST)


def run(a, *, baselines, deterministic=True, golden=True, adapter="", profile=PROFILE):
    return judge(
        a,
        model="qwen",
        adapter=adapter,
        profile=profile,
        request=REQUEST,
        deterministic=deterministic,
        golden=golden,
        baselines=baselines,
    )


def recorded(text: str) -> Recorded:
    return Recorded(answer_sha256(text), text)


def test_the_same_answer_matches_and_another_one_is_a_mismatch_quoting_both():
    baselines = {key(): recorded("Hello there")}
    assert run(answer(), baselines=baselines).verdict == Verdict.MATCH
    j = run(answer("Goodbye"), baselines=baselines)
    assert j.verdict == Verdict.MISMATCH and not j.passed
    assert j.message == 'qwen: expected "Hello there", got "Goodbye"'


def test_an_adapter_is_judged_against_its_own_baseline_and_named_in_the_message():
    baselines = {key(): recorded("base"), key("sql"): recorded("base with sql")}
    j = run(answer("base", adapter="sql"), baselines=baselines, adapter="sql")
    assert j.verdict == Verdict.MISMATCH
    assert j.message.startswith("qwen (adapter sql): expected")


def test_a_changed_profile_or_engine_version_is_another_key_with_no_baseline_yet():
    baselines = {key(): recorded("Hello there")}
    upgraded = run(answer("New engine words", engine="1.0"), baselines=baselines)
    assert upgraded.verdict == Verdict.UNRECORDED and upgraded.passed
    assert upgraded.key == key(engine="1.0") and upgraded.got == "New engine words"
    reprofiled = {**PROFILE, "tensorParallel": 4}
    j = run(answer("Other"), baselines=baselines, profile=reprofiled)
    assert j.verdict == Verdict.UNRECORDED and j.key == key(profile=reprofiled)


def test_non_deterministic_or_plain_probes_only_have_to_answer():
    baselines = {key(): recorded("Hello there")}
    assert run(answer("x"), baselines=baselines, deterministic=False).verdict == Verdict.ANSWERED
    assert run(answer("x"), baselines=baselines, golden=False).verdict == Verdict.ANSWERED


def test_no_answer_fails_whatever_the_baseline():
    assert run(None, baselines={}).verdict == Verdict.FAILED
    j = run(answer(None, ok=False), baselines={}, deterministic=False)
    assert j.verdict == Verdict.FAILED and j.message == "qwen: HTTP 500: boom"


def test_fingerprints_are_stable_and_order_independent():
    assert profile_fingerprint({"a": 1, "b": 2}) == profile_fingerprint({"b": 2, "a": 1})
    assert request_fingerprint("ping", 4) != request_fingerprint("ping", 5)


def test_a_baseline_is_missing_for_an_engine_version_the_server_reports_without_one():
    recorded = {("qwen", "", profile_fingerprint(PROFILE), "0.11.2")}

    def missing(engine: str, adapter: str = "", profile=PROFILE) -> bool:
        return baseline_missing(
            recorded, model="qwen", adapter=adapter, profile=profile, engine_version=engine
        )

    assert not missing("0.11.2")
    assert missing("0.12.0")  # upgraded: its first wake must not become its own baseline
    assert not missing("")  # never reported a version: a baseline at any version counts
    assert missing("", adapter="sql")
    assert missing("", profile={**PROFILE, "tensorParallel": 1})
