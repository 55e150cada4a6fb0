"""Every environment variable the control plane reads, declared once (common/setting.py).

haru/settings.py reads the environment through `HaruSettings` into `settings.HARU` (a dictionary
keyed by attribute name, which tests replace whole), and fleets/base/conf.py hands code the same
values as typed attributes (`conf.haru_settings().chat_hold_ms`). docs/configuration.md is
generated from these classes and the supervisor's (`python -m haru.setting_docs`); a test fails
when it is out of date. A new variable is one attribute here, then the docs regenerated.
"""

from __future__ import annotations

from common.edge.limits import EdgeLimit, edge_settings
from common.setting import COMMANDS, CONTROL_PLANE, DEMO, SERVER, WORKER, Kind, Section, Setting

MIB = 1024 * 1024
CHAT_MAX_BODY_BYTES = 32 * MIB
# The server edge's body cap defaults to the chat proxy's cap plus this (haru/settings.py).
HTTP_BODY_HEADROOM = MIB

TICKS = (SERVER, WORKER)  # the reconcile loop: Celery's worker, or the server without Redis

# The headings of the docs, each with the processes that read its variables unless one says.
STORE = Section("Storage and messaging", CONTROL_PLANE)
CREDENTIALS = Section("Credentials", CONTROL_PLANE)
WEB = Section("Web server and log-in", (SERVER,))
CHAT = Section("Chat proxy", (SERVER,))
EDGE = Section("HTTP server limits", (SERVER,))
DATABASE = Section("Database connections", CONTROL_PLANE)
RECONCILE = Section("Reconciler and supervisors", TICKS)
LAYOUTS = Section("Layouts and inputs", (SERVER, COMMANDS))
OPERATOR = Section("The demo's operator", (DEMO,))
OWN_PROCESSES = Section("Set by Haru for its own processes", ())
SCRIPT_COMMANDS = Section("Set by Haru for the script driver's commands", ())


