"""Pure decision core of the control plane: no Django, no I/O.

Plain dataclasses in, plain values out, so every rule here is exhaustively unit-testable and
the services, the reconciler and the API share one source of truth.
"""
