"""Run inside SkyPilot's own virtualenv: parse rendered documents with SkyPilot's parsers.

Reads a JSON list of `{"id", "document", "secret_names"}` on stdin and prints, per document, the
fields SkyPilot understood (or the error it raised), as JSON on stdout.
Used by test_drivers_skypilot_parser.py.
"""

import json
import sys

import sky
from sky.serve import service_spec


def _fields(doc, secret_names):
    out = {}
    # With the secrets given at launch (what `--secret NAME` does) ...
    task = sky.Task.from_yaml_config(
        json.loads(json.dumps(doc)), secrets_overrides=[(name, "t" * 24) for name in secret_names]
    )
    (res,) = list(task.resources)
    out["cloud"] = str(res.cloud) if res.cloud else None
    out["region"] = res.region
    out["zone"] = res.zone
    out["accelerators"] = res.accelerators
    out["use_spot"] = res.use_spot
    out["disk_size"] = res.disk_size
    out["image_id"] = res.image_id
    out["ports"] = sorted(int(p) for p in (res.ports or []))
    out["envs"] = sorted(task.envs)
    out["secrets"] = sorted(task.secrets)
    out["run"] = task.run
    # ... and without them: a null secret must stay a reference, never an inline value.
    bare = sky.Task.from_yaml_config(json.loads(json.dumps(doc)))
    out["bare_inline_secrets"] = sorted(bare.secrets)
    out["bare_secret_refs"] = sorted(r.name for r in getattr(bare, "_managed_secret_refs", []))
    if "service" in doc:
        spec = service_spec.SkyServiceSpec.from_yaml_config(doc["service"])
        out["service"] = {
            "readiness_path": spec.readiness_path,
            "replicas": spec.min_replicas,
            "ports": int(spec.ports),
        }
    return out


def main():
    results = []
    for item in json.load(sys.stdin):
        try:
            fields = _fields(item["document"], item["secret_names"])
            results.append({"id": item["id"], "fields": fields})
        except Exception as exc:  # noqa: BLE001 - report every document's verdict
            results.append({"id": item["id"], "error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
