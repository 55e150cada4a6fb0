"""The OpenAI-compatible chat proxy: the data path from client applications to the active domain.

- `asgi`: the lean ASGI app that serves /v1/chat/completions, /v1/completions and /v1/models
  ahead of Django (haru/asgi.py dispatches to it), and reads bodies with a hard limit.
- `flow`: one request's forwarding flow (read, hold, forward, stream back, record) over a
  `ClientIO`; the ASGI app and `fleets/server/direct.py` (manage.py serve's chat path) run it.
- `handler`: the transport-free core: authorize, pick the route, forward, render errors.
- `stream_ledger`: what a stream that may be continued keeps (its token ids), and the stripping
  that keeps the ids from the client.
- `plan`: one request's stance on continuation (kept or not, the body it is sent with).
- `continuation`: a stream cut after its headers, held and continued on the domain routing
  commits to (the rules are in `fleets/core/continuation.py`).
- `split`, `adapters`: which arm of a weighted split, which version of an adapter route takes a
  request (docs/splits.md, docs/adapter-routing.md); `arm_stats`: their per-arm samples.
- `snapshots`: the per-process routing snapshot cache (revision re-checked on every request,
  fail-open on a store outage).
- `store`: the two reads the proxy makes, on one dedicated database thread.
- `upstream`: the pooled HTTP/1.1 client to model servers (asyncio + httptools; one pool per
  process and event loop).
- `metrics`: the proxy's Prometheus series.

Only the proxy serves these paths: Django itself answers them with a 404. The proxy reads
the state store and never writes routing state (its one background thread stores per-arm
samples and adapters' first-served marks); it holds no session, no CSRF, no DRF.
"""
