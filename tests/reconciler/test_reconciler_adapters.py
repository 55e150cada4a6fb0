"""The tick's adapter pass against faithful fakes of the supervisor's adapter API: a trainer's
adapter on the standby is registered, relayed to the active, loaded, probed against its
manifest and routed; transfers resume after a cut; a digest mismatch, a wrong answer and an
adapter serving base answers each fail the copy; retention retires what is neither routed nor
among the newest kept."""

from __future__ import annotations

import time

import pytest

from common.adapter_manifest import manifest_parse, store_id
from fleets.core.adapter_route import AdapterRoute, adapter_routes_parse
from fleets.core.adapters import COPY_RETRY_BASE_MS, CopyState
from fleets.core.policy import Policy
from fleets.models import AdapterCopy, AdapterVersion, Domain, Event, Fleet
from fleets.reconciler import adapters as adapter_pass
from fleets.reconciler.supervisor.client import client_for
from fleets.services.adapter_routes import adapter_route_set
from tests.reconciler.fake_adapters import FEATURE_ADAPTERS, FakeAdapterStore, make_adapter

pytestmark = pytest.mark.django_db


@pytest.fixture
def stores(fleet, hosts):
    """Both hosts serve the adapter API; the control plane has read their status (features)."""
    out = {}
    for slug, host in hosts.hosts.items():
        host.features = (*host.features, FEATURE_ADAPTERS)
        host.golden = True
        out[slug] = host.adapter_store = FakeAdapterStore()
    for domain in Domain.objects.filter(fleet=fleet):
        assert client_for(domain).status(timeout=5).ok
    adapter_pass.forget()
    yield out
    adapter_pass.forget()


def _pass(fleet, **policy):
    fleet.refresh_from_db()
    return adapter_pass.adapters_pass(
        fleet_id=fleet.id,
        policy=Policy.resolve({**fleet.policy, **policy}),
        client_for=client_for,
    )


def _copy(name, version, slug):
    return AdapterCopy.objects.get(adapter__name=name, adapter__version=version, domain__slug=slug)


def _routes(fleet):
    return adapter_routes_parse(Fleet.objects.get(pk=fleet.pk).adapter_routes)


def test_an_adapter_trained_on_the_standby_is_registered_relayed_probed_and_routed(fleet, stores):
    manifest, files = make_adapter("support-bot")
    stores["west"].train(manifest, files)

    _pass(fleet)
    v = AdapterVersion.objects.get(fleet=fleet, name="support-bot")
    assert (v.version, v.state, v.base_model) == (1, "registered", "llama-small")
    assert v.source_domain.slug == "west"
    # The active received the very files, committed under the same id.
    sid = store_id(manifest_parse(manifest).digest)
    assert stores["east"].stored[sid][1] == files
    assert stores["east"].stored[sid][2] == "received"
    # Loaded on the active under its engine name, probed against the trainer's answer.
    assert stores["east"].loads[("llama-small", "support-bot@v1")] == sid
    east = _copy("support-bot", 1, "east")
    assert east.state == CopyState.PROBED
    assert east.baseline == {"Say hi": "Ahoy matey"}
    # The first version of a name goes live after its checks.
    assert _routes(fleet)["support-bot"] == AdapterRoute(base="llama-small", version=1)
    kinds = set(Event.objects.filter(fleet=fleet).values_list("kind", flat=True))
    assert {"adapter.registered", "adapter.copy.probed", "fleet.adapter.route"} <= kinds

    # Next pass: listed again, the same digest is the same version; the standby, which keeps
    # it stored, is asked to load the now routed version (pending until a wake).
    _pass(fleet)
    assert AdapterVersion.objects.filter(fleet=fleet, name="support-bot").count() == 1
    assert _copy("support-bot", 1, "west").state == CopyState.STORED
    assert stores["west"].loads[("llama-small", "support-bot@v1")] == sid


