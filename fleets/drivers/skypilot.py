"""The `skypilot` driver: a domain's supervisor as the job of a SkyPilot cluster.

Wraps the renderer (`render.py`: the task YAML) and the `sky` CLI wrapper (`sky_cli.py`). A
launch is `sky launch --async` on one candidate region/zone of the placement; describe follows
the launch request, then the cluster, then reads the supervisor's and the serving port's
endpoints (the supervisor's on https://: the launch shipped it the TLS identity the provisioning
pass made and pinned); stop is `sky stop` or `sky down`, confirmed with `sky status`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.tls_pin import TlsIdentity
from fleets.drivers.base import (
    PENDING,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    Described,
    Progress,
    ProvisioningDriver,
    Target,
    TornDown,
    as_https,
)
from fleets.drivers.cloud_placement import (
    CloudPlacement,
    CloudPlacementError,
    DriverSettings,
    parse_cloud_placement,
    parse_driver_settings,
)
from fleets.drivers.render import Rendered, cluster_name, render_for
from fleets.drivers.sky_cli import (
    SkyCli,
    SkyClusterUnknown,
    SkyCommandFailed,
    SkySecretMissing,
    classify_failure,
)


@dataclass(frozen=True)
class SkySettings:
    """A SkyPilot domain's validated placement and launch settings."""

    placement: CloudPlacement
    driver: DriverSettings


class SkyPilotDriver(ProvisioningDriver):
    name = "skypilot"
    uses_placement = True
    ships_tls = True

    def __init__(self, sky: Callable[[], SkyCli] = SkyCli) -> None:
        self._sky_factory = sky
        self._cli: SkyCli | None = None

    @property
    def sky(self) -> SkyCli:
        """The `sky` CLI, made on first use (a pass with nothing to launch never makes one)."""
        if self._cli is None:
            self._cli = self._sky_factory()
        return self._cli

    def validate(self, *, placement: object, settings: object, path: str = "") -> SkySettings:
        found: list[tuple[str, str]] = []
        cloud = driver = None
        try:
            cloud = parse_cloud_placement(placement, path=f"{path}placement")
        except CloudPlacementError as exc:
            found.extend(exc.problems)
        try:
            driver = parse_driver_settings(settings, provider=self.name, path=f"{path}driver")
        except CloudPlacementError as exc:
            found.extend(exc.problems)
        if cloud is None or driver is None:
            (where, rule), *rest = found
            raise CloudPlacementError(where, rule, also=rest)
        return SkySettings(cloud, driver)

    def candidates(self, settings: SkySettings) -> tuple[str, ...]:
        return tuple(c.label() for c in settings.placement.candidates())

    def resource_name(self, *, fleet_slug: str, domain_slug: str) -> str:
        return cluster_name(fleet_slug, domain_slug)

    def render(self, target: Target, *, candidate: int) -> Rendered:
        """Return the document a launch on candidate `candidate` submits."""
        settings: SkySettings = target.settings
        where = settings.placement.candidates()
        return render_for(
            provider=self.name,
            name=target.name,
            placement=settings.placement,
            settings=settings.driver,
            candidate=where[candidate % len(where)],
        )

    def remove(self, target: Target) -> None:
        self.sky.down(target.name)

    def launch(
        self, target: Target, *, candidate: int, token: str | None, tls: TlsIdentity | None = None
    ) -> str:
        rendered = self.render(target, candidate=candidate)
        if not token:
            # The supervisor listens beyond loopback on a cloud node and refuses to without one.
            raise SkySecretMissing(
                "HARU_SUPERVISOR_MASTER_KEY is not set: a provisioned supervisor must require a "
                "token"
            )
        if tls is None:
            # Its public port must not serve plain HTTP; the provisioning pass makes one.
            raise SkySecretMissing("no TLS identity for the supervisor: not launched")
        values = {
            TOKEN_ENV: token,
            TLS_CERT_ENV: tls.cert_pem.decode(),
            TLS_KEY_ENV: tls.key_pem.decode(),
        }
        return self.sky.launch(
            cluster=target.name,
            yaml_text=rendered.text,
            secrets={n: values[n] for n in rendered.secret_names},
            serve=self.name == "skyserve",
        )

    def describe(self, target: Target, *, handle: str | None) -> Described:
        state: str | None = None
        if handle:
            state = self.sky.request_status(handle)
            if state in ("FAILED", "CANCELLED"):
                exc = classify_failure(self.sky.request_logs(handle), what=f"launch {target.name}")
                if isinstance(exc, SkyCommandFailed) and state == "CANCELLED":
                    exc = SkyCommandFailed(f"launch {target.name}: request cancelled")
                self._after_failed_request(target)
                return Described(Progress.FAILED, error=exc)
        return self._describe_host(target, lost=handle is None or state == "SUCCEEDED")

    def _after_failed_request(self, target: Target) -> None:
        """Clean up after a launch request that failed (a cluster needs nothing)."""

    def _describe_host(self, target: Target, *, lost: bool) -> Described:
        cluster = self.sky.status(target.name)
        if cluster is None:
            if lost:
                # No launch in flight and no cluster: the launch was lost; launch again.
                error = SkyClusterUnknown(f"cluster {target.name} not found after launch")
                return Described(Progress.FAILED, error=error)
            return PENDING
        if cluster.status != "UP":
            return PENDING
        driver = target.settings.driver
        serving = ""
        if driver.serving_port is not None:
            serving = self.sky.endpoint(target.name, driver.serving_port)
        return Described(
            Progress.UP,
            # The host serves the identity shipped at launch: HTTPS, whatever sky prints.
            supervisor_url=as_https(self.sky.endpoint(target.name, driver.supervisor_port)),
            serving_base_url=serving,
        )

    def stop(self, target: Target, *, mode: str) -> TornDown:
        try:
            (self.sky.stop if mode == "stop" else self.sky.down)(target.name)
            record = self.sky.status(target.name)
        except SkyClusterUnknown:
            return TornDown(mode, gone=True)  # nothing to stop
        return TornDown(mode, record is None or (mode == "stop" and record.status == "STOPPED"))
