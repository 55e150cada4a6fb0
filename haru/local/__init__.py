"""One local Haru: the server, supervisors with simulated engines and trainers, and Celery, as
real processes on this machine, for the demo, the test tiers and the benchmarks.

- ports: `common/ports.py` (free ports outside the kernel's ephemeral range, and "is this port
  free"), in `common/` so that the GPU host's benchmark can use it without Django.
- `processes`: start in a session of its own, wait until ready, stop by process group, each
  with a bounded deadline.
- `supervisors`: a simulated GPU host (config, `python -m supervisor`, its calls).
- `layouts`: the fleet layouts the local hosts make up.
- `server`: `manage.py` steps and `manage.py serve` with its environment.
- `backing`: Celery worker and beat, and a PostgreSQL cluster and Redis of one's own.
- `upstream`: a fast OpenAI-shaped upstream on a thread, where no engine is wanted.
- `ticks`: a fleet ticked from this process (Django set up), until a condition holds.

It runs from a checkout (it starts `manage.py` and reads `examples/`). An entry point: of the
agent it uses only `supervisor.config` and `supervisor.records`.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