def test_a_later_version_is_probed_on_the_active_but_never_routed_by_the_registry(fleet, stores):
    stores["west"].train(*make_adapter("bot"))
    _pass(fleet)
    stores["west"].train(*make_adapter("bot", weights=b"v2" * 900))
    _pass(fleet)
    v2 = AdapterVersion.objects.get(fleet=fleet, name="bot", version=2)
    assert _copy("bot", 2, "east").state == CopyState.PROBED  # ready for the rollout's checks
    assert v2.state == "registered"
    assert _routes(fleet)["bot"].version == 1  # the adapter rollout moves it, not the registry


@pytest.mark.parametrize(
    ("manifest_of", "why"),
    [
        (lambda: make_adapter("bot", base="not-served")[0], "is not a model this fleet serves"),
        (
            lambda: make_adapter("bot", evals=[("Say hi", "Hello", "Hello")])[0],
            "every evaluation answer equals the base model's",
        ),
    ],
)
def test_a_manifest_the_fleet_cannot_serve_is_rejected_with_why(fleet, stores, manifest_of, why):
    manifest = manifest_of()
    stores["west"].train(manifest, make_adapter("bot")[1])
    _pass(fleet)
    v = AdapterVersion.objects.get(fleet=fleet, name="bot")
    assert v.state == "rejected"
    assert why in v.why
    assert not AdapterCopy.objects.filter(adapter=v).exists()
    assert Event.objects.filter(fleet=fleet, kind="adapter.rejected").count() == 1
    assert stores["east"].stored == {}  # nothing relayed
    assert _routes(fleet) == {}


def test_a_transfer_cut_midway_resumes_from_what_the_target_holds(fleet, stores, monkeypatch):
    monkeypatch.setattr(adapter_pass, "TRANSFER_CHUNK_BYTES", 1000)
    manifest, files = make_adapter("bot", weights=bytes(range(256)) * 12)  # 3072 bytes
    sid = stores["west"].train(manifest, files)
    # The manifest, adapter_config.json and the first 1000 weight bytes land; then it is cut.
    stores["east"].cut_after_puts = 3
    _pass(fleet)
    east = _copy("bot", 1, "east")
    assert east.state == CopyState.TRANSFERRING
    held = stores["east"].incoming[sid]
    assert len(held["adapter_model.safetensors"]) == 1000

    stores["east"].cut_after_puts = None
    before = stores["east"].puts
    _pass(fleet)
    assert stores["east"].stored[sid][1] == files
    # 2072 bytes left, 1000 per PUT: three more, nothing sent twice.
    assert stores["east"].puts - before == 3
    assert _copy("bot", 1, "east").state == CopyState.PROBED


def test_a_digest_mismatch_fails_the_copy_and_retries_from_scratch_after_a_wait(
    fleet, stores, fake_clock
):
    manifest, files = make_adapter("bot")
    sid = stores["west"].train(manifest, files)
    good = dict(files)
    stores["west"].stored[sid][1]["adapter_model.safetensors"] = b"x" * 3000  # rotted on disk
    _pass(fleet)
    east = _copy("bot", 1, "east")
    assert east.state == CopyState.FAILED
    assert "digest mismatch" in east.why
    assert sid not in stores["east"].incoming  # the target dropped it
    assert _routes(fleet) == {}

    stores["west"].stored[sid][1].update(good)
    _pass(fleet)
    assert _copy("bot", 1, "east").state == CopyState.FAILED  # not before its wait
    fake_clock.advance(ms=COPY_RETRY_BASE_MS)
    _pass(fleet)  # back to absent
    _pass(fleet)  # relayed from byte 0, committed, loaded, probed
    assert _copy("bot", 1, "east").state == CopyState.PROBED
    assert stores["east"].stored[sid][1] == good


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("serves_base", "loaded but serving nothing"),
        ("wrong", "differs from the trainer's recorded answer"),
    ],
)
def test_a_copy_that_answers_wrong_on_its_first_probe_fails_and_is_never_routed(
    fleet, stores, fault, why
):
    stores["west"].train(*make_adapter("bot"))
    getattr(stores["east"], fault).add("bot@v1")
    _pass(fleet)
    east = _copy("bot", 1, "east")
    assert east.state == CopyState.FAILED
    assert why in east.why
    assert east.baseline == {}
    assert _routes(fleet) == {}


