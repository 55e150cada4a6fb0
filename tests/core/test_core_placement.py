"""GPU placement: every refusal reason, binpack vs spread, exclusivity, NUMA binding."""

from __future__ import annotations

import pytest

from fleets.core.placement import Gpu, GpuRequest, PlacementRefused, place

H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, **kw) -> Gpu:
    kw.setdefault("total_mib", 80_000)
    kw.setdefault("type", H100)
    kw.setdefault("uuid", f"GPU-{index}")
    return Gpu(index=index, **kw)


def refusal(gpus, request, **kw) -> PlacementRefused:
    with pytest.raises(PlacementRefused) as err:
        place(gpus, request, **kw)
    return err.value


def only_reason(gpus, request) -> str:
    reasons = refusal(gpus, request).reasons
    assert len(reasons) == len(gpus)
    return reasons[0].reason


def test_an_empty_host_takes_a_small_request_on_one_card():
    placement = place([gpu(0)], GpuRequest(mem_mib=10_000))
    assert placement.gpu_indices == (0,)
    assert placement.mem_mib == {0: 10_000}
    assert placement.scores[0] == pytest.approx(1.25)  # (0 + 10000/80000) x 10


def test_binpack_fills_the_busiest_card_and_spread_the_emptiest():
    gpus = [gpu(0, allocated_mib=40_000, tasks=1), gpu(1), gpu(2, allocated_mib=20_000, tasks=1)]
    request = GpuRequest(mem_mib=8_000)
    assert place(gpus, request, policy="binpack").gpu_indices == (0,)
    assert place(gpus, request, policy="spread").gpu_indices == (1,)


def test_cores_count_in_the_score():
    gpus = [gpu(0, cores_used=60, tasks=1), gpu(1, cores_used=10, tasks=1)]
    placement = place(gpus, GpuRequest(mem_mib=8_000, cores=20), policy="binpack")
    assert placement.gpu_indices == (0,)
    assert placement.scores == {0: pytest.approx(9.0), 1: pytest.approx(4.0)}


def test_numa_breaks_score_ties_by_policy():
    gpus = [gpu(0, numa=0), gpu(1, numa=1)]
    assert place(gpus, GpuRequest(), policy="binpack").gpu_indices == (1,)
    assert place(gpus, GpuRequest(), policy="spread").gpu_indices == (0,)


def test_multi_gpu_request_takes_the_best_cards_in_order():
    gpus = [gpu(0, allocated_mib=10_000), gpu(1, allocated_mib=30_000), gpu(2)]
    assert place(gpus, GpuRequest(count=2), policy="binpack").gpu_indices == (1, 0)
    assert place(gpus, GpuRequest(count=2), policy="spread").gpu_indices == (2, 0)


def test_memory_percentage_is_taken_of_each_card():
    gpus = [gpu(0, total_mib=24_000)]
    assert place(gpus, GpuRequest(mem_percent=50)).mem_mib == {0: 12_000}


def test_default_memory_is_hamis_5000_mib():
    assert place([gpu(0)], GpuRequest()).mem_mib == {0: 5000}


def test_exclusive_request_takes_an_idle_card_only():
    gpus = [gpu(0, tasks=1, allocated_mib=1_000), gpu(1)]
    assert place(gpus, GpuRequest(cores=100), policy="binpack").gpu_indices == (1,)


def test_exclusive_request_on_a_shared_card_is_an_exclusive_conflict():
    assert only_reason([gpu(0, tasks=1)], GpuRequest(cores=100)) == (
        "ExclusiveDeviceAllocateConflict"
    )


def test_nothing_joins_a_card_held_exclusively():
    held = gpu(0, tasks=1, cores_used=100)
    assert only_reason([held], GpuRequest(cores=0)) == "CardComputeUnitsExhausted"
    assert only_reason([held], GpuRequest(cores=10)) == "CardInsufficientCore"


def test_unhealthy_card_is_refused():
    assert only_reason([gpu(0, healthy=False)], GpuRequest()) == "CardNotHealth"


def test_insufficient_memory_counts_granted_memory():
    refused = refusal([gpu(0, allocated_mib=76_000)], GpuRequest(mem_mib=5_000))
    assert refused.code == "CardInsufficientMemory"
    assert "needs 5000 MiB, 4000 of 80000 free" in refused.reasons[0].detail


def test_insufficient_memory_also_counts_memory_seen_by_nvml():
    # A sleeping vLLM keeps its CUDA context: granted nothing, yet that memory is gone.
    sleeping = gpu(0, allocated_mib=0, used_mib=78_000)
    assert only_reason([sleeping], GpuRequest(mem_mib=5_000)) == "CardInsufficientMemory"


