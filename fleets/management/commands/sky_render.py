"""Print what Haru would launch for a domain: `python manage.py sky_render FLEET DOMAIN`.

The SkyPilot task YAML (or SkyServe service YAML) exactly as the provisioning pass renders it,
for review before anything is launched; secrets appear as the references they are (the value
travels only as `--secret NAME` from the environment, never in the file). Calls no cloud.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from fleets.base.errors import FleetNotFound, InvalidTarget
from fleets.drivers.base import DriverSettingsError, Target
from fleets.drivers.registry import builtin
from fleets.drivers.render import for_review
from fleets.drivers.skypilot import SkyPilotDriver
from fleets.drivers.skyserve import SkyServeDriver
from fleets.reads.selectors import domain_get, fleet_get


class Command(BaseCommand):
    help = "Print the SkyPilot/SkyServe YAML Haru would launch for a domain (no cloud calls)."

    def add_arguments(self, parser):
        parser.add_argument("fleet", help="fleet slug or UUID")
        parser.add_argument("domain", help="domain slug or UUID")
        parser.add_argument(
            "--candidate",
            type=int,
            default=None,
            help="which region/zone of the placement's list to render (default: the one the "
            "next launch would use)",
        )

    def handle(self, *args, **opts):
        try:
            fleet = fleet_get(opts["fleet"])
        except FleetNotFound as exc:
            raise CommandError(str(exc)) from None
        try:
            domain = domain_get(fleet, opts["domain"])
        except InvalidTarget as exc:
            raise CommandError(str(exc)) from None
        driver = builtin().get(domain.provider) if domain.driver else None
        if not isinstance(driver, SkyPilotDriver):
            raise CommandError(
                f"domain {domain.slug!r} is not provisioned by Haru with SkyPilot (provider "
                f"{domain.provider}{'' if domain.driver else ', no driver settings in the layout'})"
            )
        try:
            target = Target(
                fleet_slug=fleet.slug,
                domain_slug=domain.slug,
                domain_id=str(domain.id),
                name=driver.resource_name(fleet_slug=fleet.slug, domain_slug=domain.slug),
                settings=driver.validate(placement=domain.placement, settings=domain.driver),
            )
        except DriverSettingsError as exc:
            raise CommandError(str(exc)) from None
        candidates = driver.candidates(target.settings)
        index = opts["candidate"]
        if index is None:
            index = int((domain.driver_status or {}).get("candidate", 0)) % len(candidates)
        if not 0 <= index < len(candidates):
            raise CommandError(
                f"--candidate must be 0 to {len(candidates) - 1} ({', '.join(candidates)})"
            )
        rendered = driver.render(target, candidate=index)
        verb = "sky serve up -n" if isinstance(driver, SkyServeDriver) else "sky launch -c"
        secrets = " ".join(f"--secret {n}" for n in rendered.secret_names)
        order = ", ".join(f"{'>' if i == index else ' '}{c}" for i, c in enumerate(candidates))
        self.stdout.write(f"# {domain.provider} {fleet.slug}/{domain.slug} as {target.name}")
        self.stdout.write(f"# launch order: {order}")
        self.stdout.write(f"# launched with: {verb} {target.name} -y --async {secrets} <this file>")
        self.stdout.write(for_review(rendered).rstrip("\n"))