def test_a_probe_the_engine_does_not_answer_is_asked_again_and_fails_only_after_its_tries(
    fleet, stores
):
    """A busy engine that times out a probe says nothing about the adapter: the copy stays
    loaded and is asked again; it fails only when the engine answers none of the tries."""
    stores["west"].train(*make_adapter("bot"))
    stores["east"].silent.add("bot@v1")
    for _ in range(adapter_pass.PROBE_NO_ANSWER_TRIES - 1):
        assert _pass(fleet)  # busy: asked again next tick
        assert _copy("bot", 1, "east").state == CopyState.LOADED
    stores["east"].silent.clear()
    _pass(fleet)
    assert _copy("bot", 1, "east").state == CopyState.PROBED
    assert _routes(fleet)["bot"].version == 1
    # Another version whose engine never answers fails, naming why.
    stores["west"].train(*make_adapter("bot", weights=b"two" * 10))
    stores["east"].silent.add("bot@v2")
    for _ in range(adapter_pass.PROBE_NO_ANSWER_TRIES + 1):
        _pass(fleet)
    east = _copy("bot", 2, "east")
    assert east.state == CopyState.FAILED
    assert "no answer in" in east.why and "timed out" in east.why


def test_retention_keeps_routed_and_newest_versions_and_retires_the_rest(fleet, stores):
    for i in range(3):
        stores["west"].train(*make_adapter("bot", weights=bytes([i]) * 100))
        _pass(fleet)
    assert _routes(fleet)["bot"].version == 1
    _pass(fleet, adapterKeepVersions=1)
    states = dict(
        AdapterVersion.objects.filter(fleet=fleet, name="bot").values_list("version", "state")
    )
    # v1 is routed, v3 the newest: v2 goes everywhere, its number stays taken.
    assert states == {1: "registered", 2: "retired", 3: "registered"}
    v2 = AdapterVersion.objects.get(fleet=fleet, name="bot", version=2)
    sid = store_id(v2.digest)
    assert sid not in stores["east"].stored and sid not in stores["west"].stored
    assert ("llama-small", "bot@v2") not in stores["east"].loads
    assert set(AdapterCopy.objects.filter(adapter=v2).values_list("state", flat=True)) == {
        "removed"
    }
    stores["west"].train(*make_adapter("bot", weights=b"new" * 10))
    _pass(fleet, adapterKeepVersions=1)
    assert AdapterVersion.objects.filter(fleet=fleet, name="bot").latest("version").version == 4


def test_the_pass_is_due_only_when_something_may_have_moved(fleet, stores, monkeypatch):
    urls = [d.supervisor_url for d in Domain.objects.filter(fleet=fleet)]
    due = {"fleet_id": fleet.id, "supervisor_urls": urls}
    assert adapter_pass.adapters_due(route_revision=0, checkpoints={}, **due)  # never looked
    _pass(fleet)
    fleet.refresh_from_db()
    rev = fleet.route_revision
    assert not adapter_pass.adapters_due(route_revision=rev, checkpoints={}, **due)
    assert adapter_pass.adapters_due(route_revision=rev + 1, checkpoints={}, **due)
    west = str(Domain.objects.get(fleet=fleet, slug="west").id)
    assert adapter_pass.adapters_due(
        route_revision=rev, checkpoints={west: "2026-12-05T09:00:00+00:00"}, **due
    )
    # Time alone brings a look only to a fleet that routes adapters (re-probes, reloads): one
    # that never trained an adapter pays nothing on its idle ticks.
    later = time.monotonic() + adapter_pass.LOOK_INTERVAL_S + 1
    monkeypatch.setattr(adapter_pass.time, "monotonic", lambda: later)
    assert not adapter_pass.adapters_due(route_revision=rev, checkpoints={}, routes=False, **due)
    assert adapter_pass.adapters_due(route_revision=rev, checkpoints={}, routes=True, **due)
    # A fleet none of whose supervisors advertises adapters is never looked at.
    assert not adapter_pass.adapters_due(
        fleet_id=fleet.id, supervisor_urls=["http://127.0.0.1:9"], route_revision=0, checkpoints={}
    )


