"""Haru's per-GPU-host supervisor: model servers, trainers and GPU facts behind one HTTP API.

Keep this package free of Django and of heavy imports at package level: the simulated trainer
(`python -m supervisor.sim.trainer`) imports it with nothing but the standard library.
"""
