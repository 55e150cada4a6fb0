"""What the control plane and the supervisor both speak: the wire contract and its schemas
(`wire/`), the bounded HTTP edge both servers run (`edge/`), the document checker
(`documents.py`), the JSON value kinds (`strict_json.py`), the one parse of a bearer
`Authorization` header every gate uses (`bearer.py`), the limits both sides enforce
(`limits.py`) and the one door to the private interfaces of uvicorn, httpx and httpcore
(`private_apis.py`, docs/private-apis.md). Standard library, jsonschema, httpx, uvicorn and
httptools only: it imports nothing of `fleets`, `supervisor`, `haru` or Django, so a GPU host
ships it beside the agent.
"""
