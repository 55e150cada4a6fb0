"""Django settings, read from environment variables only (docs/design.md, "Configuration").

Unset DATABASE_URL means the embedded default (a SQLite file under var/, WAL mode); unset
REDIS_URL means the in-memory channel layer and no Celery broker. A malformed value stops
start-up with ImproperlyConfigured naming the variable.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from common.setting import declared, over
from fleets.base.setting_table import HTTP_BODY_HEADROOM, HaruSettings
from haru import env
from haru.postgres.deadline import DeadlineConnection

BASE_DIR = Path(__file__).resolve().parent.parent


def _load() -> dict:
    """Read every declared variable once (fleets/base/setting_table.py), so all validation
    errors surface at start-up; keyed by the name code reads it as."""
    try:
        loaded = {s.key: env.read(s) for s in declared(HaruSettings)}
        # Read again: its default follows the chat cap.
        loaded["http_max_body_bytes"] = _http_max_body_bytes(loaded["chat_max_body_bytes"])
        return loaded
    except env.ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def _http_max_body_bytes(chat_cap: int) -> int:
    """The server edge's body cap (fleets/server/protocol.py): by default the chat proxy's own
    cap plus 1 MiB, and never below it, so a chat body over its cap still gets the proxy's
    finer 413 (naming HARU_CHAT_MAX_BODY_BYTES) rather than the edge's."""
    setting = HaruSettings.http_max_body_bytes
    cap = env.read(setting, default=chat_cap + HTTP_BODY_HEADROOM)
    if cap < chat_cap:
        raise env.ConfigError(
            f"{setting.env}: must be at least {HaruSettings.chat_max_body_bytes.env} "
            f"({chat_cap}), got {cap}"
        )
    return cap


HARU = _load()
# The same values as typed attributes (fleets/base/conf.py hands code the same view).
_haru = over(HaruSettings, HARU)
VAR_DIR = Path(_haru.var_dir or BASE_DIR / "var")

# prometheus_client's multiprocess mode, per host: every process that loads these settings
# (server workers, Celery workers, management commands) keeps its counters and histograms in
# files here, and /metrics sums them (fleets/metrics/registry.py). Exported to the environment
# because prometheus_client reads it once, when first imported, which is after the settings. The
# server removes dead processes' files when it starts.
PROMETHEUS_MULTIPROC_DIR = Path(_haru.prometheus_multiproc_dir or VAR_DIR / "prometheus")
PROMETHEUS_MULTIPROC_DIR.mkdir(parents=True, exist_ok=True)
os.environ[HaruSettings.prometheus_multiproc_dir.env] = str(PROMETHEUS_MULTIPROC_DIR)


def _secret_key() -> str:
    """Return HARU_SECRET_KEY, or a per-install random key kept under var/ (mode 0600)."""
    if _haru.secret_key:
        return _haru.secret_key
    path = VAR_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.touch(mode=0o600)
    path.write_text(key)
    return key


SECRET_KEY = _secret_key()
DEBUG = _haru.debug
# Without an API token the API is open to whoever reaches it; a page that rebinds its own DNS
# name to 127.0.0.1 would reach it under that name, so only loopback names are answered unless
# HARU_ALLOWED_HOSTS lists others. With a token, every name (the token guards the API).
LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]
ALLOWED_HOSTS = _haru.allowed_hosts or (["*"] if _haru.api_token else LOOPBACK_HOSTS)
# Pages on other origins allowed to POST forms and open the dashboard's WebSocket
# (fleets/live/origin.py), e.g. "https://haru.example.com" behind a proxy that rewrites Host.
CSRF_TRUSTED_ORIGINS = _haru.trusted_origins

