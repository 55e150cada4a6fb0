"""Print one domain's supervisor token: `python manage.py supervisor_token <fleet>/<domain>`.

The token is derived from HARU_SUPERVISOR_MASTER_KEY and the domain's id, so it is printed, not
looked up: set it as HARU_SUPERVISOR_TOKEN in that domain's supervisor environment. Only the
token goes to stdout (`export HARU_SUPERVISOR_TOKEN=$(manage.py supervisor_token f/d)`).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from fleets.base.conf import haru_settings
from fleets.base.supervisor_tokens import MASTER_KEY_ENV, supervisor_token_for
from fleets.models import Domain


class Command(BaseCommand):
    help = "Print the bearer token a domain's supervisor must require (HARU_SUPERVISOR_TOKEN)."

    def add_arguments(self, parser):
        parser.add_argument("ref", help="the domain, as <fleet slug>/<domain slug>")

    def handle(self, *args, **opts):
        ref = opts["ref"].strip()
        fleet_slug, sep, domain_slug = ref.partition("/")
        if not sep or not fleet_slug or not domain_slug or "/" in domain_slug:
            raise CommandError(f"{ref!r}: give the domain as <fleet>/<domain>, e.g. demo/east")
        if not haru_settings().supervisor_master_key:
            raise CommandError(
                f"{MASTER_KEY_ENV} is not set: per-domain tokens are derived from it "
                "(docs/api.md, 'Credentials')"
            )
        domain = Domain.objects.filter(fleet__slug=fleet_slug, slug=domain_slug).only("id").first()
        if domain is None:
            known = sorted(
                Domain.objects.filter(fleet__slug=fleet_slug).values_list("slug", flat=True)
            )
            where = (
                f"fleet {fleet_slug!r} has domains: {', '.join(known)}"
                if known
                else f"no fleet {fleet_slug!r} (or it has no domains)"
            )
            raise CommandError(f"no domain {ref!r}: {where}")
        self.stdout.write(str(supervisor_token_for(domain.id)))
