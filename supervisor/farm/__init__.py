"""The fleet farm: many simulated GPU hosts in one process, for benchmarks and tests at scale.

Each host is a real supervisor (`supervisor.host.Host` behind `supervisor.api`'s app and the
supervisor's own HTTP edge) over simulated model servers (`supervisor.sim.engine`), each on a
loopback port of its own, so the control plane sees distinct URLs and tokens exactly as it sees
real machines. One asyncio loop serves them all; nothing is spawned per host.

- `common/farm_manifest.py`: which hosts, on which ports, with which tokens (the manifest both
  sides read: the farm and the control plane's seeding, `haru/local/farm_fleets.py`).
- `listeners`: one loopback listener per app, with the faults a network shows (crash, slow,
  partition).
- `transport`: the supervisor's calls to its own model servers, in process.
- `hosts`: one simulated host (supervisor, engines, listeners, faults).
- `control`: the farm's own loopback API (list hosts, set faults, stats).
- `__main__`: `python -m supervisor.farm --hosts N`.
"""