if _haru.behind_tls:
    # TLS ends in a reverse proxy (deploy/nginx): cookies only over HTTPS, browsers told to stay
    # on HTTPS for a year, and the proxy's X-Forwarded-Proto says the request was HTTPS. Only
    # safe when the server is reachable through that proxy alone (it binds loopback there).
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 365 * 24 * 60 * 60
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    # Beat's schedule lives in the database, editable in admin (fleets.services.schedule).
    "django_celery_beat",
    # Login throttling (AXES_* below).
    "axes",
    # Per-fleet roles as object permissions (fleets/core/access.py, docs/access.md).
    "guardian",
    "fleets",
]

MIDDLEWARE = [
    # First, so every database read of the request (session, user, lockout) has its deadline.
    "haru.postgres.middleware.RequestDeadlineMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as its documentation asks: turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "haru.urls"
ASGI_APPLICATION = "haru.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Inside the package, so an installed wheel carries them (pyproject package-data).
        "DIRS": [BASE_DIR / "haru" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if _haru.database_url:
    DATABASES = {
        "default": dj_database_url.parse(
            _haru.database_url, conn_max_age=0, conn_health_checks=True
        )
    }
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(VAR_DIR / "haru.sqlite3")}
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Whatever way SQLite was chosen: WAL lets the proxy read while the reconciler writes, and
    # IMMEDIATE takes the write lock at BEGIN, so two writers queue instead of failing on lock
    # upgrade. The SQLite pointer switch (services/route_pointer.py) relies on IMMEDIATE for
    # atomicity.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
POOL_MAX_IDLE_S = 60
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Under ASGI every request may run on a thread of its own, so persistent per-thread
    # connections (CONN_MAX_AGE > 0) pile up until "too many clients" (Django's documentation
    # says to turn them off under ASGI). A pool per process instead: a request borrows a
    # connection and gives it back when it ends; past HARU_DB_POOL_MAX a request waits at most
    # HARU_DB_POOL_TIMEOUT_MS, then fails as a database outage does (503 with Retry-After).
    # With a pool, CONN_HEALTH_CHECKS makes Django pass psycopg's `check_connection`: a
    # connection is tested before it is lent, so a database restart costs no request.
    # Django's backend, failing fast while the database is frozen, and connections whose waits
    # in a web request end at HARU_DB_REQUEST_DEADLINE_MS (haru/postgres/).
    DATABASES["default"]["ENGINE"] = "haru.postgres"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "pool": {
                "min_size": 2,
                "max_size": _haru.db_pool_max,
                "timeout": _haru.db_pool_timeout_ms / 1000,
                # Connections a burst opened above min_size go back after a minute idle, not
                # psycopg_pool's ten: several processes after a burst would otherwise keep
                # HARU_DB_POOL_MAX each against PostgreSQL's max_connections.
                "max_idle": POOL_MAX_IDLE_S,
                "connection_class": DeadlineConnection,
            },
        }
    )
    # Django binds on the client, which never prepares; the reconcile tick's hottest statements
    # use a cursor that binds on the server and are prepared on their fifth run on a connection
    # (fleets/base/prepared.py). None (HARU_DB_PREPARED_STATEMENTS=false) prepares nothing.
    DATABASES["default"]["OPTIONS"].setdefault(
        "prepare_threshold", 5 if _haru.db_prepared_statements else None
    )
    # libpq waits for ever on a server that accepts TCP but never answers (a frozen postmaster).
    # 2 s, libpq's least: an attempt to a host that drops packets is what a request probing an
    # unreachable database waits (haru/postgres/reachability.py); a healthy connect takes ms.
    DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 2)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Login throttling (django-axes): failures are rows in the database, so every server process and
