"""`python -m supervisor`: run the per-GPU-host supervisor."""

import sys

from supervisor.server import main

USAGE = """usage: python -m supervisor

Configured by environment variables:
  HARU_SUPERVISOR_CONFIG     inline JSON or the path of a JSON file (required)
  PORT                       listen port (default 8701)
  HARU_SUPERVISOR_HOST       bind address (default 127.0.0.1)
  HARU_SUPERVISOR_TOKEN      bearer token for every /v1/ route; unset = loopback only
  HARU_SUPERVISOR_TLS_CERT   PEM certificate (chain) for HTTPS; with HARU_SUPERVISOR_TLS_KEY
  HARU_SUPERVISOR_TLS_KEY    PEM private key for HTTPS; unset (both) = plain HTTP
  HARU_SUPERVISOR_LOG_LEVEL  debug | info | warning | error (default info)
"""

if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(USAGE, end="")
        raise SystemExit(0)
    raise SystemExit(main())
