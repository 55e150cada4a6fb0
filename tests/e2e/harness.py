"""Real processes for end-to-end tests: simulated GPU hosts (supervisor + sim engines + sim
trainer) and the Haru server, on free ports, in a private work directory each.

The processes are the local launcher's (haru/local/); this module names what the e2e tests
use of it, so they import from one place.
"""

from __future__ import annotations

from common.ports import free_port, port_free
from haru.local import PYTHON, REPO
from haru.local.layouts import FAST_POLICY, fleet_layout
from haru.local.processes import exited, kill_group, kill_group_of, pids_with_env, wait_for
from haru.local.server import ServerProc
from haru.local.supervisors import MODELS, TOKEN, SimHost, put_in_standby_posture

__all__ = [
    "FAST_POLICY",
    "MODELS",
    "PYTHON",
    "REPO",
    "TOKEN",
    "ServerProc",
    "SimHost",
    "exited",
    "fleet_layout",
    "free_port",
    "kill_group",
    "kill_group_of",
    "pids_with_env",
    "port_free",
    "put_in_standby_posture",
    "wait_for",
]
