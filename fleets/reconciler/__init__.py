"""The reconciler: heartbeats, escalation, failover detection and the step executors.

Entry points: `tick.tick_run(fleet_id=...)` (one locked tick), `loop.ReconcileLoop` (the
embedded default's in-process loop) and `fleets.tasks` (Celery). Supervisor HTTP never runs
inside a database transaction; every state change goes through `fleets.services`.
"""
