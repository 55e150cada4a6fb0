"""The `skyserve` driver: a domain's supervisor as the replicas of a SkyServe service.

The SkyPilot driver's settings and launch (`sky serve up --async`), with a service's own
answers: describe reads the services table until the service is READY and takes the supervisor
of its first ready replica; stop is `sky serve down` (a service has no stopped state).
"""

from __future__ import annotations

from fleets.drivers.base import PENDING, Described, Progress, Target, TornDown, as_https
from fleets.drivers.sky_cli import SkyCommandFailed
from fleets.drivers.skypilot import SkyPilotDriver


class SkyServeDriver(SkyPilotDriver):
    name = "skyserve"

    def remove(self, target: Target) -> None:
        self.sky.serve_down(target.name)

    def _after_failed_request(self, target: Target) -> None:
        self.sky.serve_down(target.name)  # a failed service keeps its name taken

    def _describe_host(self, target: Target, *, lost: bool) -> Described:
        record = self.sky.serve_status(target.name)
        if record is not None and record.status == "FAILED":
            self.sky.serve_down(target.name)
            error = SkyCommandFailed(f"service {target.name} FAILED")
            return Described(Progress.FAILED, error=error)
        if record is None or record.status != "READY" or not record.replica_endpoints:
            return PENDING
        host = record.replica_endpoints[0].rsplit(":", 1)[0]
        return Described(
            Progress.UP,
            supervisor_url=as_https(f"{host}:{target.settings.driver.supervisor_port}"),
            serving_base_url=self.sky.serve_endpoint(target.name),
        )

    def stop(self, target: Target, *, mode: str) -> TornDown:
        self.sky.serve_down(target.name)  # a service has no stopped state
        return TornDown("down", gone=self.sky.serve_status(target.name) is None)
