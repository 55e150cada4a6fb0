"""The chat proxy routes adapter names: version chosen, body renamed, answer named as asked.

East is the active domain. Its model-server double answers like vLLM: the `model` it was asked
for in the JSON body and in every SSE chunk, so a test sees both what the engine received and
what the client got back.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import pytest
from asgiref.sync import sync_to_async
from django.db.models import F

from fleets.core.adapter_route import AdapterRoute, choose_version
from fleets.core.arm_stats import Arm
from fleets.models import AdapterCopy, AdapterVersion, Domain, Fleet
from fleets.proxy import arm_stats, snapshots
from fleets.proxy.split import sticky_key
from fleets.reads.arm_stats import arm_windows
from fleets.services.adapter_routes import adapter_route_set
from tests.proxy.conftest import CHAT, chat_body, error_of, serving
from tests.proxy.test_proxy_hold import east_refuses, until_held
from tests.proxy.test_proxy_routing import promote

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "support-bot"
BASE = "qwen-small"
ROLLOUT = str(uuid.uuid4())
HEADER = "x-haru-adapter-version"


class ModelEcho:
    """A vLLM-like double: answers with the model it was asked for; records every request.

    `fail` holds model names it answers 500 for (an adapter the engine cannot serve)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[dict] = []
        self.fail: set[str] = set()
        self.url = ""

    def chats(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests if r["path"] == CHAT]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.requests.append({"path": scope["path"], "body": body})
        document = json.loads(body or b"{}")
        model = document.get("model", "")
        if model in self.fail:
            await _answer(send, 500, b'{"error":"boom"}', b"application/json")
            return
        if document.get("stream"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for word in ("Hel", "lo"):
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [{"index": 0, "delta": {"content": word}}],
                }
                event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        payload = json.dumps(
            {"id": "c1", "object": "chat.completion", "model": model, "engine": self.name}
        ).encode()
        await _answer(send, 200, payload, b"application/json")


async def _answer(send, status: int, payload: bytes, kind: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(payload))],
        }
    )
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def engines():
    """Overrides the conftest's doubles (proxy_fleet points the layout at these)."""
    east, west = ModelEcho("east"), ModelEcho("west")
    async with serving(east) as e, serving(west) as w:
        east.url, west.url = e.url, w.url
        yield {"east": east, "west": west}


@pytest.fixture(autouse=True)
def poll_every_request(settings):
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 60_000, "chat_hold_poll_ms": 0}


@pytest.fixture
def recorder(monkeypatch):
    """This process's per-arm recorder, without its thread: flushed by the test."""
    ours = arm_stats.ArmRecorder(autostart=False)
    monkeypatch.setattr(arm_stats, "RECORDER", ours)
    return ours


def _version(fleet: Fleet, version: int) -> AdapterVersion:
    now = datetime.now(UTC)
    return AdapterVersion.objects.create(
        fleet=fleet,
        name=NAME,
        version=version,
        base_model=BASE,
        digest=f"sha256:{version:064x}",
        size_bytes=1,
        manifest={},
        completed_at=now,
        registered_at=now,
    )


def adapters_set(
    fleet: Fleet, states: dict[int, str], route: AdapterRoute, domains: tuple[str, ...] = ("east",)
) -> None:
    """Register the versions with their copies on `domains` (east: the active) in `states`;
    route them."""
    for version, state in states.items():
        row = _version(fleet, version)
        for slug in domains:
            AdapterCopy.objects.create(
                adapter=row,
                domain=Domain.objects.get(fleet=fleet, slug=slug),
                state=state,
                updated_at=datetime.now(UTC),
            )
    revision = Fleet.objects.get(pk=fleet.pk).route_revision
    assert adapter_route_set(
        fleet_id=fleet.id, name=NAME, route=route, expected_revision=revision, actor="test"
    )


def copy_state(fleet: Fleet, version: int, state: str) -> None:
    """Move a copy as the reconciler does: without a route revision."""
    AdapterCopy.objects.filter(adapter__fleet=fleet, adapter__version=version).update(state=state)


async def ask(haru, model: str = NAME, **extra):
    headers = extra.pop("headers", {})
    return await haru.post(CHAT, content=chat_body(model, **extra), headers=headers)


