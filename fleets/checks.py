"""System checks on the configuration (`manage.py check`, and before `serve` starts).

A bearer token is the only thing between the network and promote/demote: with HARU_API_TOKEN set
(a deployment), a short or placeholder secret stops `serve`, `migrate` and every other command
(`haru.E004`), so the example env file's `change-me` cannot go live by being forgotten; in local
development (no HARU_API_TOKEN, loopback only) it is a warning (`haru.W001`). No check ever
prints a secret.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.core.checks import CheckMessage
from django.core.checks import Error as CheckError
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder

from common.secret_strength import HOW_TO_GENERATE, secret_weakness
from fleets.base.conf import haru_settings


def _secrets() -> list[tuple[str, str | None]]:
    """(variable, value) of every secret the control plane reads; the secret key only when set
    (unset, Django's is generated at random and kept in var/secret_key)."""
    conf = haru_settings()
    named: list[tuple[str, str | None]] = [
        ("HARU_API_TOKEN", conf.api_token),
        ("HARU_SUPERVISOR_TOKEN", conf.supervisor_token),
        ("HARU_SUPERVISOR_MASTER_KEY", conf.supervisor_master_key),
        ("HARU_SECRET_KEY", conf.secret_key),
    ]
    return named + [(f"HARU_CHAT_TOKENS item {i + 1}", t) for i, t in enumerate(conf.chat_tokens)]


def weak_secrets(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Refuse each short or placeholder secret (common/secret_strength.py) once HARU_API_TOKEN
    is set; without it (local development: loopback only) only warn. Never prints a secret."""
    deployed = bool(haru_settings().api_token)
    out: list[CheckMessage] = []
    for name, secret in _secrets():
        reason = secret_weakness(secret) if secret else None
        if reason is None:
            continue
        if deployed:
            out.append(CheckError(f"{name} {reason}", hint=HOW_TO_GENERATE, id="haru.E004"))
        else:
            out.append(CheckWarning(f"{name} {reason}", hint=HOW_TO_GENERATE, id="haru.W001"))
    return out


def shared_supervisor_token(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Warn while the deprecated shared supervisor token is configured (migration period)."""
    if not haru_settings().supervisor_token:
        return []
    if haru_settings().supervisor_master_key:
        return [
            CheckWarning(
                "HARU_SUPERVISOR_TOKEN (one token for every supervisor) is still set next to "
                "HARU_SUPERVISOR_MASTER_KEY: a supervisor that refuses its own token is sent the "
                "shared one",
                hint="give each supervisor its token (manage.py supervisor_token "
                "<fleet>/<domain>), then unset HARU_SUPERVISOR_TOKEN",
                id="haru.W002",
            )
        ]
    return [
        CheckWarning(
            "HARU_SUPERVISOR_TOKEN is deprecated: every supervisor gets the same token, so any "
            "one of them (or a host a supervisorUrl points at) holds the credential for all",
            hint="set HARU_SUPERVISOR_MASTER_KEY, give each supervisor its own token "
            "(manage.py supervisor_token <fleet>/<domain>), then unset HARU_SUPERVISOR_TOKEN",
            id="haru.W002",
        )
    ]


def scoped_tokens(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Refuse chat tokens that would not scope anything: with the REST API open, or equal to
    the operator token."""
    chat = haru_settings().chat_tokens
    if not chat:
        return []
    operator = haru_settings().api_token
    if not operator:
        return [
            CheckError(
                "HARU_CHAT_TOKENS is set but HARU_API_TOKEN is not: the REST API (promote, "
                "demote, layouts) would be open to anyone while chat needs a token",
                hint="set HARU_API_TOKEN (the operator token) as well",
                id="haru.E001",
            )
        ]
    if operator in chat:
        return [
            CheckError(
                "HARU_CHAT_TOKENS contains HARU_API_TOKEN: the operator token must not double "
                "as a chat token",
                hint="give chat clients a token of their own",
                id="haru.E002",
            )
        ]
    return []


# The fourteen migrations of 30 November to 4 December 2026, squashed into
# 0001_squashed_0014 (which lists them in `replaces`). Django applies the squashed one to a new
# database and counts it as applied where all fourteen are; a database that holds some of them
# only would be left silently short of columns, because their files are gone.
LAST_COMMIT_WITH_THEM = "9645153"


def partly_squashed_schema(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Refuse a database that applied some, not all, of the squashed migrations (`migrate`
    runs database checks first, so it stops before it changes anything)."""
    squashed = importlib.import_module("fleets.migrations.0001_squashed_0014").Migration
    replaced = [name for _, name in squashed.replaces]
    out: list[CheckMessage] = []
    for alias in kwargs.get("databases") or ():
        try:
            applied = {
                name
                for app, name in MigrationRecorder(connections[alias]).applied_migrations()
                if app == "fleets"
            }
        except DatabaseError:
            continue  # no database yet, or not reachable: migrate itself will say so
        done = [name for name in replaced if name in applied]
        if done and len(done) < len(replaced):
            out.append(
                CheckError(
                    f"database {alias!r} holds the fleets schema at {done[-1]}, from before its "
                    f"migrations were squashed; this version can only upgrade it from "
                    f"{replaced[-1]}",
                    hint=(
                        f"migrate it once with a checkout of commit {LAST_COMMIT_WITH_THEM} "
                        "(git worktree add /tmp/haru-upgrade "
                        f"{LAST_COMMIT_WITH_THEM}; manage.py migrate there, same DATABASE_URL), "
                        "then run this version's migrate; docs/deployment.md, 'Upgrading'"
                    ),
                    id="haru.E003",
                )
            )
    return out


# What a takeover still needs once the frozen holder's lease ran out, before a held request's
# time is up: the next tick (the nudge a skipped tick scheduled for the lease's deadline),
# detection of a crashed active (two data-path checks 200 ms apart), and the standby's wake and
# probe (a few seconds on a real engine). docs/tick-lease.md, "Lease and hold".
TAKEOVER_BUDGET_MS = 5000


def lease_within_hold(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Refuse a tick lease that does not end, with room for a failover, before a held chat
    request expires: a worker frozen holding a fleet would outlast every held request."""
    conf = haru_settings()
    lease, hold = conf.tick_lease_ms, conf.chat_hold_ms
    if not hold or lease + TAKEOVER_BUDGET_MS <= hold:
        return []  # 0: nothing is ever held, so nothing can outlive its hold
    return [
        CheckError(
            f"HARU_TICK_LEASE_MS ({lease}) plus {TAKEOVER_BUDGET_MS} ms for a takeover's "
            f"failover is more than HARU_CHAT_HOLD_MS ({hold}): when a worker freezes holding a "
            "fleet and the active then fails, held chat requests get 503 before another worker "
            "takes the fleet over",
            hint=f"raise HARU_CHAT_HOLD_MS to at least {lease + TAKEOVER_BUDGET_MS}, or lower "
            f"HARU_TICK_LEASE_MS to at most {hold - TAKEOVER_BUDGET_MS} (keep it above one "
            "supervisor call, 10 s, plus a few seconds); docs/tick-lease.md",
            id="haru.E005",
        )
    ]
