"""The reads: fleet lookups and snapshots (`selectors`), the public JSON shapes (`shapes`), the
failover-readiness facts (`readiness`) and the published recovery time (`recovery`). Nothing
here writes; every write is `fleets.services`'."""
