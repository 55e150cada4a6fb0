"""Render a host's supervisor config from the plan: `manage.py supervisor_config FLEET DOMAIN`."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fleets.models import Domain
from fleets.services.supervisor_config import (
    GPU_BACKENDS,
    SupervisorConfigError,
    supervisor_config_render,
)


class Command(BaseCommand):
    help = (
        "Print (or write) the supervisor config of one domain, from its layout and GPU plan: "
        "deploy it as HARU_SUPERVISOR_CONFIG on the host."
    )

    def add_arguments(self, parser):
        parser.add_argument("fleet", help="fleet slug")
        parser.add_argument("domain", help="domain slug")
        parser.add_argument("--gpu-backend", choices=GPU_BACKENDS, default="nvml")
        parser.add_argument("--sim-state-file", help="sim backend: the shared GPU state file")
        parser.add_argument(
            "--base-port", type=int, help="first port for servers whose servingUrl names none"
        )
        parser.add_argument("--output", "-o", help="write to this file instead of stdout")

    def handle(self, *args, **opts):
        domain = Domain.objects.filter(fleet__slug=opts["fleet"], slug=opts["domain"]).first()
        if domain is None:
            raise CommandError(f"no domain {opts['domain']!r} in fleet {opts['fleet']!r}")
        try:
            doc = supervisor_config_render(
                domain=domain,
                gpu_backend=opts["gpu_backend"],
                sim_state_file=opts["sim_state_file"],
                base_port=opts["base_port"],
            )
        except SupervisorConfigError as exc:
            raise CommandError(str(exc)) from None
        text = json.dumps(doc, indent=2) + "\n"
        if opts["output"]:
            Path(opts["output"]).write_text(text)
            self.stderr.write(f"wrote {opts['output']}")
        else:
            self.stdout.write(text, ending="")
