"""GPU facts: NVML on real hosts, a shared state file for simulated ones.

Keep this package's `__init__` empty: the simulated trainer imports `sim_state` with nothing but
the standard library available.
"""
