"""The HTTP server's edge: deadlines, size limits and a connection cap ahead of the ASGI app.

`limits` reads the settings and fits the connection cap to the process's descriptor limit;
`protocol` is uvicorn's httptools protocol with those bounds enforced.
"""