class HaruSettings:
    """The control plane's variables; an instance's attributes are their loaded values."""

    # Storage and messaging.
    database_url = STORE.text(
        "DATABASE_URL",
        kind=Kind.URL,
        choices=("postgres", "postgresql", "sqlite"),
        shown_default="SQLite file `var/haru.sqlite3` (WAL)",
        doc="the database: `postgres://user@host:5432/db` for production",
    )
    redis_url = STORE.text(
        "REDIS_URL",
        kind=Kind.URL,
        choices=("redis", "rediss"),
        shown_default="unset: in-memory channel layer, no broker",
        doc="Celery broker, `channels_redis` layer and the routing push channel",
    )
    var_dir = STORE.text(
        "HARU_VAR_DIR",
        kind=Kind.PATH,
        shown_default="`./var`",
        doc="where the embedded database, the secret key and local state live",
    )
    prometheus_multiproc_dir = STORE.text(
        "PROMETHEUS_MULTIPROC_DIR",
        kind=Kind.PATH,
        shown_default="`$HARU_VAR_DIR/prometheus`",
        doc="per-host directory where every Haru process keeps its counters for `/metrics` to "
        "sum; the same for the server and the Celery workers of a host",
    )

    # Credentials.
    api_token = CREDENTIALS.text(
        "HARU_API_TOKEN",
        doc="bearer token for `/v1/`. Unset: no authentication and a loopback-only bind with a "
        "loud warning (local development). Set: every secret in this section must be at least 32 "
        "characters and no placeholder (`change-me`, `example`, `xxxx…`), or `serve`, "
        "`migrate` and every other command stop with `haru.E004` naming the variable; "
        "without it a weak one is the warning `haru.W001`",
    )
    chat_tokens = CREDENTIALS.listing(
        "HARU_CHAT_TOKENS", doc="tokens that may call the chat endpoints only (never the REST API)"
    )
    supervisor_master_key = CREDENTIALS.text(
        "HARU_SUPERVISOR_MASTER_KEY",
        doc="the key every domain's supervisor token is derived from "
        "(`manage.py supervisor_token <fleet>/<domain>` prints one)",
    )
    supervisor_token = CREDENTIALS.text(
        "HARU_SUPERVISOR_TOKEN",
        doc="deprecated: one token presented to every supervisor; still sent for a migration "
        "period, with the warning `haru.W002`",
    )
    secret_key = CREDENTIALS.text(
        "HARU_SECRET_KEY",
        shown_default="random, kept in `var/secret_key`",
        doc="Django's secret key; set it when running several replicas",
    )

    # Web server and log-in.
    port = WEB.integer("PORT", 8700, 1, 65535, doc="the server's port")
    debug = WEB.flag("HARU_DEBUG", False, doc="Django's debug mode", reads=CONTROL_PLANE)
    allowed_hosts = WEB.listing(
        "HARU_ALLOWED_HOSTS",
        shown_default="with `HARU_API_TOKEN`: `*`; without: `localhost,127.0.0.1,[::1]`",
        doc="host names the server answers to; any other `Host` gets 400, on the chat "
        "proxy's paths too",
    )
    trusted_origins = WEB.listing(
        "HARU_TRUSTED_ORIGINS",
        doc="origins (`https://ops.example.com`) besides the server's own that may post the "
        "login form and open the dashboard's WebSocket",
    )
    # fleets/metrics/snapshot.py: at many fleets the database's series cost about a second of
    # CPU to judge, so they are served from a snapshot refreshed in the background.
    metrics_snapshot_s = WEB.integer(
        "HARU_METRICS_SNAPSHOT_S",
        15,
        0,
        3600,
        doc="with at least `HARU_METRICS_SNAPSHOT_MIN_FLEETS` fleets, `/metrics` serves the "
        "database's series from a snapshot one process per host refreshes this often "
        "(`haru_metrics_snapshot_age_seconds` says how old; never older than three periods: "
        "an older one is recomputed in the scrape); 0 computes them in every scrape",
    )
    metrics_snapshot_min_fleets = WEB.integer(
        "HARU_METRICS_SNAPSHOT_MIN_FLEETS",
        100,
        1,
        10_000_000,
        doc="below this many fleets every scrape computes the database's series itself (exact, "
        "and cheap: about 140 ms of CPU at 100 fleets)",
    )
    behind_tls = WEB.flag(
        "HARU_BEHIND_TLS",
        False,
        doc="TLS ends in a reverse proxy: cookies only over HTTPS, HSTS for a year, and the "
        "proxy's `X-Forwarded-Proto: https` trusted. Only when that proxy is the only way in",
    )
    login_failure_limit = WEB.integer(
        "HARU_LOGIN_FAILURE_LIMIT",
        5,
        1,
        1000,
        doc="failed log-ins for one username from one address before that pair is locked out "
        "(429, even with the right password)",
    )
    login_lockout_minutes = WEB.integer(
        "HARU_LOGIN_LOCKOUT_MINUTES",
        15,
        1,
        7 * 24 * 60,
        doc="how long a lockout lasts; `manage.py axes_reset_username` ends one at once",
    )

    # Chat proxy.
    default_fleet = CHAT.text(
        "HARU_DEFAULT_FLEET", doc="the fleet a chat request without `X-Haru-Fleet` goes to"
    )
    chat_header_timeout_ms = CHAT.integer(
        "HARU_CHAT_HEADER_TIMEOUT_MS",
        30_000,
        1,
        2**31 - 1,
        doc="time to the upstream model server's response headers",
    )
    snapshot_cache_ttl_ms = CHAT.integer(
        "HARU_SNAPSHOT_CACHE_TTL_MS",
        2000,
        0,
        2**31 - 1,
        doc="staleness bound of non-routing state in the chat path",
    )
    chat_max_body_bytes = CHAT.integer(
        "HARU_CHAT_MAX_BODY_BYTES",
        CHAT_MAX_BODY_BYTES,
        1,
        2**40,
        doc="largest chat request body (413 `payload_too_large` above)",
    )
    # Hold and forward (docs/proxy-hold.md).
    # Longer than a tick lease plus a failover (haru.E005): a worker frozen holding the fleet
    # is taken over before a held request expires (docs/tick-lease.md, "Lease and hold").
    chat_hold_ms = CHAT.integer(
        "HARU_CHAT_HOLD_MS",
        30_000,
        0,
        600_000,
        doc="how long a chat request may be held for a domain that can serve it (0: never "
        "hold); at least HARU_TICK_LEASE_MS + 5 s (haru.E005)",
    )
    chat_hold_max = CHAT.integer(
        "HARU_CHAT_HOLD_MAX",
        1000,
        0,
        1_000_000,
        doc="requests held at once per server process; beyond, 503 with `Retry-After`",
    )
    chat_hold_max_bytes = CHAT.integer(
        "HARU_CHAT_HOLD_MAX_BYTES",
        256 * MIB,
        0,
        2**40,
        doc="request body bytes held at once per server process; beyond, 503 with `Retry-After`",
    )
    chat_hold_poll_ms = CHAT.integer(
        "HARU_CHAT_HOLD_POLL_MS",
        250,
        0,
        10_000,
        doc="longest a server goes without reading the routing pointer when the push channel "
        "is down (0: every request)",
    )
    # Stream continuation (docs/proxy-hold.md, "Streams cut after their headers").
    chat_continue_max_ids = CHAT.integer(
        "HARU_CHAT_CONTINUE_MAX_IDS",
        32_768,
        0,
        10_000_000,
        doc="most token ids (prompt and answer) kept per stream to continue it after a cut; a "
        "longer stream ends cut as before (0: never continue)",
    )
    chat_continue_max_ids_total = CHAT.integer(
        "HARU_CHAT_CONTINUE_MAX_IDS_TOTAL",
        16_000_000,
        0,
        2**40,
        doc="most token ids kept at once per server process; a stream that would pass it is "
        "not continued",
    )
    chat_continue_max = CHAT.integer(
        "HARU_CHAT_CONTINUE_MAX",
        3,
        0,
        100,
        doc="most continuations of one stream (a continuation may be cut again)",
    )
    chat_stream_stall_ms = CHAT.integer(
        "HARU_CHAT_STREAM_STALL_MS",
        30_000,
        0,
        3_600_000,
        doc="a continuable stream silent this long is cut and continued (0: never)",
    )
    # Graceful restart.
    drain_ready_ms = CHAT.integer(
        "HARU_DRAIN_READY_MS",
        1000,
        0,
        60_000,
        doc="on SIGTERM, how long `/readyz` says 503 before the listener closes",
    )
    drain_budget_ms = CHAT.integer(
        "HARU_DRAIN_BUDGET_MS",
        15_000,
        0,
        600_000,
        doc="then, how long requests in flight and held get before held ones are answered 503",
    )

    # The HTTP server's edge (fleets/server/): every phase of a client connection is bounded,
    # so idle or trickling clients cannot hold the process's descriptors. Per server process.
    (
        http_header_timeout_ms,
        http_body_timeout_ms,
        http_keepalive_timeout_ms,
        http_max_header_bytes,
        http_max_headers,
        http_max_body_bytes,
        http_max_connections,
        http_max_connections_per_address,
    ) = edge_settings(
        "HARU_HTTP_",
        {
            "header_timeout_ms": EdgeLimit(
                10_000,
                "request line and headers not complete this long after the connection opened "
                "(or a kept-alive request's first byte): the connection is closed",
            ),
            "body_timeout_ms": EdgeLimit(
                60_000,
                "the request body not received this long after its headers: 408 `request_timeout`",
            ),
            "keepalive_timeout_ms": EdgeLimit(
                5000,
                "an idle kept-alive connection is closed; behind a load balancer, keep it above "
                "the balancer's idle timeout",
            ),
            "max_header_bytes": EdgeLimit(
                65_536, "431 `headers_too_large`, checked as bytes arrive"
            ),
            "max_headers": EdgeLimit(100, "431 `too_many_headers`"),
            "max_body_bytes": EdgeLimit(
                CHAT_MAX_BODY_BYTES + HTTP_BODY_HEADROOM,
                "a larger body: 413 `request_too_large` before the app runs. Never below "
                "`HARU_CHAT_MAX_BODY_BYTES` (start-up refuses it), so chat keeps its finer 413",
                low=MIB,
                high=2**40,
                shown_default="`HARU_CHAT_MAX_BODY_BYTES` + 1 MiB "
                f"({CHAT_MAX_BODY_BYTES + HTTP_BODY_HEADROOM})",
            ),
            "max_connections": EdgeLimit(
                2048,
                "past it a new connection closes the one that has waited longest for a request; "
                "the open-file limit is raised to twice the cap plus 256, or the cap lowered",
            ),
            "max_connections_per_address": EdgeLimit(
                256,
                "past it a new connection from that address is closed at once, so one address "
                "cannot take every slot; the trusted proxy's addresses (uvicorn's "
                "`FORWARDED_ALLOW_IPS`, default 127.0.0.1) are exempt",
            ),
        },
        EDGE,
    )

    # PostgreSQL connection pool, per process (psycopg_pool through Django's OPTIONS["pool"]).
    db_pool_max = DATABASE.integer(
        "HARU_DB_POOL_MAX",
        20,
        2,
        1000,
        doc="PostgreSQL only: connections in this process's pool; every process's pool must "
        "fit under the database's `max_connections`",
    )
    db_pool_timeout_ms = DATABASE.integer(
        "HARU_DB_POOL_TIMEOUT_MS",
        5000,
        100,
        600_000,
        doc="a request waiting this long for a pooled connection fails like a database outage: 503",
    )
    # fleets/base/prepared.py: the idle tick's statements, planned once per connection.
    db_prepared_statements = DATABASE.flag(
        "HARU_DB_PREPARED_STATEMENTS",
        True,
        doc="PostgreSQL only: the reconcile tick's hottest statements (its snapshot reads and "
        "its lease) are bound and prepared on the server, so they are not planned again on "
        "every tick; set to false behind a pooler in transaction mode that cannot carry "
        "prepared statements (PgBouncer before 1.21, or `max_prepared_statements = 0`)",
        reads=CONTROL_PLANE,
    )
    # haru/postgres/deadline.py: a frozen PostgreSQL never holds a web request.
    db_request_deadline_ms = DATABASE.integer(
        "HARU_DB_REQUEST_DEADLINE_MS",
        5000,
        100,
        600_000,
        doc="PostgreSQL only: each database wait of a REST, dashboard or admin request ends "
        "this long after it began with 503 `database_unavailable`; other work has no deadline",
        reads=(SERVER,),
    )

    # Reconciler and supervisors.
    reconcile_interval_ms = RECONCILE.optional_integer(
        "HARU_RECONCILE_INTERVAL_MS",
        100,
        2**31 - 1,
        shown_default="unset (no loop)",
        doc="reconcile tick interval (with Celery: the seed of beat's schedule in the database)",
        reads=CONTROL_PLANE,
    )
    reconcile_fleets = RECONCILE.listing(
        "HARU_RECONCILE_FLEETS",
        shown_default="all fleets",
        doc="fleet slugs the loop reconciles",
        reads=CONTROL_PLANE,
    )
    # fleets/reconciler/locks.py.
    tick_lease_ms = RECONCILE.integer(
        "HARU_TICK_LEASE_MS",
        15_000,
        2000,
        600_000,
        doc="how long a fleet's tick lease lasts unrenewed: the most a frozen worker delays "
        "its fleet (keep it above one supervisor call, 10 s, plus a few seconds, and 5 s "
        "below HARU_CHAT_HOLD_MS: haru.E005)",
    )
    supervisor_hosts = RECONCILE.host_patterns(
        "HARU_SUPERVISOR_HOSTS",
        shown_default="unset: any host",
        doc="allow-list of supervisor hosts (globs, CIDR networks); other hosts are refused at "
        "apply and never called",
        reads=CONTROL_PLANE,
    )
    supervisor_ca_bundle = RECONCILE.text(
        "HARU_SUPERVISOR_CA_BUNDLE",
        kind=Kind.FILE,
        shown_default="unset: the system's store",
        doc="PEM file of the CAs that HTTPS supervisors' certificates must chain to",
    )
    supervisor_max_response_bytes = RECONCILE.integer(
        "HARU_SUPERVISOR_MAX_RESPONSE_BYTES",
        2 * MIB,
        1024,
        2**31,
        doc="a supervisor's answer body past it is refused as `bad_body`; the rest is never read",
    )
    event_retention_days = RECONCILE.integer(
        "HARU_EVENT_RETENTION_DAYS",
        30,
        1,
        36_500,
        doc="events and finished operations older than this are pruned (hourly by Celery beat, "
        "or `manage.py prune_history`)",
        reads=(WORKER, COMMANDS),
    )
    sky_venv = RECONCILE.text(
        "HARU_SKY_VENV",
        kind=Kind.PATH,
        shown_default="unset: `sky` from `PATH`",
        doc="SkyPilot's own virtualenv (`make sky-env` builds `.sky-venv`)",
    )

    # Layouts and inputs.
    fleet_layout = LAYOUTS.text(
        "HARU_FLEET_LAYOUT",
        kind=Kind.PATH,
        shown_default="the two-domain example",
        doc="layout file for `manage.py seed_layout`",
        reads=(COMMANDS,),
    )
    layout_max_bytes = LAYOUTS.integer(
        "HARU_LAYOUT_MAX_BYTES",
        4 * MIB,
        1024,
        2**31,
        doc="a larger layout file is refused before it is read",
    )
    layout_max_rows = LAYOUTS.integer(
        "HARU_LAYOUT_MAX_ROWS",
        20_000,
        10,
        1_000_000,
        doc="a layout with more rows (domains + slots + models) is refused before anything is "
        "written",
    )
    layout_batch_rows = LAYOUTS.integer(
        "HARU_LAYOUT_BATCH_ROWS",
        500,
        1,
        100_000,
        doc="rows written per transaction when a layout is applied, so a tick can write "
        "between batches",
    )
    layout_batch_pause_ms = LAYOUTS.integer(
        "HARU_LAYOUT_BATCH_PAUSE_MS",
        100,
        0,
        10_000,
        doc="the pause between two batches, so a writer waiting for the lock gets it",
    )
    json_max_depth = LAYOUTS.integer(
        "HARU_JSON_MAX_DEPTH",
        64,
        8,
        512,
        doc="JSON nesting allowed wherever Haru parses JSON from outside (supervisor answers, "
        "chat and REST bodies, admin fields, layouts)",
        reads=CONTROL_PLANE,
    )


