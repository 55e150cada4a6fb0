"""Simulated model server and trainer, for demos and tests on machines without GPUs.

`python -m supervisor.sim` runs the engine; `python -m supervisor.sim.trainer` the trainer.
Keep this `__init__` free of imports: the trainer must start with the standard library only.
"""
