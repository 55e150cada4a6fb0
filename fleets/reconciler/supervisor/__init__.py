"""The control plane's client of the supervisors.

- `client.py`: `SupervisorClient`, one method per call of the wire contract, and `client_for`;
- `transport.py`: the HTTP door (deadline, size cap, TLS, the token header), `Call`/`CallError`
  and `use_transport` for tests; `deadline.py`: the overall deadline on every socket operation;
- `reports.py`: the answers checked against the wire contract and read into the report model
  (`fleets.core.report`);
- `peers.py`: what this process learned about each supervisor (features, the shared token).
"""
