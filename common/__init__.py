"""What the control plane and the supervisor both speak: the wire contract and its schemas
(`wire/`), the bounded HTTP edge both servers run (`edge/`), the document checker
(`documents.py`), the JSON value kinds (`strict_json.py`) and the limits both sides enforce
(`limits.py`). Standard library, jsonschema, httpx, uvicorn and httptools only: it imports
nothing of `fleets`, `supervisor`, `haru` or Django, so a GPU host ships it beside the agent.
"""