def test_the_registry_route_refuses_nothing_the_rollout_set(fleet, stores):
    """A name whose route the rollout already set is left to it."""
    stores["west"].train(*make_adapter("bot"))
    _pass(fleet)
    fleet.refresh_from_db()
    assert adapter_route_set(
        fleet_id=fleet.id,
        name="bot",
        route=None,
        expected_revision=fleet.route_revision,
        actor="test",
    )
    # Removed by an operator: the pass routes the probed version again (first version rule).
    _pass(fleet)
    assert _routes(fleet)["bot"].version == 1


def test_a_probed_copy_is_probed_again_against_its_baseline_and_fails_when_it_drifts(
    fleet, stores, fake_clock
):
    stores["west"].train(*make_adapter("bot"))
    _pass(fleet)
    assert _copy("bot", 1, "east").state == CopyState.PROBED
    stores["east"].wrong.add("bot@v1")  # the engine still lists it, but answers otherwise
    _pass(fleet)
    assert _copy("bot", 1, "east").state == CopyState.PROBED  # not due yet
    fake_clock.advance(ms=adapter_pass.REPROBE_INTERVAL_MS)
    _pass(fleet)
    east = _copy("bot", 1, "east")
    assert east.state == CopyState.FAILED
    assert "differs from this copy's baseline" in east.why


def test_an_engine_that_lost_its_adapters_loads_them_again_and_reproves_them(fleet, stores):
    stores["west"].train(*make_adapter("bot"))
    _pass(fleet)
    stores["east"].loads.clear()  # an engine restart that forgot the load
    _pass(fleet)  # no longer listed as loaded: back to stored, loaded again, probed
    assert stores["east"].loads.get(("llama-small", "bot@v1"))
    assert _copy("bot", 1, "east").state == CopyState.PROBED
    kinds = list(
        Event.objects.filter(fleet=fleet, kind__startswith="adapter.copy", domain__slug="east")
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds[-3:] == ["adapter.copy.stored", "adapter.copy.loaded", "adapter.copy.probed"]


def test_a_copy_is_added_for_a_domain_that_binds_the_base_model_later(fleet, stores):
    stores["west"].train(*make_adapter("bot"))
    _pass(fleet)
    east = Domain.objects.get(fleet=fleet, slug="east")
    AdapterCopy.objects.filter(domain=east).delete()  # as if east were added afterwards
    _pass(fleet)
    assert _copy("bot", 1, "east").state in (CopyState.STORED, CopyState.PROBED)


def test_a_source_cut_mid_file_is_a_short_read_resumed_from_what_the_target_holds(
    fleet, stores, hosts, monkeypatch
):
    monkeypatch.setattr(adapter_pass, "TRANSFER_CHUNK_BYTES", 500)
    manifest, files = make_adapter("bot", weights=bytes(range(200)) * 10)  # 2000 bytes
    sid = stores["west"].train(manifest, files)
    stores["west"].cut_get_after = 700  # every file read breaks after 700 bytes
    _pass(fleet)
    assert stores["east"].stored[sid][1] == files
    # Read from 0, 700 and 1400 (Range), each short read sent as it came: the manifest, the
    # config, then 500 + 200, 500 + 200, 500 + 100: nothing sent twice.
    assert hosts.hosts["west"].calls[f"GET /v1/adapters/{sid}/files/adapter_model.safetensors"] == 3
    assert stores["east"].puts == 8
    assert _copy("bot", 1, "east").state == CopyState.PROBED
