"""Give a user or a group a role on one fleet or on every fleet (docs/access.md, "Roles").

    manage.py fleet_access grant alice view --fleet demo
    manage.py fleet_access grant --group oncall operate            (every fleet)
    manage.py fleet_access grant bob none --fleet demo             (takes bob's role on demo)
    manage.py fleet_access show alice

The same grants as the admin's pages (a fleet's "Access" page, a user's or group's permissions).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from fleets.core.access import Role
from fleets.models import Fleet
from fleets.reads.access import user_grant
from fleets.services.access import fleet_role_set

ROLE_NAMES = {role.label: role for role in Role}


class Command(BaseCommand):
    help = "Grant a user or a group a fleet role (view, operate, administer, none); show roles."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        grant = sub.add_parser("grant", help="set a user's or group's role on a fleet, or all")
        grant.add_argument("holder", help="a username, or a group name with --group")
        grant.add_argument("role", choices=list(ROLE_NAMES))
        grant.add_argument("--group", action="store_true", help="the holder is a group")
        grant.add_argument(
            "--fleet", action="append", dest="fleets", metavar="SLUG", help="default: every fleet"
        )
        show = sub.add_parser("show", help="a user's role on every fleet")
        show.add_argument("username")

    def handle(self, *args, **opts):
        getattr(self, f"_{opts['verb']}")(opts)

    def _grant(self, opts):
        holder = self._holder(opts["holder"], group=opts["group"])
        role = ROLE_NAMES[opts["role"]]
        if not opts["fleets"]:
            fleet_role_set(holder=holder, role=role)
            self.stdout.write(f"{opts['holder']}: {role.label} on every fleet")
            return
        for slug in opts["fleets"]:
            fleet = Fleet.objects.filter(slug=slug).first()
            if fleet is None:
                raise CommandError(f"no fleet {slug!r}")
            fleet_role_set(holder=holder, role=role, fleet=fleet)
            self.stdout.write(f"{opts['holder']}: {role.label} on {slug}")

    def _show(self, opts):
        user = self._holder(opts["username"], group=False)
        grant = user_grant(user)
        for fleet in Fleet.objects.all():
            self.stdout.write(f"{fleet.slug}\t{grant.role(fleet.pk).label}")

    @staticmethod
    def _holder(name: str, *, group: bool):
        model = get_user_model()
        found = (
            Group.objects.filter(name=name).first()
            if group
            else model.objects.filter(**{model.USERNAME_FIELD: name}).first()
        )
        if found is None:
            raise CommandError(f"no {'group' if group else 'user'} {name!r}")
        return found