class DemoSettings:
    """What `python -m haru.demo` reads besides the control plane's own variables."""

    demo_password = OPERATOR.text(
        "HARU_DEMO_PASSWORD", doc="creates the staff user `operator` with this password"
    )


def _script(env: str, when: str, what: str) -> Setting[str | None]:
    """A variable the script driver sets on its commands (`when`: on which of them)."""
    return SCRIPT_COMMANDS.text(env, doc=f"set by the script driver on {when}: {what}")


class SetByHaru:
    """Variables a Haru process sets for the processes it starts; an operator sets none."""

    serve_worker_driver = OWN_PROCESSES.text(
        "HARU_SERVE_WORKER_DRIVER",
        doc="set by `manage.py serve` for its worker processes: run the tick driver here",
        reads=(SERVER,),
    )
    demo_run = OWN_PROCESSES.text(
        "HARU_DEMO_RUN",
        doc="set by the demo on every process it starts: which demo run it belongs to",
    )
    local_host_dir = OWN_PROCESSES.text(
        "HARU_LOCAL_HOST_DIR",
        doc="set by the local launcher (haru/local) on every child of a simulated host: marks them",
    )
    demo_host = OWN_PROCESSES.text(
        "HARU_DEMO_HOST",
        doc="set by the demo on each supervisor it starts: the simulated host's name",
    )

    script_fleet = _script("HARU_FLEET", "every command", "the domain's fleet slug")
    script_domain = _script("HARU_DOMAIN", "every command", "the domain's slug")
    script_domain_id = _script("HARU_DOMAIN_ID", "every command", "the domain's id")
    script_resource = _script(
        "HARU_RESOURCE", "every command", "the resource name `haru-FLEET-DOMAIN`"
    )
    script_launch_id = _script("HARU_LAUNCH_ID", "launch and describe", "the launch attempt's id")
    script_stop_mode = _script(
        "HARU_STOP_MODE", "stop", "`stop` keeps disks, `down` removes everything"
    )


TABLES: tuple[type, ...] = (HaruSettings, DemoSettings, SetByHaru)
__all__ = ["TABLES", "DemoSettings", "HaruSettings", "SetByHaru"]
