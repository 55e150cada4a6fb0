"""The HTTP edge both servers share: uvicorn's protocol with deadlines and limits, and the bounds.

`supervisor` serves it as it is (`python -m supervisor`); the control plane's `manage.py serve`
subclasses it with its chat direct path (fleets/server/protocol.py). Standard library and uvicorn
only, so a GPU host's base install carries it and `supervisor` never imports `fleets`.
"""
