"""Each engine adapter's exact command line and environment, for the layouts that matter."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from supervisor.engines.launch import LaunchContext
from supervisor.engines.profile import EngineProfile, parse_profile
from supervisor.engines.registry import default_registry

REGISTRY = default_registry()
# Named like a secret: a word of TOKEN, SECRET, KEY or PASSWORD anywhere in the name, in any
# case. None of these may reach a model server, whichever engine runs it.
SECRET_NAMED = {
    "HARU_SUPERVISOR_TOKEN": "s3cret-token",
    "HARU_API_TOKEN": "api-token",
    "HARU_SUPERVISOR_MASTER_KEY": "master",
    "HF_TOKEN": "hf-token",
    "hf_token": "hf-token-lower",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "OPENAI_API_KEY": "sk-",
    "Db_Password": "pw",
    "mySecretThing": "x",
    "SSH_KEYFILE": "/root/.ssh/id",
    "TOKENIZERS_SECRET_SALT": "y",
}
PARENT_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/op",
    "HF_HOME": "/models",
    "HARU_SUPERVISOR_CONFIG": "/etc/haru/supervisor.json",
    **SECRET_NAMED,
}
ENGINES = ["vllm", "sglang", "llamacpp", "sim"]
FABRIC = {"name": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]}


def make_profile(model: str = "qwen-small", gpu_index: int = 0, **fields: Any) -> EngineProfile:
    errors: list[str] = []
    profile = parse_profile(
        fields,
        "profile",
        errors,
        model_name=model,
        default_gpu_index=gpu_index,
        engine_names=REGISTRY.names(),
    )
    assert not errors, errors
    assert profile is not None
    assert REGISTRY.get(profile.engine).validate(profile, {}) == []
    return profile


def build(profile: EngineProfile, port: int = 8001, sharing: int = 1, host_env=None, environ=None):
    ctx = LaunchContext(
        port=port,
        environ=PARENT_ENV if environ is None else environ,
        servers_sharing_gpu=sharing,
        host_env=host_env or {},
    )
    return REGISTRY.get(profile.engine).build(profile, ctx)


SINGLE_NODE_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_IB_DISABLE": "1"}


# -- vLLM ----------------------------------------------------------------------------------------


def test_vllm_single_gpu_command_and_env():
    launch = build(make_profile(engine="vllm", modelPath="Qwen/Qwen2.5-0.5B-Instruct"))
    assert launch.argv == (
        "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct",
        "--served-model-name", "qwen-small",
        "--host", "127.0.0.1", "--port", "8001",
        "--enable-sleep-mode",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
    )  # fmt: skip
    assert launch.generated_env == {
        **SINGLE_NODE_ENV,
        "CUDA_VISIBLE_DEVICES": "0",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    assert launch.serves_http is True


def test_vllm_env_is_complete_and_never_carries_the_supervisor_secrets():
    launch = build(make_profile(engine="vllm", modelPath="m"))
    assert launch.env["PATH"] == "/usr/bin"
    assert launch.env["HF_HOME"] == "/models"
    assert not SECRET_NAMED.keys() & launch.env.keys()
    assert "HARU_SUPERVISOR_CONFIG" not in launch.env
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_inherits_anything_named_like_a_secret(engine):
    launch = build(make_profile(engine=engine, modelPath="/m"))
    leaked = sorted(SECRET_NAMED.keys() & launch.env.keys())
    assert not leaked, f"{engine} would inherit {leaked}"
    assert not any(v in launch.env.values() for v in SECRET_NAMED.values())
    # What engines need is inherited: the process basics and the families they read.
    assert (launch.env["PATH"], launch.env["HOME"], launch.env["HF_HOME"]) == (
        "/usr/bin",
        "/home/op",
        "/models",
    )
    assert "HARU_SUPERVISOR_CONFIG" not in launch.env


@pytest.mark.parametrize("engine", ENGINES)
def test_a_name_the_operator_allows_reaches_every_engine_and_only_that_one(engine):
    environ = {**PARENT_ENV, "HARU_CHILD_ENV_ALLOW": " HF_TOKEN , "}
    launch = build(make_profile(engine=engine, modelPath="/m"), environ=environ)
    assert launch.env["HF_TOKEN"] == "hf-token"
    assert sorted(SECRET_NAMED.keys() & launch.env.keys()) == ["HF_TOKEN"]


# Secrets under names no deny-list knows (issue 29): only an allow-list keeps them home.
UNLISTED_SECRETS = {
    "DATABASE_URL": "postgres://haru:db-pass-4821@db.internal/haru",
    "SECRET_THING": "thing-7731",
    "SENTRY_DSN": "https://dsn-0192@sentry.io/1",
    "HTTPS_PROXY": "http://proxy-user:proxy-pass-553@proxy.internal:3128",
    "http_proxy": "proxy-user:proxy-pass-553@proxy.internal:3128",
}


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_inherits_a_secret_under_a_name_off_the_allow_list(engine, caplog):
    environ = {
        **PARENT_ENV,
        **UNLISTED_SECRETS,
        "NO_PROXY": "localhost,127.0.0.1",
        "CUDA_CACHE_PATH": "/cache/cuda",
        "VLLM_LOGGING_LEVEL": "INFO",
        "LC_ALL": "C.UTF-8",
    }
    with caplog.at_level("WARNING", logger="supervisor.child_env"):
        launch = build(make_profile(engine=engine, modelPath="/m"), environ=environ)
    assert not UNLISTED_SECRETS.keys() & launch.env.keys()
    assert not any(secret in v for v in launch.env.values() for secret in ("pass", "7731"))
    # The families engines read pass, and a proxy without credentials.
    assert launch.env["CUDA_CACHE_PATH"] == "/cache/cuda"
    assert launch.env["VLLM_LOGGING_LEVEL"] == "INFO" and launch.env["LC_ALL"] == "C.UTF-8"
    assert launch.env["NO_PROXY"] == "localhost,127.0.0.1"
    # The proxy with credentials is named in a warning, its value never.
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "HTTPS_PROXY carries credentials" in warned and "http_proxy carries" in warned
    assert "proxy-pass" not in warned and "proxy-user" not in warned


def test_a_proxy_without_credentials_reaches_the_engine():
    environ = {**PARENT_ENV, "HTTPS_PROXY": "http://proxy.internal:3128"}
    launch = build(make_profile(engine="vllm", modelPath="/m"), environ=environ)
    assert launch.env["HTTPS_PROXY"] == "http://proxy.internal:3128"


def test_the_operator_may_allow_a_family_by_prefix():
    environ = {
        **PARENT_ENV,
        "MYCO_CACHE": "/c",
        "MYCO_MODE": "fast",
        "HARU_CHILD_ENV_ALLOW": "MYCO_*",
    }
    launch = build(make_profile(engine="vllm", modelPath="/m"), environ=environ)
    assert (launch.env["MYCO_CACHE"], launch.env["MYCO_MODE"]) == ("/c", "fast")
    assert "HARU_CHILD_ENV_ALLOW" not in launch.env


def test_vllm_shared_gpu_splits_memory_between_the_servers():
    launch = build(make_profile(engine="vllm", modelPath="m"), sharing=2)
    assert launch.argv[-2:] == ("--gpu-memory-utilization", "0.45")
    three = build(make_profile(engine="vllm", modelPath="m"), sharing=3)
    assert three.argv[-2:] == ("--gpu-memory-utilization", "0.3")


def test_vllm_explicit_memory_fraction_wins_over_the_shared_default():
    launch = build(make_profile(engine="vllm", modelPath="m", gpuMemoryUtilization=0.6), sharing=2)
    assert launch.argv[-2:] == ("--gpu-memory-utilization", "0.6")


def test_vllm_alone_on_its_gpu_keeps_the_engine_default_memory_fraction():
    launch = build(make_profile(engine="vllm", modelPath="m"))
    assert "--gpu-memory-utilization" not in launch.argv


def test_vllm_tensor_parallel_two_pins_both_gpus():
    profile = make_profile(
        gpu_index=2, engine="vllm", modelPath="m", tensorParallel=2, gpus=[2, 3], quantization="fp8"
    )
    launch = build(profile)
    assert launch.argv == (
        "vllm", "serve", "m", "--served-model-name", "qwen-small",
        "--host", "127.0.0.1", "--port", "8001", "--enable-sleep-mode",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
        "--quantization", "fp8",
    )  # fmt: skip
    assert launch.generated_env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert launch.generated_env["NCCL_IB_DISABLE"] == "1"


TWO_NODES = dict(
    engine="vllm",
    modelPath="meta-llama/Llama-3.1-70B-Instruct",
    tensorParallel=2,
    pipelineParallel=2,
    nodes=2,
    gpus=[0, 1],
    leaderAddr="10.0.0.1",
    leaderPort=29500,
    managementInterface="eth0",
)


def test_vllm_two_nodes_with_a_fabric_limits_nccl_to_its_adapters():
    launch = build(make_profile(model="llama-big", fabric=FABRIC, **TWO_NODES))
    assert launch.argv == (
        "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "llama-big",
        "--host", "127.0.0.1", "--port", "8001", "--enable-sleep-mode",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
        "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
        "--master-addr", "10.0.0.1", "--master-port", "29500",
    )  # fmt: skip
    assert launch.generated_env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    assert launch.serves_http is True


def test_vllm_two_nodes_without_a_fabric_disables_infiniband():
    launch = build(make_profile(model="llama-big", **TWO_NODES))
    env = launch.generated_env
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_vllm_worker_rank_runs_headless_and_serves_no_http():
    launch = build(make_profile(model="llama-big", nodeRank=1, fabric=FABRIC, **TWO_NODES))
    assert launch.argv[-3:] == ("--master-port", "29500", "--headless")
    assert "--node-rank" in launch.argv
    assert launch.argv[launch.argv.index("--node-rank") + 1] == "1"
    assert launch.serves_http is False


def test_profile_env_overrides_win_over_generated_and_inherited_variables():
    launch = build(
        make_profile(
            engine="vllm",
            modelPath="m",
            env={"NCCL_IB_DISABLE": "0", "HF_HOME": "/fast/models", "VLLM_SERVER_DEV_MODE": "1"},
        ),
        host_env={"HARU_SIM_GPU_STATE": "/tmp/x.json"},
    )
    assert launch.env["NCCL_IB_DISABLE"] == "0"
    assert launch.env["HF_HOME"] == "/fast/models"
    assert launch.generated_env["HF_HOME"] == "/fast/models"
    assert launch.env["HARU_SIM_GPU_STATE"] == "/tmp/x.json"


def test_extra_args_are_passed_through_last_and_untouched():
    launch = build(
        make_profile(engine="vllm", modelPath="m", extraArgs=["--max-model-len", "8192"])
    )
    assert launch.argv[-2:] == ("--max-model-len", "8192")


def test_executable_override_replaces_the_binary():
    launch = build(make_profile(engine="vllm", modelPath="m", executable="/opt/vllm/bin/vllm"))
    assert launch.argv[:2] == ("/opt/vllm/bin/vllm", "serve")


# -- SGLang --------------------------------------------------------------------------------------


def test_sglang_single_gpu_command_and_env():
    launch = build(make_profile(engine="sglang", modelPath="Qwen/Qwen2.5-7B-Instruct"))
    assert launch.argv == (
        "python3", "-m", "sglang.launch_server",
        "--model-path", "Qwen/Qwen2.5-7B-Instruct",
        "--served-model-name", "qwen-small",
        "--host", "127.0.0.1", "--port", "8001",
        "--tp-size", "1", "--pp-size", "1",
        "--enable-memory-saver",
    )  # fmt: skip
    assert launch.generated_env == {**SINGLE_NODE_ENV, "CUDA_VISIBLE_DEVICES": "0"}


def test_sglang_shared_gpu_sets_the_static_memory_fraction():
    launch = build(make_profile(engine="sglang", modelPath="m"), sharing=2)
    assert launch.argv[-2:] == ("--mem-fraction-static", "0.45")


def test_sglang_tensor_parallel_two():
    launch = build(make_profile(engine="sglang", modelPath="m", tensorParallel=2, gpus=[0, 1]))
    assert launch.argv[launch.argv.index("--tp-size") + 1] == "2"
    assert launch.generated_env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_sglang_two_nodes_with_and_without_fabric():
    fields = {**TWO_NODES, "engine": "sglang"}
    with_fabric = build(make_profile(model="llama-big", fabric=FABRIC, **fields))
    assert with_fabric.argv[-6:] == (
        "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:29500",
    )  # fmt: skip
    assert with_fabric.generated_env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    without = build(make_profile(model="llama-big", **fields))
    assert without.generated_env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in without.generated_env
    assert without.generated_env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_sglang_env_override():
    launch = build(make_profile(engine="sglang", modelPath="m", env={"CUDA_VISIBLE_DEVICES": "7"}))
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "7"


# -- llama.cpp -----------------------------------------------------------------------------------


def test_llamacpp_single_gpu_command_and_env():
    launch = build(make_profile(engine="llamacpp", modelPath="/models/qwen-q4_k_m.gguf"))
    assert launch.argv == (
        "llama-server", "--model", "/models/qwen-q4_k_m.gguf", "--alias", "qwen-small",
        "--host", "127.0.0.1", "--port", "8001", "--n-gpu-layers", "999",
    )  # fmt: skip
    assert launch.generated_env == {**SINGLE_NODE_ENV, "CUDA_VISIBLE_DEVICES": "0"}


def test_llamacpp_shared_gpu_gets_no_memory_fraction():
    launch = build(make_profile(engine="llamacpp", modelPath="/m.gguf"), sharing=2)
    assert not any("memory" in a for a in launch.argv)


def test_llamacpp_tensor_parallel_two_splits_by_rows():
    launch = build(
        make_profile(engine="llamacpp", modelPath="/m.gguf", tensorParallel=2, gpus=[0, 1])
    )
    assert launch.argv[-2:] == ("--split-mode", "row")
    assert launch.generated_env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_llamacpp_env_override():
    launch = build(make_profile(engine="llamacpp", modelPath="/m.gguf", env={"GGML_X": "1"}))
    assert launch.env["GGML_X"] == "1"


# -- simulated -----------------------------------------------------------------------------------


def test_sim_single_gpu_command_and_env():
    launch = build(
        make_profile(engine="sim", extraArgs=["--weights-mib", "6144"]),
        port=18001,
        host_env={"HARU_SIM_GPU_STATE": "/var/sim.json"},
    )
    assert launch.argv == (
        sys.executable, "-m", "supervisor.sim",
        "--host", "127.0.0.1", "--port", "18001", "--model", "qwen-small", "--gpu-index", "0",
        "--weights-mib", "6144",
    )  # fmt: skip
    assert launch.generated_env == {
        **SINGLE_NODE_ENV,
        "CUDA_VISIBLE_DEVICES": "0",
        "HARU_SIM_GPU_STATE": "/var/sim.json",
    }


def test_sim_shared_and_tensor_parallel_layouts_build():
    shared = build(make_profile(engine="sim"), sharing=2)
    assert "--gpu-memory-utilization" not in shared.argv
    tp2 = build(make_profile(engine="sim", tensorParallel=2, gpus=[0, 1]))
    assert tp2.generated_env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert tp2.argv[tp2.argv.index("--gpu-index") + 1] == "0"


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_binds_loopback_only(engine):
    launch = build(make_profile(engine=engine, modelPath="/m"))
    host = launch.argv[launch.argv.index("--host") + 1]
    assert host == "127.0.0.1"


@pytest.mark.parametrize("engine", ENGINES)
def test_building_starts_nothing_and_is_deterministic(engine):
    profile = make_profile(engine=engine, modelPath="/m")
    assert build(profile) == build(profile)


def test_registry_lists_the_four_engines_and_refuses_unknown_ones():
    assert REGISTRY.names() == ("llamacpp", "sglang", "sim", "vllm")
    with pytest.raises(KeyError, match="unknown engine"):
        REGISTRY.get("tgi")


def test_capabilities_declare_how_each_engine_sleeps():
    vllm = REGISTRY.get("vllm").control.capability
    assert (vllm.mode, vllm.sleep, vllm.wake, vllm.status) == (
        "vllm",
        "POST /sleep?level=1",
        "POST /wake_up",
        "GET /is_sleeping",
    )
    sglang = REGISTRY.get("sglang").control.capability
    assert sglang.sleep == "POST /release_memory_occupation"
    assert sglang.wake == "POST /resume_memory_occupation"
    llama = REGISTRY.get("llamacpp").control.capability
    assert llama.mode == "stop" and llama.levels == () and llama.wake_kind == "cold-start"
    assert REGISTRY.get("sim").control.capability.mode == "vllm"


def test_vllm_on_a_platform_without_sleep_runs_the_api_server_module_without_the_flag():
    profile = make_profile(
        engine="vllm",
        modelPath="/models/tiny",
        executable="/opt/vllm/bin/python",
        entrypoint="api-server",
        sleepMode="api-only",
    )
    launch = build(profile)
    assert launch.argv[:5] == (
        "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
        "/models/tiny",
    )  # fmt: skip
    assert "--enable-sleep-mode" not in launch.argv
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"  # the dev endpoints still answer
    assert launch.fingerprint != build(make_profile(engine="vllm", modelPath="/m")).fingerprint


def test_unknown_sleep_modes_and_entrypoints_are_refused():
    for field, value in (("sleepMode", "sometimes"), ("entrypoint", "docker")):
        errors: list[str] = []
        parse_profile(
            {"engine": "vllm", field: value},
            "profile",
            errors,
            model_name="m",
            default_gpu_index=0,
            engine_names=REGISTRY.names(),
        )
        assert any(field in e for e in errors)


@pytest.mark.parametrize("marker", ["HARU_LOCAL_HOST_DIR", "HARU_DEMO_RUN", "HARU_DEMO_HOST"])
def test_haru_s_own_process_marks_reach_every_child(marker):
    # The local launcher and the demo find a simulated host's children by these (orphans
    # included): an engine without one would outlive its host's crash.
    environ = {**PARENT_ENV, marker: "/var/haru/hosts/east"}
    launch = build(make_profile(engine="vllm", modelPath="/m"), environ=environ)
    assert launch.env[marker] == "/var/haru/hosts/east"