async def test_an_adapter_name_goes_to_its_version_and_answers_under_the_name(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, AdapterRoute(BASE, 7))
    response = await ask(haru, temperature=0.5)
    assert response.status_code == 200, response.text
    sent = engines["east"].chats()
    assert [s["model"] for s in sent] == ["support-bot@v7"]
    assert sent[0]["temperature"] == 0.5 and sent[0]["messages"][0]["content"] == "hi"
    assert response.json()["model"] == NAME  # never the engine's name
    assert response.headers[HEADER] == "support-bot@v7"
    assert int(response.headers["content-length"]) == len(response.content)
    assert engines["west"].requests == []


async def test_a_streamed_answer_names_the_adapter_in_every_chunk(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, AdapterRoute(BASE, 7))
    async with haru.stream(
        "POST", CHAT, content=chat_body(NAME, stream=True), headers={}
    ) as response:
        assert response.status_code == 200
        assert response.headers[HEADER] == "support-bot@v7"
        text = (await response.aread()).decode()
    events = [e for e in text.split("\n\n") if e.startswith("data: {")]
    assert len(events) == 2
    assert all(json.loads(e[6:])["model"] == NAME for e in events)
    assert "@v7" not in text
    assert [s["model"] for s in engines["east"].chats()] == ["support-bot@v7"]


async def test_the_base_model_is_untouched(haru, engines, proxy_fleet, recorder):
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, AdapterRoute(BASE, 7))
    body = chat_body(BASE, temperature=0.5)
    response = await haru.post(CHAT, content=body)
    assert response.status_code == 200
    assert engines["east"].requests[-1]["body"] == body  # byte for byte
    assert response.json()["model"] == BASE
    assert HEADER not in response.headers


async def test_versions_are_sticky_per_key_and_weighted(haru, engines, proxy_fleet, recorder):
    route = AdapterRoute(BASE, 7, 8, 300, ROLLOUT)
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed", 8: "probed"}, route)
    served: dict[str, str] = {}
    for i in range(60):
        key = f"key-{i}"
        auth = {"authorization": f"Bearer {key}"}
        first, again = await ask(haru, headers=auth), await ask(haru, headers=auth)
        assert first.headers[HEADER] == again.headers[HEADER], key  # one key, one version
        served[key] = first.headers[HEADER]
        expected, _ = choose_version(route, sticky_key(route, {b"authorization": auth_b(key)}))
        assert served[key] == f"support-bot@v{expected}"
    candidates = sum(v == "support-bot@v8" for v in served.values())
    assert 8 <= candidates <= 30  # 300 per mille of 60 keys: 18, three deviations either way
    # The draw itself over many keys, within a percent and a half.
    many = [
        choose_version(route, sticky_key(route, {b"authorization": auth_b(f"k{i}")}))[0]
        for i in range(20_000)
    ]
    assert abs(many.count(8) / len(many) - 0.3) < 0.015


def auth_b(key: str) -> bytes:
    return f"Bearer {key}".encode()


async def test_an_unprobed_version_is_never_served(haru, engines, proxy_fleet, recorder):
    route = AdapterRoute(BASE, 7, 8, 1000, ROLLOUT)
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed", 8: "loaded"}, route)
    for _ in range(5):
        response = await ask(haru)
        assert response.headers[HEADER] == "support-bot@v7"
    assert {s["model"] for s in engines["east"].chats()} == {"support-bot@v7"}
    # Counted where it was served (stable), never as a candidate error.
    await sync_to_async(recorder.flush)()
    windows = await sync_to_async(arm_windows)(rollout_id=ROLLOUT, model=NAME, since=_epoch())
    assert windows[Arm.STABLE].requests == 5 and windows[Arm.STABLE].errors == 0
    assert windows[Arm.CANDIDATE].requests == 0


async def test_no_probed_version_is_refused_and_nothing_is_forwarded(
    haru, engines, proxy_fleet, recorder, settings
):
    route = AdapterRoute(BASE, 7, 8, 500, ROLLOUT)
    await sync_to_async(adapters_set)(proxy_fleet, {7: "loaded", 8: "stored"}, route)
    response = await ask(haru)
    assert error_of(response) == (503, "adapter_not_ready")
    assert response.headers["retry-after"] == "1"
    assert engines["east"].requests == [] and engines["west"].requests == []
    # A copy's move bumps no route revision: the snapshot sees it within its TTL.
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 0}
    await sync_to_async(copy_state)(proxy_fleet, 7, "probed")
    response = await ask(haru)
    assert response.status_code == 200 and response.headers[HEADER] == "support-bot@v7"


