"""Weighted, sticky splits in the chat proxy: which arm serves, empty and failing arms, stats.

East is the active (stable arm), west the standby running the candidate: both model-server
doubles answer with their name, so a response says which arm served it.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.db.models import F

from fleets.core.arm_stats import Arm
from fleets.core.route_split import Split
from fleets.models import ArmSample, Domain, Fleet, ModelBinding, Slot
from fleets.proxy import arm_stats, snapshots
from fleets.proxy.split import sticky_key
from fleets.reads.arm_stats import arm_windows
from fleets.services.route_splits import route_split_set
from tests.proxy.conftest import CHAT, chat_body, closed_port, error_of

pytestmark = pytest.mark.django_db(transaction=True)

ROLLOUT = str(uuid.uuid4())
MODEL = "qwen-small"


@pytest.fixture(autouse=True)
def poll_every_request(settings):
    """Read the pointer on every request, keep the snapshot a minute (as test_proxy_routing)."""
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 60_000, "chat_hold_poll_ms": 0}


@pytest.fixture
def recorder(monkeypatch):
    """This process's per-arm recorder, without its background thread: flushed by the test."""
    ours = arm_stats.ArmRecorder(autostart=False)
    monkeypatch.setattr(arm_stats, "RECORDER", ours)
    return ours


def _candidate_serving(fleet: Fleet) -> str:
    west = Domain.objects.get(fleet=fleet, slug="west")
    Slot.objects.filter(domain=west, kind="inference").update(state="serving")
    return str(west.id)


def split_set(fleet: Fleet, weight: int, *, sticky: str = "", serving: bool = True) -> Split:
    """Put west (the standby) in the split of MODEL at `weight` per mille."""
    west = Domain.objects.get(fleet=fleet, slug="west")
    if serving:
        _candidate_serving(fleet)
    split = Split(ROLLOUT, str(west.id), weight, sticky)
    revision = Fleet.objects.get(pk=fleet.pk).route_revision
    assert route_split_set(
        fleet_id=fleet.id, model=MODEL, split=split, expected_revision=revision, actor="test"
    )
    return split


def set_health(fleet: Fleet, slug: str, health: str) -> None:
    ModelBinding.objects.filter(domain__fleet=fleet, domain__slug=slug, name=MODEL).update(
        health=health
    )


