"""The supervisor report, normalized once: its stored form reads back as itself, and the rows
stored before that form (the status body as sent) read into the same model."""

from __future__ import annotations

from datetime import UTC, datetime

from fleets.core.report import (
    DomainReport,
    GpuProcess,
    GpuReport,
    HeartbeatNote,
    MigInstance,
    ModelReport,
    PlanMismatch,
    ReadError,
    SlotReport,
    StatusReport,
    TrainingReport,
    read_report,
    stop_answer_trainers,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

# A row as the previous release stored it: the checked `/v1/status` body whole (fields the
# model does not keep included), the `/v1/gpu/memory` list, and the heartbeat note.
OLD_ROW = {
    "slots": [
        {
            "gpuIndex": 0,
            "kind": "inference",
            "models": [
                {
                    "name": "qwen-small",
                    "port": 8001,
                    "sleeping": False,
                    "engine": "sim",
                    "fingerprint": "sha256:aa",
                    "engineVersion": "0.9.1",
                    "managed": True,
                    "role": "leader",
                    "process": {"pid": 11, "state": "running"},
                    "draining": False,
                },
                {"name": "llama-small", "port": 8002, "sleeping": None, "error": "no answer"},
            ],
        },
        {
            "gpuIndex": 0,
            "kind": "training",
            "training": {
                "state": "running",
                "pids": [13],
                "startedAt": "2026-01-01T00:00:00Z",
                "lastCheckpointAt": "2026-01-01T00:00:05Z",
            },
        },
    ],
    "ready": False,
    "stateKnown": False,
    "host": "east",
    "features": ["probe.models", "sleep.drain"],
    "planMismatches": [{"gpuIndex": 0, "code": "gpu_type_mismatch", "message": "GPU 0 is A100"}],
    "gpus": [
        {
            "index": 0,
            "usedMiB": 46000,
            "totalMiB": 81920,
            "name": "NVIDIA H100",
            "uuid": "GPU-1",
            "processes": [{"pid": 11, "usedMiB": 6000}, {"pid": 13, "usedMiB": 40000.0}],
        },
        {
            "index": 1,
            "usedMiB": 20,
            "totalMiB": 80,
            "processes": [],
            "mig": {
                "enabled": True,
                "instances": [
                    {
                        "gpuInstanceId": 3,
                        "usedMiB": 20,
                        "totalMiB": 40,
                        "processes": [{"pid": 14, "usedMiB": 20}],
                    }
                ],
            },
        },
    ],
    "gpusAt": "2026-01-01T00:00:01Z",
    "heartbeat": {"ok": True, "checkedAt": "2026-01-01T00:00:02Z"},
}

MODEL = DomainReport(
    status=StatusReport(
        slots=(
            SlotReport(
                gpu_index=0,
                kind="inference",
                models=(
                    ModelReport(
                        name="qwen-small",
                        sleeping=False,
                        engine_version="0.9.1",
                        fingerprint="sha256:aa",
                        pid=11,
                    ),
                    ModelReport(name="llama-small", sleeping=None, error="no answer"),
                ),
            ),
            SlotReport(
                gpu_index=0,
                kind="training",
                training=TrainingReport(
                    state="running",
                    pids=(13,),
                    checkpoint_at=datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC),
                ),
            ),
        ),
        ready=False,
        features=frozenset({"probe.models", "sleep.drain"}),
        plan_mismatches=(PlanMismatch("gpu_type_mismatch", "GPU 0 is A100", gpu_index=0),),
    ),
    gpus=(
        GpuReport(
            index=0,
            used_mib=46000.0,
            total_mib=81920.0,
            name="NVIDIA H100",
            processes=(GpuProcess(11, 6000.0), GpuProcess(13, 40000.0)),
        ),
        GpuReport(
            index=1,
            used_mib=20.0,
            total_mib=80.0,
            mig_enabled=True,
            mig=(MigInstance(3, 20.0, 40.0, (GpuProcess(14, 20.0),)),),
        ),
    ),
    gpus_at=datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC),
    heartbeat=HeartbeatNote(ok=True, checked_at=datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)),
)


def test_a_row_stored_before_the_normalized_form_reads_into_the_model():
    assert read_report(OLD_ROW) == MODEL


def test_the_stored_form_reads_back_as_the_same_report():
    stored = MODEL.to_json()
    assert read_report(stored) == MODEL
    # Normalized once: storing what was read changes nothing.
    assert read_report(stored).to_json() == stored


def test_the_stored_form_keeps_only_what_the_model_holds():
    stored = MODEL.to_json()
    qwen = stored["slots"][0]["models"][0]
    assert qwen == {
        "name": "qwen-small",
        "sleeping": False,
        "engineVersion": "0.9.1",
        "fingerprint": "sha256:aa",
        "pid": 11,
    }
    assert "host" not in stored and "uuid" not in stored["gpus"][0]
    assert stored["gpus"][0]["processes"][1] == {"pid": 13, "usedMiB": 40000}  # whole: an int
    assert stored["planMismatches"] == OLD_ROW["planMismatches"]


def test_a_failing_heartbeat_and_a_failed_gpu_read_round_trip():
    report = DomainReport(
        gpus_at=T0,
        gpus_error=ReadError("http", "GET /v1/gpu/memory: HTTP 501", status=501, at=T0),
        heartbeat=HeartbeatNote(
            ok=False,
            checked_at=T0,
            failing_since=T0,
            error=ReadError("network", "connection refused"),
        ),
    )
    stored = report.to_json()
    assert stored["heartbeat"] == {
        "ok": False,
        "checkedAt": "2026-01-01T00:00:00Z",
        "error": {"kind": "network", "status": None, "message": "connection refused"},
        "failingSince": "2026-01-01T00:00:00Z",
    }
    assert "slots" not in stored  # no status known: none is made up
    assert read_report(stored) == report


def test_an_empty_row_is_an_empty_report():
    assert read_report({}).empty and read_report(None).empty
    assert DomainReport().to_json() == {}


def test_a_stop_answer_lists_its_trainers_by_gpu_and_nothing_else_counts():
    ours = {
        "status": "ok",
        "slots": [
            {"gpuIndex": 1, "state": "idle", "pids": [], "lastExitCode": -9},
            {"gpuIndex": 0, "state": "stopping", "pids": [41, "x"]},
            {"gpuIndex": 0, "state": "idle"},  # a second entry for a GPU is not read
        ],
    }
    assert stop_answer_trainers(ours) == {
        1: TrainingReport(state="idle"),
        0: TrainingReport(state="stopping", pids=(41,)),
    }
    # The original's answer, and bodies off the contract: nothing listed.
    for body in ({"status": "ok"}, None, [], {"slots": "all"}, {"slots": [{"gpuIndex": -1}, 3]}):
        assert stop_answer_trainers(body) == {}
