"""The GPU planner: shapes of binpack and spread, sleep-aware memory, and every refusal reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleets.core import placement as p
from fleets.core.placement import (
    GpuDevice,
    MigInstance,
    PlanInputError,
    PlanRequest,
    Server,
    ServerGroup,
    Trainer,
    plan,
)

H100 = "NVIDIA H100 80GB HBM3"
GIB = 1024


def gpus(n: int, mib: int = 80 * GIB, **kw) -> tuple[GpuDevice, ...]:
    return tuple(GpuDevice(index=i, type=H100, memory_mib=mib, **kw) for i in range(n))


def group(name: str, *servers: Server, **kw) -> ServerGroup:
    return ServerGroup(name, servers or (Server(name, memory_mib=8 * GIB),), **kw)


def small(name: str, mib: int = 8 * GIB, residue: int = 2 * GIB) -> ServerGroup:
    return group(name, Server(name, memory_mib=mib, sleep_residue_mib=residue))


def only(result: p.Plan) -> p.Refusal:
    assert len(result.refusals) >= 1
    return result.refusals[-1]


# -- the product's shape ------------------------------------------------------------------------


def test_bundle_of_small_models_and_trainer_share_one_gpu_and_large_model_gets_the_other():
    bundle = group(
        "bundle",
        Server("qwen", memory_mib=16 * GIB, sleep_residue_mib=2 * GIB),
        Server("llama", memory_mib=20 * GIB, sleep_residue_mib=3 * GIB),
    )
    large = group("large", Server("big", exclusive=True))
    result = plan(
        PlanRequest(gpus=gpus(2), groups=(bundle, large), trainers=(Trainer("lora", None),))
    )
    assert result.ok, result.explain()
    by_name = {g.name: g for g in result.groups}
    assert by_name["large"].gpu_indices == (0,)  # whole GPUs are placed first
    assert by_name["bundle"].gpu_indices == (1,)
    (trainer,) = result.trainers
    assert trainer.gpu_index == 1  # in the memory the sleeping bundle gives back
    # total - residues - margin
    assert trainer.budget_mib == 80 * GIB - 5 * GIB - p.DEFAULT_SAFETY_MARGIN_MIB
    flags = {s.name: s.gpu_memory_utilization for g in result.groups for s in g.servers}
    assert flags == {"qwen": 0.2, "llama": 0.25, "big": 0.987}
    assert sum(flags[n] for n in ("qwen", "llama")) <= 1.0


def test_trainer_budget_never_exceeds_total_minus_sleeping_residues_minus_margin():
    bundle = small("bundle", mib=30 * GIB, residue=6 * GIB)
    result = plan(
        PlanRequest(gpus=gpus(1), groups=(bundle,), trainers=(Trainer("lora", 80 * GIB),))
    )
    refusal = only(result)
    assert refusal.reason == p.INSUFFICIENT_MEMORY
    assert refusal.workload == "lora" and refusal.target == "GPU 0"
    assert "81920 MiB > 74752 MiB" in refusal.detail
    assert "6144 MiB sleeping residue" in refusal.detail


def test_residue_is_capped_at_the_servers_own_share():
    result = plan(PlanRequest(gpus=gpus(1), groups=(small("tiny", mib=1024, residue=4096),)))
    (server,) = result.groups[0].servers
    assert server.sleep_residue_mib == server.need_mib < 4096


def test_default_residue_is_the_documented_middle_of_real_figures():
    assert Server("x").sleep_residue_mib == p.DEFAULT_SLEEP_RESIDUE_MIB == 3072


def test_fraction_is_of_the_gpu_it_lands_on():
    result = plan(
        PlanRequest(
            gpus=gpus(1, mib=40 * GIB), groups=(group("a", Server("a", memory_fraction=0.5)),)
        )
    )
    (server,) = result.groups[0].servers
    assert server.need_mib == 20 * GIB
    assert server.gpu_memory_utilization == 0.5


def test_utilization_rounds_up_so_a_server_never_gets_less_than_it_asked():
    result = plan(PlanRequest(gpus=gpus(1, mib=81559), groups=(small("a", mib=10_000),)))
    (server,) = result.groups[0].servers
    assert server.gpu_memory_utilization * 81559 >= 10_000
    assert server.need_mib >= 10_000


# -- policies ----------------------------------------------------------------------------------


def test_binpack_fills_one_gpu_before_opening_another():
    groups = tuple(small(f"m{i}", mib=10 * GIB) for i in range(4))
    result = plan(PlanRequest(gpus=gpus(3), groups=groups, policy="binpack"))
    assert {g.gpu_indices for g in result.groups} == {(0,)}


def test_spread_balances_memory_across_gpus():
    groups = tuple(small(f"m{i}", mib=10 * GIB) for i in range(4))
    result = plan(PlanRequest(gpus=gpus(2), groups=groups, policy="spread"))
    per_gpu = [u.awake_mib for u in result.usage]
    assert per_gpu == [20 * GIB, 20 * GIB]


def test_binpack_keeps_whole_gpus_free_for_a_large_model_placed_later_in_the_list():
    groups = (
        small("a", 20 * GIB),
        small("b", 20 * GIB),
        group("big", Server("big", exclusive=True)),
    )
    result = plan(PlanRequest(gpus=gpus(2), groups=groups, policy="binpack"))
    assert result.ok, result.explain()


def test_spread_places_a_trainer_where_the_least_residue_sits():
    result = plan(
        PlanRequest(
            gpus=gpus(2),
            groups=(small("a"),),
            trainers=(Trainer("t"),),
            policy="spread",
        )
    )
    assert result.groups[0].gpu_indices == (0,)
    assert result.trainers[0].gpu_index == 1


def test_unknown_policy_is_an_input_error():
    with pytest.raises(PlanInputError, match="unknown placement policy"):
        plan(PlanRequest(gpus=gpus(1), policy="random"))  # type: ignore[arg-type]


# -- exclusive, tensor parallel, topology -------------------------------------------------------


def test_tensor_parallel_prefers_gpus_sharing_nvlink():
    devices = (
        GpuDevice(0, H100, 80 * GIB, nvlink_group=0, numa_node=0),
        GpuDevice(1, H100, 80 * GIB, nvlink_group=1, numa_node=0),
        GpuDevice(2, H100, 80 * GIB, nvlink_group=0, numa_node=1),
        GpuDevice(3, H100, 80 * GIB, nvlink_group=1, numa_node=1),
    )
    result = plan(PlanRequest(gpus=devices, groups=(group("tp", Server("tp", tensor_parallel=2)),)))
    assert result.groups[0].gpu_indices == (0, 2)


def test_tensor_parallel_falls_back_to_numa_then_any():
    devices = (
        GpuDevice(0, H100, 80 * GIB, numa_node=0),
        GpuDevice(1, H100, 80 * GIB, numa_node=1),
        GpuDevice(2, H100, 80 * GIB, numa_node=1),
    )
    result = plan(PlanRequest(gpus=devices, groups=(group("tp", Server("tp", tensor_parallel=2)),)))
    assert result.groups[0].gpu_indices == (1, 2)


def test_tensor_parallel_group_takes_whole_gpus_nobody_else_shares():
    result = plan(
        PlanRequest(
            gpus=gpus(3),
            groups=(group("tp", Server("tp", tensor_parallel=2)), small("s")),
            trainers=(Trainer("t"),),
        )
    )
    assert result.ok, result.explain()
    tp = next(g for g in result.groups if g.name == "tp")
    others = {g.gpu_indices[0] for g in result.groups if g.name != "tp"}
    others.add(result.trainers[0].gpu_index)
    assert not set(tp.gpu_indices) & others


def test_required_nvlink_that_no_group_offers_is_refused_as_topology():
    devices = (
        GpuDevice(0, H100, 80 * GIB, nvlink_group=0),
        GpuDevice(1, H100, 80 * GIB, nvlink_group=1),
    )
    g = group("tp", Server("tp", tensor_parallel=2), topology="nvlink")
    refusal = only(plan(PlanRequest(gpus=devices, groups=(g,))))
    assert refusal.reason == p.TOPOLOGY_NOT_SATISFIABLE
    assert "one NVLink group" in refusal.detail


def test_tensor_parallel_wider_than_the_domain_is_refused_as_topology():
    refusal = only(
        plan(PlanRequest(gpus=gpus(1), groups=(group("tp", Server("tp", tensor_parallel=2)),)))
    )
    assert refusal.reason == p.TOPOLOGY_NOT_SATISFIABLE
    assert refusal.detail == "tensor parallel 2 needs 2 GPUs, the domain has 1"


def test_exclusive_server_refuses_a_gpu_that_already_hosts_another():
    pinned = group("a", Server("a", memory_mib=GIB), gpu_index=0)
    g = group("ex", Server("ex", exclusive=True))
    refusal = only(plan(PlanRequest(gpus=gpus(1), groups=(pinned, g))))
    assert (refusal.workload, refusal.target, refusal.reason) == (
        "ex",
        "GPU 0",
        p.EXCLUSIVE_CONFLICT,
    )


def test_nothing_joins_a_gpu_held_exclusively():
    ex = group("ex", Server("ex", exclusive=True))
    result = plan(PlanRequest(gpus=gpus(1), groups=(ex, small("a")), trainers=(Trainer("t"),)))
    reasons = {(r.workload, r.reason) for r in result.refusals}
    assert reasons == {("a", p.EXCLUSIVE_CONFLICT), ("t", p.EXCLUSIVE_CONFLICT)}
    assert all("held whole by ex" in r.detail for r in result.refusals)


def test_exclusive_server_must_be_alone_in_its_group():
    g = group("g", Server("ex", exclusive=True), Server("b", memory_mib=1))
    with pytest.raises(PlanInputError, match="needs a slot of its own"):
        plan(PlanRequest(gpus=gpus(1), groups=(g,)))


# -- refusals ----------------------------------------------------------------------------------


def test_insufficient_memory_names_the_numbers():
    refusal = only(plan(PlanRequest(gpus=gpus(1, mib=24 * GIB), groups=(small("big", 30 * GIB),))))
    assert refusal.reason == p.INSUFFICIENT_MEMORY
    assert refusal.detail == (
        "needs 30720 MiB, 23552 MiB free of 24576 MiB (0 MiB planned, 1024 MiB margin)"
    )
    assert str(refusal).startswith("big on GPU 0: insufficient_memory (")


def test_gpu_type_mismatch():
    g = group("a", Server("a", memory_mib=1024), gpu_type="A100")
    refusal = only(plan(PlanRequest(gpus=gpus(1), groups=(g,))))
    assert refusal.reason == p.TYPE_MISMATCH
    assert "wants 'A100'" in refusal.detail


def test_gpu_type_matches_by_substring_case_insensitively():
    g = group("a", Server("a", memory_mib=1024), gpu_type="h100")
    assert plan(PlanRequest(gpus=gpus(1), groups=(g,))).ok


def test_pinned_gpu_that_does_not_exist():
    refusal = only(
        plan(PlanRequest(gpus=gpus(1), groups=(small("a"),), trainers=(Trainer("t", gpu_index=3),)))
    )
    assert (refusal.reason, refusal.workload) == (p.NO_SUCH_GPU, "t")


def test_mig_instance_too_small_and_never_split():
    device = GpuDevice(
        0,
        "NVIDIA A100-SXM4-80GB",
        80 * GIB,
        mig=(MigInstance("1g.10gb", 9728), MigInstance("3g.40gb", 40192)),
    )
    too_big = group("big", Server("big", memory_mib=20 * GIB), mig="1g.10gb")
    refusal = only(plan(PlanRequest(gpus=(device,), groups=(too_big,))))
    assert (refusal.target, refusal.reason) == ("GPU 0 MIG 1g.10gb", p.MIG_TOO_SMALL)
    assert "instance has 9728 MiB" in refusal.detail

    two = (small("a", 4 * GIB), small("b", 4 * GIB), small("c", 4 * GIB))
    result = plan(PlanRequest(gpus=(device,), groups=two))
    # binpack: the tightest instance that fits first
    assert [g.mig for g in result.groups if g.name in ("a", "b")] == ["1g.10gb", "3g.40gb"]
    refusal = only(result)
    assert refusal.workload == "c" and refusal.reason == p.EXCLUSIVE_CONFLICT
    assert "never split" in refusal.detail


def test_mig_instance_cannot_host_tensor_parallel():
    device = GpuDevice(
        0, H100, 80 * GIB, mig=(MigInstance("a", 40 * GIB), MigInstance("b", 40 * GIB))
    )
    result = plan(
        PlanRequest(
            gpus=(device, *gpus(1)[1:]), groups=(group("tp", Server("tp", tensor_parallel=2)),)
        )
    )
    assert {r.reason for r in result.refusals} == {p.TOPOLOGY_NOT_SATISFIABLE}


def test_mig_utilization_is_of_the_instance():
    device = GpuDevice(0, H100, 80 * GIB, mig=(MigInstance("3g.40gb", 40 * GIB),))
    result = plan(PlanRequest(gpus=(device,), groups=(small("a", 10 * GIB),)))
    assert result.groups[0].servers[0].gpu_memory_utilization == 0.25


def test_bad_input_is_refused_before_planning():
    with pytest.raises(PlanInputError, match="unique"):
        plan(PlanRequest(gpus=(GpuDevice(0, H100, 1), GpuDevice(0, H100, 1))))
    with pytest.raises(PlanInputError, match="not both"):
        plan(
            PlanRequest(
                gpus=gpus(1), groups=(group("a", Server("a", memory_mib=1, memory_fraction=0.1)),)
            )
        )


# -- properties --------------------------------------------------------------------------------

server_st = st.builds(
    Server,
    name=st.just("x"),
    memory_mib=st.one_of(st.none(), st.integers(256, 90 * GIB)),
    exclusive=st.booleans(),
    tensor_parallel=st.sampled_from([1, 1, 1, 2, 4]),
    sleep_residue_mib=st.integers(0, 8 * GIB),
)


@st.composite
def requests(draw) -> PlanRequest:
    n = draw(st.integers(1, 6))
    devices = []
    for i in range(n):
        mib = draw(st.sampled_from([24 * GIB, 40 * GIB, 80 * GIB]))
        mig = ()
        if draw(st.integers(0, 5)) == 0:
            mig = (MigInstance("a", mib // 2), MigInstance("b", mib // 4))
        devices.append(
            GpuDevice(
                i,
                draw(st.sampled_from([H100, "A100"])),
                mib,
                mig=mig,
                nvlink_group=draw(st.one_of(st.none(), st.integers(0, 1))),
                numa_node=draw(st.one_of(st.none(), st.integers(0, 1))),
            )
        )
    groups = []
    for gi in range(draw(st.integers(0, 6))):
        first = draw(server_st)
        if first.whole_gpus:
            servers = (
                Server(
                    f"g{gi}s0",
                    first.memory_mib,
                    None,
                    first.exclusive,
                    first.tensor_parallel,
                    first.sleep_residue_mib,
                ),
            )
        else:
            k = draw(st.integers(1, 3))
            servers = tuple(
                Server(
                    f"g{gi}s{j}",
                    draw(st.integers(256, 30 * GIB)),
                    sleep_residue_mib=draw(st.integers(0, 6 * GIB)),
                )
                for j in range(k)
            )
        groups.append(
            ServerGroup(f"g{gi}", servers, gpu_type=draw(st.sampled_from([None, None, "a100"])))
        )
    trainers = tuple(
        Trainer(f"t{i}", draw(st.one_of(st.none(), st.integers(1024, 70 * GIB))))
        for i in range(draw(st.integers(0, 3)))
    )
    return PlanRequest(
        gpus=tuple(devices),
        groups=tuple(groups),
        trainers=trainers,
        policy=draw(st.sampled_from(["binpack", "spread"])),
        safety_margin_mib=draw(st.sampled_from([0, 1024])),
    )


@settings(max_examples=120, deadline=None)
@given(requests())
def test_never_over_commits_a_target_in_either_posture(req: PlanRequest):
    result = plan(req)
    margin = req.safety_margin_mib
    for u in result.usage:
        assert u.awake_mib + margin <= u.total_mib or u.awake_mib == 0, u
        assert u.residue_mib + u.trainer_mib + margin <= u.total_mib or not u.trainer_mib, u
    flags: dict[tuple[int, str | None], float] = {}
    for g in result.groups:
        for index in g.gpu_indices:
            for s in g.servers:
                flags[(index, g.mig)] = flags.get((index, g.mig), 0) + s.gpu_memory_utilization
    assert all(total <= 1.0 + 1e-9 for total in flags.values()), flags


@settings(max_examples=120, deadline=None)
@given(requests())
def test_every_workload_is_placed_or_refused_with_a_named_reason(req: PlanRequest):
    result = plan(req)
    placed = {g.name for g in result.groups} | {t.name for t in result.trainers}
    refused = {r.workload for r in result.refusals}
    assert placed | refused == {w.name for w in (*req.groups, *req.trainers)}
    assert not placed & refused
    assert all(r.reason in p.REASONS and r.detail for r in result.refusals)


@settings(max_examples=120, deadline=None)
@given(requests())
def test_whole_gpu_groups_are_alone_and_tp_groups_have_their_width(req: PlanRequest):
    result = plan(req)
    wanted = {g.name: g for g in req.groups}
    # A MIG instance is a target of its own: "whole" means the whole instance.
    owners: dict[tuple[int, str | None], set[str]] = {}
    for g in result.groups:
        for index in g.gpu_indices:
            owners.setdefault((index, g.mig), set()).add(g.name)
    for t in result.trainers:
        owners.setdefault((t.gpu_index, t.mig), set()).add(t.name)
    for g in result.groups:
        if wanted[g.name].whole_gpus:
            assert len(g.gpu_indices) == wanted[g.name].width
            assert len(set(g.gpu_indices)) == len(g.gpu_indices)
            assert g.mig is None or wanted[g.name].width == 1
            for index in g.gpu_indices:
                assert owners[(index, g.mig)] == {g.name}


@settings(max_examples=80, deadline=None)
@given(requests())
def test_the_same_input_gives_the_same_plan(req: PlanRequest):
    assert plan(req) == plan(req)
    # and the order workloads are listed in does not matter
    shuffled = PlanRequest(
        gpus=tuple(reversed(req.gpus)),
        groups=tuple(reversed(req.groups)),
        trainers=tuple(reversed(req.trainers)),
        policy=req.policy,
        safety_margin_mib=req.safety_margin_mib,
    )
    assert plan(shuffled).groups == plan(req).groups