async def engine_of(haru, **headers) -> str:
    response = await haru.post(CHAT, content=chat_body(MODEL), headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["engine"]


async def test_without_a_split_the_snapshot_has_none_and_the_active_serves(
    haru, engines, proxy_fleet
):
    assert await engine_of(haru) == "east"
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    assert snapshot.splits == {} and snapshot.split_faults == {}


async def test_the_snapshot_carries_the_split_and_its_candidate_route(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(split_set)(proxy_fleet, 1000)
    assert await engine_of(haru) == "west"
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    entry = snapshot.splits[MODEL]
    assert entry.split.weight_permille == 1000
    assert entry.candidate is not None
    assert entry.candidate.targets["chat"].port == engines["west"].served.port
    assert "llama-small" not in snapshot.splits  # only the split model
    assert await engine_of(haru, **{"x-haru-fleet": "demo"}) == "west"


async def test_weight_zero_sends_nothing_to_the_candidate_and_full_weight_everything(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(split_set)(proxy_fleet, 0)
    assert {await engine_of(haru) for _ in range(10)} == {"east"}
    await sync_to_async(split_set)(proxy_fleet, 1000)
    assert {await engine_of(haru) for _ in range(10)} == {"west"}
    # The other model is not split: the active serves it.
    response = await haru.post(CHAT, content=chat_body("llama-small"))
    assert response.json()["engine"] == "east"


async def test_one_api_key_sees_one_arm_across_requests_and_processes(
    haru, engines, proxy_fleet, recorder
):
    split = await sync_to_async(split_set)(proxy_fleet, 500)
    keys = [f"key-{i}" for i in range(24)]
    seen: dict[str, str] = {}
    for key in keys:
        arms = {await engine_of(haru, authorization=f"Bearer {key}") for _ in range(3)}
        assert len(arms) == 1, key  # sticky
        seen[key] = arms.pop()
    assert set(seen.values()) == {"east", "west"}  # 24 keys at 50 %: both arms
    # Another process, from the stored split alone, assigns every key to the same arm.
    script = (
        "import sys; from fleets.core.route_split import Split, to_candidate;"
        "from fleets.proxy.split import sticky_key;"
        f"s = Split({split.rollout_id!r}, {split.candidate_domain_id!r}, 500);"
        "print(''.join('w' if to_candidate(s, sticky_key(s, "
        "{b'authorization': ('Bearer ' + k).encode()})) else 'e' for k in sys.argv[1:]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, *keys], capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == "".join(seen[k][0] for k in keys)


async def test_the_sticky_header_wins_over_the_api_key(haru, engines, proxy_fleet, recorder):
    await sync_to_async(split_set)(proxy_fleet, 500, sticky="x-session")
    for session in ("s-1", "s-2", "s-3", "s-4", "s-5", "s-6"):
        arms = {
            await engine_of(haru, authorization=f"Bearer k{i}", **{"x-session": session})
            for i in range(4)
        }
        assert len(arms) == 1, session


def test_the_stickiness_key_never_holds_the_token():
    split = Split(ROLLOUT, str(uuid.uuid4()), 500, "x-session")
    key = sticky_key(split, {b"authorization": b"Bearer sk-secret-token"})
    assert key is not None and "sk-secret-token" not in key
    assert sticky_key(split, {b"x-session": b"abc", b"authorization": b"Bearer t"}) == "h:abc"
    assert sticky_key(split, {}) is None
    assert sticky_key(split, {b"authorization": b"Basic dXNlcg=="}) is None


@pytest.mark.parametrize("fault", ["server_down", "slot_asleep"])
async def test_an_empty_candidate_arm_takes_nothing_even_at_full_weight(
    haru, engines, proxy_fleet, recorder, fault
):
    # The istio case: every request weighted to an arm with no server, never a 503.
    def empty_candidate():
        split_set(proxy_fleet, 1000, serving=fault != "slot_asleep")
        if fault == "server_down":
            set_health(proxy_fleet, "west", "down")

    await sync_to_async(empty_candidate)()
    assert {await engine_of(haru) for _ in range(10)} == {"east"}
    assert engines["west"].requests == []
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    assert snapshot.splits[MODEL].candidate is None


async def test_an_unroutable_stable_arm_hands_its_share_to_the_candidate(
    haru, engines, proxy_fleet, recorder
):
    def stable_down():
        split_set(proxy_fleet, 10)  # 1 %
        set_health(proxy_fleet, "east", "down")

    await sync_to_async(stable_down)()
    assert {await engine_of(haru) for _ in range(10)} == {"west"}
    assert [r for r in engines["east"].requests if r["path"] == CHAT] == []


async def test_a_refusing_candidate_is_retried_on_the_stable_arm_and_counted(
    haru, engines, proxy_fleet, recorder
):
    def candidate_refuses():
        split_set(proxy_fleet, 1000)
        ModelBinding.objects.filter(domain__slug="west", name=MODEL).update(
            serving_url=f"http://127.0.0.1:{closed_port()}"
        )

    await sync_to_async(candidate_refuses)()
    assert {await engine_of(haru) for _ in range(5)} == {"east"}
    await sync_to_async(recorder.flush)()
    windows = await sync_to_async(arm_windows)(rollout_id=ROLLOUT, model=MODEL, since=_epoch())
    assert (windows[Arm.CANDIDATE].requests, windows[Arm.CANDIDATE].errors) == (5, 5)
    assert (windows[Arm.STABLE].requests, windows[Arm.STABLE].errors) == (5, 0)


async def test_a_candidate_answering_5xx_is_retried_on_the_stable_arm(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(split_set)(proxy_fleet, 1000)
    engines["west"].status = 500
    assert {await engine_of(haru) for _ in range(3)} == {"east"}
    assert len([r for r in engines["west"].requests if r["path"] == CHAT]) == 3
    engines["west"].status = 200
    assert await engine_of(haru) == "west"


async def test_a_malformed_split_is_ignored_and_the_stable_arm_serves(
    haru, engines, proxy_fleet, recorder
):
    def corrupt():
        _candidate_serving(proxy_fleet)
        Fleet.objects.filter(pk=proxy_fleet.pk).update(
            route_splits={
                MODEL: {"rollout": "not-a-uuid", "candidateDomain": 7, "weightPermille": 2000},
                "llama-small": "junk",
            },
            route_revision=F("route_revision") + 1,
        )

    await sync_to_async(corrupt)()
    assert {await engine_of(haru) for _ in range(5)} == {"east"}
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    assert snapshot.splits == {}
    assert set(snapshot.split_faults) == {MODEL, "llama-small"}


async def test_a_split_naming_the_active_as_candidate_is_ignored(
    haru, engines, proxy_fleet, recorder
):
    def self_split():
        east = Domain.objects.get(fleet=proxy_fleet, slug="east")
        Fleet.objects.filter(pk=proxy_fleet.pk).update(
            route_splits={MODEL: Split(ROLLOUT, str(east.id), 1000).as_json()},
            route_revision=F("route_revision") + 1,
        )

    await sync_to_async(self_split)()
    assert await engine_of(haru) == "east"
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    assert "active" in snapshot.split_faults[MODEL]


async def test_split_requests_are_recorded_per_arm(haru, engines, proxy_fleet, recorder):
    await sync_to_async(split_set)(proxy_fleet, 500)
    arms: list[str] = []
    for i in range(20):
        arms.append(await engine_of(haru, authorization=f"Bearer user-{i}"))
    await haru.post(CHAT, content=chat_body("llama-small"))  # not split: not recorded
    assert await sync_to_async(recorder.flush)() >= 1
    windows = await sync_to_async(arm_windows)(rollout_id=ROLLOUT, model=MODEL, since=_epoch())
    assert windows[Arm.CANDIDATE].requests == arms.count("west")
    assert windows[Arm.STABLE].requests == arms.count("east")
    for window in windows.values():
        assert window.errors == 0
        assert window.ttft_samples == window.requests
        assert window.ttft_p50_ms is not None and window.ttft_p50_ms > 0
    assert await sync_to_async(ArmSample.objects.filter(model="llama-small").count)() == 0


async def test_a_split_stream_records_its_inter_token_gaps(haru, engines, proxy_fleet, recorder):
    await sync_to_async(split_set)(proxy_fleet, 1000)
    west = engines["west"]
    west.mode = "stream"
    async with haru.stream("POST", CHAT, content=chat_body(MODEL, stream=True)) as response:
        chunks = []
        async for chunk in response.aiter_raw():
            chunks.append(chunk)
            west.release.set()  # the rest only once the first chunk reached the client
    assert response.status_code == 200 and b"data: two" in b"".join(chunks)
    await sync_to_async(recorder.flush)()
    windows = await sync_to_async(arm_windows)(rollout_id=ROLLOUT, model=MODEL, since=_epoch())
    candidate = windows[Arm.CANDIDATE]
    assert (candidate.requests, candidate.errors, candidate.ttft_samples) == (1, 0, 1)
    assert candidate.itl_samples >= 1 and candidate.itl_p50_ms is not None


def _epoch():
    from datetime import UTC, datetime  # noqa: PLC0415

    return datetime(2000, 1, 1, tzinfo=UTC)


async def test_a_candidate_at_weight_zero_takes_nothing_even_with_the_stable_arm_down(
    haru, engines, proxy_fleet, recorder, settings
):
    # 0 is a rollback or a pin: the candidate must not take user requests, even then.
    settings.HARU = {**settings.HARU, "chat_hold_ms": 200}

    def pinned_out():
        split_set(proxy_fleet, 0)
        set_health(proxy_fleet, "east", "down")

    await sync_to_async(pinned_out)()
    response = await haru.post(CHAT, content=chat_body(MODEL))
    assert error_of(response) == (503, "model_unavailable")
    assert [r for r in engines["west"].requests if r["path"] == CHAT] == []