def test_insufficient_core_is_refused():
    assert only_reason([gpu(0, cores_used=70, tasks=2)], GpuRequest(cores=40)) == (
        "CardInsufficientCore"
    )


def test_type_include_and_exclude_are_case_insensitive_substrings():
    gpus = [gpu(0, type="NVIDIA A100-SXM4-40GB"), gpu(1)]
    assert place(gpus, GpuRequest(use_types=("h100",))).gpu_indices == (1,)
    assert place(gpus, GpuRequest(nouse_types=("H100",))).gpu_indices == (0,)
    assert only_reason([gpu(0)], GpuRequest(use_types=("A100",))) == "CardTypeMismatch"
    assert only_reason([gpu(0)], GpuRequest(nouse_types=("nvidia",))) == "CardTypeMismatch"


def test_uuid_include_and_exclude():
    gpus = [gpu(0), gpu(1)]
    assert place(gpus, GpuRequest(use_uuids=("GPU-1",))).gpu_indices == (1,)
    assert place(gpus, GpuRequest(nouse_uuids=("GPU-0",)), policy="spread").gpu_indices == (1,)
    assert only_reason([gpu(0)], GpuRequest(use_uuids=("GPU-9",))) == "CardUuidMismatch"
    assert only_reason([gpu(0)], GpuRequest(nouse_uuids=("GPU-0",))) == "CardUuidMismatch"


def test_time_slicing_is_exhausted_at_the_split_count():
    assert only_reason([gpu(0, tasks=10)], GpuRequest(mem_mib=1)) == "CardTimeSlicingExhausted"
    assert place([gpu(0, tasks=9)], GpuRequest(mem_mib=1)).gpu_indices == (0,)
    assert only_reason([gpu(0, tasks=2, split_count=2)], GpuRequest(mem_mib=1)) == (
        "CardTimeSlicingExhausted"
    )


def test_more_gpus_than_the_host_has_is_node_insufficient_device():
    refused = refusal([gpu(0), gpu(1)], GpuRequest(count=3))
    assert refused.code == "NodeInsufficientDevice"
    assert [r.reason for r in refused.reasons] == ["AllocatedCardsInsufficientRequest"] * 2
    assert refusal([], GpuRequest()).code == "NodeInsufficientDevice"


def test_too_few_fitting_cards_explains_every_card():
    gpus = [gpu(0, healthy=False), gpu(1), gpu(2, allocated_mib=79_000)]
    refused = refusal(gpus, GpuRequest(count=2))
    assert [(r.index, r.reason) for r in refused.reasons] == [
        (0, "CardNotHealth"),
        (1, "AllocatedCardsInsufficientRequest"),
        (2, "CardInsufficientMemory"),
    ]
    assert "GPU 0: reported unhealthy" in str(refused)


def test_numa_bind_keeps_every_card_on_one_node():
    gpus = [gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1), gpu(3, numa=0, healthy=False)]
    placement = place(gpus, GpuRequest(count=2, numa_bind=True))
    assert sorted(placement.gpu_indices) == [1, 2]


def test_numa_bind_without_a_node_that_fits_is_numa_not_fit():
    gpus = [gpu(0, numa=0), gpu(1, numa=1)]
    refused = refusal(gpus, GpuRequest(count=2, numa_bind=True))
    assert refused.code == "NumaNotFit"
    assert {r.reason for r in refused.reasons} == {"NumaNotFit"}
    # Without the binding the same two cards are fine.
    assert sorted(place(gpus, GpuRequest(count=2)).gpu_indices) == [0, 1]


def test_numa_bind_picks_the_node_the_policy_prefers():
    gpus = [
        gpu(0, numa=0, allocated_mib=40_000),
        gpu(1, numa=0, allocated_mib=40_000),
        gpu(2, numa=1),
        gpu(3, numa=1),
    ]
    request = GpuRequest(count=2, numa_bind=True)
    assert sorted(place(gpus, request, policy="binpack").gpu_indices) == [0, 1]
    assert sorted(place(gpus, request, policy="spread").gpu_indices) == [2, 3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mem_mib": 1, "mem_percent": 10},
        {"mem_mib": 0},
        {"mem_percent": 101},
        {"cores": 101},
        {"cores": -1},
        {"count": 0},
    ],
)
def test_malformed_requests_are_programming_errors(kwargs):
    with pytest.raises(ValueError):
        GpuRequest(**kwargs)


def test_unknown_policy_and_zero_sized_gpu_are_refused():
    with pytest.raises(ValueError, match="policy"):
        place([gpu(0)], GpuRequest(), policy="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="total_mib"):
        gpu(0, total_mib=0)


def test_duplicate_gpu_indices_are_refused():
    with pytest.raises(ValueError, match="unique"):
        place([gpu(0), gpu(0)], GpuRequest())