# replica counts the same ones. After HARU_LOGIN_FAILURE_LIMIT failures for one username from
# one address, log-in as that username from that address is refused (429, even with the right
# password) for HARU_LOGIN_LOCKOUT_MINUTES; a success before the limit starts the count again.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    # Answers has_perm(perm, fleet) from per-fleet grants; global ones stay ModelBackend's.
    "guardian.backends.ObjectPermissionBackend",
]
# No guardian "AnonymousUser" row: anonymous requests hold no role anywhere, and a fresh
# install keeps exactly the users its operator created.
ANONYMOUS_USER_NAME = None
AXES_FAILURE_LIMIT = _haru.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=_haru.login_lockout_minutes)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Behind the TLS proxy, the address the proxy saw (haru/client_address.py).
AXES_CLIENT_IP_CALLABLE = "haru.client_address.client_address"
# Haru's own events record what operators do; a row per successful log-in would only grow.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "haru" / "static"]
# WhiteNoise serves assets straight from the finders: no collectstatic step, no STATIC_ROOT, no
# CDN (the portal runs in closed networks).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

if _haru.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [_haru.redis_url], "prefix": "haru"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = _haru.redis_url
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Failover must not wait on the broker (issue 11, finding 15; docs/tick-lease.md): every
# broker call is bounded, so a stopped or frozen Redis fails a publish within
# about two seconds (the server then ticks the fleet itself, fleets/server/driver.py), and
# the worker reconnects within a second of Redis returning (haru/celery_consumer.py).
CELERY_BROKER_CONNECTION_TIMEOUT = 2.0
# Retry for as long as the outage lasts: with 1 s between attempts Celery's default of 100
# retries would end the worker after 100 s without Redis.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 2.0,
    "socket_timeout": 5.0,  # above the worker's 1 s BRPOP, below any tick's patience
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.25,
    "interval_max": 0.5,
}
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.25,
    "interval_max": 0.5,
}
CELERY_WORKER_CONSUMER = "haru.celery_consumer:Consumer"
# Beat reads its schedule from the database (django-celery-beat), so an operator changes the
# reconcile interval in admin without a restart. The rows are seeded after `migrate` from
# HARU_RECONCILE_INTERVAL_MS (fleets.services.schedule); nothing is declared here, because the
# database scheduler would write declared entries over the operator's edits at every start.
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleets.api.auth.BearerTokenAuthentication",
        "fleets.api.auth.PortalSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["fleets.api.auth.HasApiToken", "fleets.api.auth.FleetRole"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["fleets.api.parsers.BoundedJSONParser"],
    "EXCEPTION_HANDLER": "fleets.api.errors.envelope_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Haru control plane API",
    "DESCRIPTION": "Fleet state, promote and demote, route intent, drills and recovery time, "
    "and the OpenAI-compatible chat proxy (`/v1/chat/completions`, `/v1/completions`, "
    "`/v1/models`). Every route takes `Authorization: Bearer <HARU_API_TOKEN>` or a stored "
    "token scoped to some fleets and to read or operate (403 `forbidden` beyond them); the "
    'chat paths also take a chat token (HARU_CHAT_TOKENS). Errors are `{"error": {"code", '
    '"message"}}`.',
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI assets from the sidecar package: no CDN, the portal runs in closed networks.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several components have a `kind`; name the recovery sample's choice set explicitly.
    "ENUM_NAME_OVERRIDES": {
        "RecoveryKindEnum": ["drill", "failover"],
        "DrillModeEnum": ["check", "round_trip"],
    },
    # drf-spectacular's own enum hook, then the path parameters' meanings and the chat proxy's
    # paths, which are served ahead of Django (fleets/api/openapi_hooks.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "fleets.api.openapi_hooks.describe_path_parameters",
        "fleets.api.openapi_hooks.add_chat_proxy_paths",
    ],
}
# Bodies of control requests are tiny; the chat proxy reads its own body with its own limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # The pool warns once per closed connection it gets back; those a request deadline closed
    # are reported once per outage instead (fleets/base/store_outage.py).
    "filters": {"cut_connections": {"()": "haru.postgres.deadline.CutConnectionFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    # httpx logs every request at INFO: one line per heartbeat per domain is noise.
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "psycopg.pool": {"filters": ["cut_connections"]},
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}
