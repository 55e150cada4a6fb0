"""What a child (a model server, a trainer) inherits of the supervisor's environment: an
allow-list.

A deny-list by name let `DATABASE_URL` with its password, an `HTTPS_PROXY` with credentials and
every secret under a name nobody thought of reach each model server and trainer. Only what
engines and trainers need passes: the process basics, the locale, and the families CUDA, NCCL,
PyTorch, Triton, Hugging Face and the engines read (their caches, their tuning). Within those, a
name containing TOKEN, SECRET, KEY or PASSWORD is still dropped (`HF_TOKEN`), and a proxy URL
with `user:password@` is dropped with a warning naming the variable, never its value. The
operator adds names (or `PREFIX*` families) with HARU_CHILD_ENV_ALLOW; a name listed there passes
as it is, credentials included (a gated model's `HF_TOKEN`, a proxy that needs them). What the
contract and the profile add on top is never filtered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

from supervisor.settings import SupervisorSettings

log = logging.getLogger(__name__)

# Process basics: where programs, libraries, home and scratch space are, and Python's own
# (the simulated engine and trainers are `python -m ...` from the supervisor's checkout).
BASIC_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "VIRTUAL_ENV",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "DO_NOT_TRACK",
    }
)
# Marks Haru's own launchers put on every process of a simulated host (fleets/base/setting_table.py,
# "own processes"), so that a host's crash or stop finds its children, orphans included, by
# their environment (haru/local/processes.py `pids_with_env`). Paths and run ids, no secret.
OWN_PROCESS_MARKS = frozenset({"HARU_LOCAL_HOST_DIR", "HARU_DEMO_RUN", "HARU_DEMO_HOST"})
# Families engines and trainers read: the locale, the GPU stack, the collective libraries, the
# frameworks, the model hub and its caches, the engines' own settings.
ALLOWED_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "GLOO_",
    "UCX_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "TRITON_",
    "XDG_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "VLLM_",
    "SGLANG_",
    "LLAMA_",
    "GGML_",
)
# Passed without credentials only: downloading weights through a proxy is common, the proxy's
# password is not the model server's to hold.
PROXY_NAMES = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    }
)
# A name with one of these words is a credential, even inside an allowed family.
SECRET_NAME_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD")
CHILD_ENV_ALLOW = SupervisorSettings.child_env_allow.env


def operator_allowed(environ: Mapping[str, str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The names and `PREFIX*` families HARU_CHILD_ENV_ALLOW lists."""
    entries = [n.strip() for n in environ.get(CHILD_ENV_ALLOW, "").split(",") if n.strip()]
    names = frozenset(e for e in entries if not e.endswith("*"))
    prefixes = tuple(e[:-1] for e in entries if e.endswith("*") and len(e) > 1)
    return names, prefixes


def carries_credentials(url: str) -> bool:
    """Whether a proxy URL (`http://u:p@host:3128`, or `u:p@host:3128` without a scheme)
    names a user."""
    try:
        authority = urlsplit(url if "://" in url else f"//{url}").netloc
    except ValueError:
        return True  # unparsable: never guess it is clean
    return "@" in authority


def _allowed(name: str) -> bool:
    if name in OWN_PROCESS_MARKS:
        return True
    if name not in BASIC_NAMES and not name.startswith(ALLOWED_PREFIXES):
        return False
    return not any(word in name.upper() for word in SECRET_NAME_WORDS)


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the supervisor's environment a child inherits (module docstring)."""
    names, prefixes = operator_allowed(environ)
    out: dict[str, str] = {}
    for name, value in environ.items():
        if name in names or (prefixes and name.startswith(prefixes)):
            out[name] = value
        elif name in PROXY_NAMES:
            if carries_credentials(value):
                log.warning(
                    "%s carries credentials (user:password@): not passed to model servers and "
                    "trainers (list it in %s to pass it)",
                    name,
                    CHILD_ENV_ALLOW,
                )
            else:
                out[name] = value
        elif _allowed(name):
            out[name] = value
    return out
