"""`python -m supervisor`: run the per-GPU-host supervisor."""

import sys

from supervisor.server import main, tls_fingerprint

USAGE = """usage: python -m supervisor [tls-fingerprint]

  (no command)      run the supervisor
  tls-fingerprint   print the SHA-256 fingerprint of the certificate it serves (making the
                    self-signed one first if needed), for the layout's supervisorFingerprint

Configured by environment variables:
  HARU_SUPERVISOR_CONFIG     inline JSON or the path of a JSON file (required)
  PORT                       listen port (default 8701)
  HARU_SUPERVISOR_HOST       bind address (default 127.0.0.1)
  HARU_SUPERVISOR_TOKEN      bearer token for every /v1/ route; unset = loopback only
  HARU_SUPERVISOR_TLS        auto (HTTPS beyond loopback) | on | plain-http (default auto)
  HARU_SUPERVISOR_TLS_CERT   PEM certificate (chain) for HTTPS; with HARU_SUPERVISOR_TLS_KEY
  HARU_SUPERVISOR_TLS_KEY    PEM private key for HTTPS; unset (both) = self-signed, in the
                             state dir, beyond loopback
  HARU_SUPERVISOR_LOG_LEVEL  debug | info | warning | error (default info)
"""

if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(USAGE, end="")
        raise SystemExit(0)
    args = sys.argv[1:]
    if args == ["tls-fingerprint"]:
        raise SystemExit(tls_fingerprint())
    if args:
        print(USAGE, end="", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main())
