"""Create, list and revoke stored API tokens (docs/access.md, "API tokens").

    manage.py api_token create ci-reader --scope read --fleet demo [--fleet other]
    manage.py api_token create pager --scope operate --all-fleets
    manage.py api_token list
    manage.py api_token revoke ci-reader

`create` prints only the secret on stdout (`TOKEN=$(manage.py api_token create ...)`), once:
Haru keeps its SHA-256, so a lost secret is revoked and replaced, never shown again.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from fleets.base import clock
from fleets.base.clock import iso
from fleets.core.access import TokenScope
from fleets.models import ApiToken, Fleet
from fleets.services.access import api_token_create, api_token_revoke


class Command(BaseCommand):
    help = "Create, list or revoke API tokens scoped to fleets and to read or operate."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        create = sub.add_parser("create", help="create a token and print its secret, once")
        create.add_argument("name", help="a unique name saying who holds it (ci-reader)")
        create.add_argument("--scope", choices=[s.value for s in TokenScope], required=True)
        reach = create.add_mutually_exclusive_group(required=True)
        reach.add_argument("--fleet", action="append", dest="fleets", metavar="SLUG")
        reach.add_argument("--all-fleets", action="store_true")
        sub.add_parser("list", help="every token: name, prefix, scope, fleets, last use")
        revoke = sub.add_parser("revoke", help="refuse a token from now on")
        revoke.add_argument("name")

    def handle(self, *args, **opts):
        getattr(self, f"_{opts['verb']}")(opts)

    def _create(self, opts):
        fleets = None
        if not opts["all_fleets"]:
            slugs = sorted(set(opts["fleets"]))
            fleets = list(Fleet.objects.filter(slug__in=slugs))
            missing = sorted(set(slugs) - {f.slug for f in fleets})
            if missing:
                raise CommandError(f"no fleet {', '.join(missing)}")
        try:
            _token, secret = api_token_create(
                name=opts["name"], scope=TokenScope(opts["scope"]), fleets=fleets
            )
        except IntegrityError as exc:
            raise CommandError(f"a token named {opts['name']!r} exists already") from exc
        self.stdout.write(secret)

    def _list(self, opts):
        for t in ApiToken.objects.prefetch_related("fleets"):
            reach = "*" if t.all_fleets else ",".join(f.slug for f in t.fleets.all()) or "-"
            state = f"revoked {iso(t.revoked_at)}" if t.revoked_at else "live"
            used = iso(t.last_used_at) or "never used"
            self.stdout.write(f"{t.name}\t{t.prefix}…\t{t.scope}\t{reach}\t{used}\t{state}")

    def _revoke(self, opts):
        if not api_token_revoke(name=opts["name"], now=clock.now()):
            raise CommandError(f"no live token named {opts['name']!r}")
        self.stdout.write(f"revoked {opts['name']}")
