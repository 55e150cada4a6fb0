"""The server process: its HTTP edge and who drives its reconcile ticks.

`limits` reads the edge settings and fits the connection cap to the process's descriptor
limit; `protocol` is uvicorn's httptools protocol with those bounds (`common/edge`) plus
the chat request's direct path (`direct`); `hosts` is the Host check both front doors use;
`driver` starts this process's tick driver (the in-process loop, Celery kicks, and the loop's
cover while the broker is down).
"""