async def test_a_concrete_engine_name_and_an_unknown_adapter_are_not_found(
    haru, engines, proxy_fleet, recorder
):
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, AdapterRoute(BASE, 7))
    assert error_of(await ask(haru, "support-bot@v7")) == (404, "model_not_found")
    assert error_of(await ask(haru, "other-bot")) == (404, "model_not_found")
    assert engines["east"].requests == []


async def test_arm_stats_carry_the_rollout_and_a_failing_candidate_is_retried_on_stable(
    haru, engines, proxy_fleet, recorder
):
    route = AdapterRoute(BASE, 7, 8, 1000, ROLLOUT)
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed", 8: "probed"}, route)
    assert (await ask(haru)).headers[HEADER] == "support-bot@v8"
    engines["east"].fail.add("support-bot@v8")
    response = await ask(haru)
    assert response.status_code == 200 and response.headers[HEADER] == "support-bot@v7"
    assert [s["model"] for s in engines["east"].chats()] == [
        "support-bot@v8",
        "support-bot@v8",
        "support-bot@v7",
    ]
    await sync_to_async(recorder.flush)()
    windows = await sync_to_async(arm_windows)(rollout_id=ROLLOUT, model=NAME, since=_epoch())
    assert (windows[Arm.CANDIDATE].requests, windows[Arm.CANDIDATE].errors) == (2, 1)
    assert (windows[Arm.STABLE].requests, windows[Arm.STABLE].errors) == (1, 0)


async def test_first_served_at_is_marked_once_per_version(haru, engines, proxy_fleet, recorder):
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, AdapterRoute(BASE, 7))
    before = datetime.now(UTC)
    assert (await ask(haru)).status_code == 200

    def first_served() -> datetime | None:
        return AdapterVersion.objects.get(fleet=proxy_fleet, version=7).first_served_at

    # Nothing on the request path: only the background writer's flush stores it.
    assert await sync_to_async(first_served)() is None
    await sync_to_async(recorder.flush)()
    marked = await sync_to_async(first_served)()
    assert marked is not None and marked >= before.replace(microsecond=0)
    await asyncio.sleep(0.01)
    assert (await ask(haru)).status_code == 200
    await sync_to_async(recorder.flush)()
    assert await sync_to_async(first_served)() == marked


def test_first_served_fails_open_and_retries():
    calls: list[list] = []

    def broken(marks):
        calls.append(list(marks))
        if len(calls) == 1:
            raise RuntimeError("database down")

    ours = arm_stats.ArmRecorder(autostart=False, mark=broken)
    ours.first_served(("f", NAME, 7))
    ours.flush()  # fails: kept
    ours.first_served(("f", NAME, 7))
    ours.flush()  # stored
    ours.first_served(("f", NAME, 7))
    ours.flush()  # known: not written again
    assert [[m[0] for m in c] for c in calls] == [[("f", NAME, 7)], [("f", NAME, 7)]]


async def test_a_bad_adapter_routes_row_leaves_model_routing_alone(
    haru, engines, proxy_fleet, recorder
):
    def corrupt():
        Fleet.objects.filter(pk=proxy_fleet.pk).update(
            adapter_routes={NAME: {"base": BASE, "version": "seven"}},
            route_revision=F("route_revision") + 1,
        )

    await sync_to_async(corrupt)()
    response = await ask(haru, BASE)
    assert response.status_code == 200 and response.json()["model"] == BASE
    assert error_of(await ask(haru)) == (404, "model_not_found")
    snapshot = snapshots.ROUTES._snapshots[str(proxy_fleet.id)]
    assert snapshot.adapters == {} and "version" in snapshot.adapter_fault


async def test_a_held_adapter_request_follows_the_failover_to_the_new_active(
    haru, engines, proxy_fleet, recorder, hold_settings
):
    route = AdapterRoute(BASE, 7)
    await sync_to_async(adapters_set)(proxy_fleet, {7: "probed"}, route, ("east", "west"))
    await east_refuses(proxy_fleet)
    request = asyncio.create_task(ask(haru, stream=True))
    await until_held(1)
    await sync_to_async(promote)(proxy_fleet, "west")
    response = await asyncio.wait_for(request, 5)
    assert response.status_code == 200 and response.headers[HEADER] == "support-bot@v7"
    assert "@v7" not in response.text and f'"model":"{NAME}"' in response.text
    assert [s["model"] for s in engines["west"].chats()] == ["support-bot@v7"]


def _epoch() -> datetime:
    return datetime(2000, 1, 1, tzinfo=UTC)
