"""`make demo` (`python -m haru.demo`): a real failover on a laptop, no GPU needed.

Migrates the embedded SQLite database, seeds `examples/fleet.two-domain.json` (autoFailover on,
short timings), starts two supervisors (each starts its simulated model servers), the server
with its reconcile loop, puts the standby in standby posture (models asleep, trainer running),
prints how to watch and how to break things, then prints the fleet's events as they happen.
Ctrl-C stops every process it started.

Subcommands, for a second terminal: `crash active|standby|east|west` (the whole host dies),
`restore active|standby|east|west` (bring it back and demote it to standby posture), `drill
[check|round_trip]` (run a failover drill now and follow it to its end; `--every N` schedules
one every N minutes instead), `traffic [--rate N]` (ask for the `support-bot` adapter the
standby's trainer publishes, printing which version answers), `stop` (kill whatever a previous
demo left behind).

Only processes this demo started are ever signalled: the demo records each process it starts
in var/demo/pids/ (pid, kernel start time, boot id, so a reused pid is never touched), and a
host's model servers and trainers are the ones its supervisor recorded in its own state dir.

Credentials are per host, as in production: a master key random per run is given to the server
and the `manage.py` steps (HARU_SUPERVISOR_MASTER_KEY), each host's supervisor gets only its own
token (`manage.py supervisor_token demo/<host>`, derived from that key and the domain's id) as
HARU_SUPERVISOR_TOKEN. Both are handed over through the environment and kept in
var/demo/state.json (mode 0600); neither is ever printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import httpx

from common.ports import port_free
from fleets.base.setting_table import SetByHaru
from fleets.core.drills import DrillSchedule, schedule_problems
from fleets.core.states import OperationKind, steps_for
from haru.local import PYTHON, REPO
from haru.local.processes import NotReady, ProcessBook, kill_stamps, stop_stamps, wait_for
from haru.local.server import Server, ensure_staff, environment, manage
from haru.local.supervisors import start_supervisor as local_supervisor
from haru.local.supervisors import supervisor_ready as local_supervisor_ready
from supervisor.config import load_config, state_dir_for
from supervisor.records import ProcessStamp, Record, StateDir

SERVER_PORT = 8700
# Each host's simulated model servers (its supervisor config names the same ports).
MODEL_PORTS: dict[str, tuple[int, ...]] = {"east": (18001, 18002), "west": (18011, 18012)}


class DemoHost(TypedDict):
    port: int  # the supervisor's
    config: str
    models: tuple[int, ...]


HOSTS: dict[str, DemoHost] = {
    name: {"port": port, "config": f"examples/supervisor-{name}.json", "models": MODEL_PORTS[name]}
    for name, port in (("east", 8701), ("west", 8702))
}
LAYOUT = "examples/fleet.two-domain.json"
FLEET = "demo"
# The adapter the standby's sim trainer publishes (examples/supervisor-*.json) every few minutes.
ADAPTER = "support-bot"
PUBLISH_MINUTES = 3
# `traffic`: requests per second, at most, and how long one may take.
TRAFFIC_MAX_RPS = 50
TRAFFIC_TIMEOUT_S = 30
# The demo's own users of the adapter, in the background while it runs: enough requests for a
# canary's gates (10 samples a side within a minute at 20 %), so the train-then-serve loop goes
# on with nobody at the keyboard. `traffic` in a second terminal shows who answers.
BACKGROUND_RPS = 2.0
TRAFFIC_PROMPTS = ("What is 2 + 2?", "Write one sentence about the sea.", "Who are you?")


def var_dir() -> Path:
    return Path(os.environ.get("HARU_VAR_DIR") or REPO / "var")


def demo_dir() -> Path:
    path = var_dir() / "demo"
    path.mkdir(parents=True, exist_ok=True)
    return path


def say(message: str = "") -> None:
    print(message, flush=True)


# -- processes ---------------------------------------------------------------------------------


def pid_dir() -> Path:
    path = demo_dir() / "pids"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_started(name: str, proc: subprocess.Popen) -> None:
    """Remember a process this demo started (started in a new session: it leads its group)."""
    ProcessBook(pid_dir()).record(name, proc)


def started(name: str) -> ProcessStamp | None:
    """Return the recorded process `name` if it still runs (the same process, not a reused pid)."""
    return ProcessBook(pid_dir()).alive(name)


def host_state_dir(name: str) -> Path:
    """Where `name`'s supervisor records the model servers and trainers it started."""
    spec = HOSTS[name]
    config = load_config(spec["config"], cwd=REPO)
    return state_dir_for(config, port=spec["port"], cwd=REPO)


def host_processes(name: str) -> list[ProcessStamp]:
    """Return the live processes of one demo host: its supervisor and what that recorded."""
    stamps = [s for s in (started(name),) if s is not None]
    records = StateDir(host_state_dir(name)).load()
    both: list[Record] = [*records.servers, *records.trainers]
    stamps += [r.stamp for r in both if r.stamp.is_alive()]
    return stamps


def demo_processes() -> list[ProcessStamp]:
    """Return every live process this demo started: the server and both hosts'."""
    server = started("server")
    return [*([server] if server else []), *(p for name in HOSTS for p in host_processes(name))]


# Credentials the demo sets itself; whatever the caller's shell has for them is dropped.
_CREDENTIALS = ("HARU_API_TOKEN", "HARU_SUPERVISOR_TOKEN", "HARU_SUPERVISOR_MASTER_KEY")


def base_env(run_id: str) -> dict[str, str]:
    # The demo is local development mode: embedded database, no broker, open loopback-only API.
    return environment(
        ("DATABASE_URL", "REDIS_URL", *_CREDENTIALS), **{SetByHaru.demo_run.env: run_id}
    )


def control_env(state: dict) -> dict[str, str]:
    """The server's and the `manage.py` steps' environment: the master key, no shared token."""
    return {**base_env(state["run"]), "HARU_SUPERVISOR_MASTER_KEY": state["masterKey"]}


def host_token(state: dict, name: str) -> str:
    token = state.get("hostTokens", {}).get(name)
    if not token:
        raise SystemExit(
            f"demo: no token for {name} in {demo_dir() / 'state.json'} (a demo from an older "
            "version?): run `python -m haru.demo stop`, then start the demo again"
        )
    return str(token)


def host_tokens(env: dict[str, str]) -> dict[str, str]:
    """Each host's supervisor token, printed by `manage.py supervisor_token demo/<host>`."""
    return {
        name: manage(env, "supervisor_token", f"{FLEET}/{name}", timeout=60).stdout.strip()
        for name in HOSTS
    }


def supervisor_env(state: dict, name: str) -> dict[str, str]:
    """A supervisor's environment: its own token only, never the master key."""
    return {**base_env(state["run"]), "HARU_SUPERVISOR_TOKEN": host_token(state, name)}


def start_supervisor(name: str, state: dict) -> subprocess.Popen:
    spec = HOSTS[name]
    proc = local_supervisor(
        port=spec["port"],
        config=spec["config"],
        token=host_token(state, name),
        log=demo_dir() / f"{name}.log",
        env={**supervisor_env(state, name), "HARU_DEMO_HOST": name},
    )
    record_started(name, proc)
    return proc


def wait_until(check: Callable[[], object], timeout: float, what: str) -> None:
    try:
        wait_for(check, timeout, what, every=0.2)
    except NotReady:
        raise SystemExit(
            f"demo: timed out waiting for {what}; see the logs in {demo_dir()}"
        ) from None


def supervisor_ready(name: str, token: str) -> bool:
    return local_supervisor_ready(f"http://127.0.0.1:{HOSTS[name]['port']}", token)


def load_state() -> dict:
    path = demo_dir() / "state.json"
    if not path.exists():
        raise SystemExit("demo: no demo has run here yet (python -m haru.demo)")
    return json.loads(path.read_text())


def save_state(state: dict) -> None:
    path = demo_dir() / "state.json"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(state))


# -- the run -----------------------------------------------------------------------------------


def preflight() -> None:
    ports = [SERVER_PORT, *(h["port"] for h in HOSTS.values())]
    busy = [
        p for p in [*ports, *(p for h in HOSTS.values() for p in h["models"])] if not port_free(p)
    ]
    if not busy:
        return
    leftovers = demo_processes()
    hint = (
        f"{len(leftovers)} process(es) of an earlier demo are still running: stop them with "
        "`python -m haru.demo stop` (or Ctrl-C in that demo's terminal)."
        if leftovers
        else "Something else listens there; find it with `ss -ltnp` and stop it."
    )
    raise SystemExit(f"demo: port(s) {', '.join(map(str, busy))} already in use. {hint}")


def seed(env: dict[str, str]) -> None:
    """Migrate the embedded database and apply the demo's layout."""
    manage(env, "migrate", "--noinput", "-v0", capture=False)
    manage(env, "seed_layout", "--config", LAYOUT, capture=False)


def api(state: dict, method: str, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.request(
        method,
        f"http://127.0.0.1:{SERVER_PORT}/v1{path}",
        json=body,
        timeout=30,
        trust_env=False,
    )


def prepare_standbys(state: dict) -> None:
    """Demote every standby: sleep its models and start its trainer (the standby posture)."""
    fleet = api(state, "GET", f"/fleets/{FLEET}").json()
    for domain in fleet["domains"]:
        if domain["role"] != "standby":
            continue
        for _ in range(60):
            r = api(state, "POST", f"/fleets/{FLEET}/demote", {"targetDomainId": domain["slug"]})
            if r.status_code != 409:  # another operation (a resumed one) still in flight
                break
            time.sleep(1)
        say(f"  standby {domain['slug']}: demote {r.json().get('status', r.text[:200])}")


def current_fleet() -> dict | None:
    """Return the demo fleet's snapshot from the running server, or None if it is not up."""
    try:
        r = httpx.get(
            f"http://127.0.0.1:{SERVER_PORT}/v1/fleets/{FLEET}", timeout=5, trust_env=False
        )
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def resolve_host(ref: str, fleet: dict | None) -> str:
    """Map `active`/`standby` to a host by the fleet's current routing pointer; names pass."""
    if ref in HOSTS:
        return ref
    if fleet is None:
        raise SystemExit(
            f"demo: the server on :{SERVER_PORT} is not answering, so which host is {ref} now "
            f"is unknown; name the host instead ({' or '.join(HOSTS)})"
        )
    for domain in fleet.get("domains", []):
        if domain.get("role") == ref and domain.get("slug") in HOSTS:
            return domain["slug"]
    raise SystemExit(f"demo: fleet {FLEET} has no {ref} domain right now")


def print_instructions(fleet: dict | None) -> None:
    base = f"http://127.0.0.1:{SERVER_PORT}"
    chat = json.dumps({"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}]})
    login = (
        "log in as 'operator' (the password is HARU_DEMO_PASSWORD)"
        if os.environ.get("HARU_DEMO_PASSWORD")
        else "create a login first: .venv/bin/python manage.py createsuperuser"
    )
    active = resolve_host("active", fleet)
    standby = next(name for name in HOSTS if name != active)
    supervisor = started(active)
    kill = (
        f"kill -KILL -- -{supervisor.pgid}"
        if supervisor
        else f"(the {active} supervisor is not running)"
    )
    faults = f"http://127.0.0.1:{MODEL_PORTS[standby][0]}/_sim/faults"
    ask = json.dumps(
        {"model": ADAPTER, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    )
    say(
        f"""
Haru demo is running (fleet "{FLEET}": east and west, simulated H100s).
Right now {active} is active and {standby} is the standby.
The API is open and bound to 127.0.0.1 only (no HARU_API_TOKEN: local development mode).

Watch
  dashboard     {base}/   ({login})
  route intent  curl -s {base}/v1/fleets/{FLEET}/route-intent
  fleet         curl -s {base}/v1/fleets/{FLEET}
  chat          curl -s {base}/v1/chat/completions -H 'X-Haru-Fleet: {FLEET}' \\
                  -H 'content-type: application/json' -d '{chat}'
  metrics       curl -s {base}/metrics | grep ^haru_
  logs          {demo_dir()}/*.log

Break it (active and standby always mean the current ones, whichever host that is)
  take the active host down:     .venv/bin/python -m haru.demo crash active
  kill only its supervisor:      {kill}
      (its model servers live on, like a partitioned host)
  take the standby host down:    .venv/bin/python -m haru.demo crash standby
  bring a host back:             .venv/bin/python -m haru.demo restore {active}
      (starts its supervisor; a host that is not active is demoted to standby posture)
  make the standby's wake fail:  curl -s -XPOST {faults} \\
                                   -H 'content-type: application/json' -d '{{"wakeFails": true}}'
      (clear it with {{"wakeFails": false}}; a failed promotion never moves routing)
  promote by hand:               curl -s -XPOST {base}/v1/fleets/{FLEET}/promote \\
                                   -H 'content-type: application/json' \\
                                   -d '{{"targetDomainId": "{standby}"}}'

Train, then serve (the standby's trainer publishes a {ADAPTER} adapter of qwen-small every
{PUBLISH_MINUTES} minutes; its 3rd, 6th and 9th are deliberately bad: they fail 20 % of requests)
  ask for it:     curl -si {base}/v1/chat/completions -H 'X-Haru-Fleet: {FLEET}' \\
                    -H 'content-type: application/json' -d '{ask}'
      (x-haru-adapter-version names the version that answered; 503 adapter_not_ready
      until the first one is registered, transferred, loaded and probed on the active)
  see users:      .venv/bin/python -m haru.demo traffic   (the demo itself sends {BACKGROUND_RPS:g}
                    requests a second for it, so each canary's gates get samples; this
                    sends more and prints which versions answer, once a second)
  watch it:       curl -s {base}/v1/fleets/{FLEET}/adapters   (and the dashboard's adapters panel)
      (each new version: adapter.registered, its copy stored, loaded and probed on the
      active (the standby's loads wait for its wake), a rollout at 20 % then 100 %; a bad
      one's gate breaches and it is rolled back)

Prove it before the outage
  run a drill now:               .venv/bin/python -m haru.demo drill   (or: drill round_trip)
      (the standby wakes, must answer its golden probe, and goes back to sleep and training)
  drill every minute:            .venv/bin/python -m haru.demo drill --every 1
      (the fleet page shows each drill, the readiness verdict and the recovery time)

The fleet's events follow. Ctrl-C stops everything.
"""
    )


def ensure_operator(env: dict) -> None:
    """Create or update the staff user `operator` when HARU_DEMO_PASSWORD is set."""
    password = os.environ.get("HARU_DEMO_PASSWORD")
    if password:
        ensure_staff(env, "operator", password)


def event_line(event: Any) -> str:
    """One line for an event in the demo's stream (an error quoting a JSON body included)."""
    where = f" {event.domain.slug}" if event.domain else ""
    step = f" {event.step}" if event.step else ""
    took = f" ({event.duration_ms} ms)" if event.duration_ms is not None else ""
    data = event.data
    detail = data.get("reason") or data.get("message") or data.get("code") or data.get("why")
    extra = f": {' '.join(str(detail).split())[:120]}" if detail else ""
    # An adapter's events (registered, copy stored/loaded/probed, rolled back...) name the
    # version they are about: the train-then-serve loop reads as one story.
    adapter = f" {data['adapter']}@v{data.get('version', '?')}" if data.get("adapter") else ""
    route = data.get("route") if event.kind == "fleet.adapter.route" else None
    if isinstance(route, dict):
        # A route write names what it routes: the version, and the candidate at its weight.
        adapter = f" {data.get('adapter')} -> v{route.get('version')}"
        if route.get("candidate"):
            share = route.get("weightPermille", 0) / 10
            adapter += f" (v{route['candidate']} at {share:g} %)"
    line = f"{event.kind}{adapter}{where}{step}{took}{extra}"
    return f"{event.created_at:%H:%M:%S.%f}"[:12] + f" {line}"


class RetryFold:
    """Fold repeated retries of one step failing the same way (a wake failing for a minute
    writes one every second or so): the first is printed, the rest are counted, and the count
    is one line when anything else happens."""

    def __init__(self) -> None:
        self.key: tuple[Any, str, str] | None = None
        self.folded = 0
        self.last_attempt: Any = None

    def line(self, event: Any) -> str | None:
        """The line(s) to print for `event`, or None when it only adds to the count."""
        key = (
            (event.operation_id, event.step, str(event.data.get("message", "")))
            if event.kind == "operation.step.retry"
            else None
        )
        if key is not None and key == self.key:
            self.folded += 1
            self.last_attempt = event.data.get("attempt", "?")
            return None
        lines = [self.flush()] if self.folded else []
        self.key, self.folded = key, 0
        lines.append(event_line(event))
        return "\n".join(line for line in lines if line)

    def flush(self) -> str:
        if not self.folded:
            return ""
        text = f"the same retry {self.folded} more time(s), to attempt {self.last_attempt}"
        self.folded = 0
        return f"{'':12} ... {text}"


def follow_events(procs: dict[str, subprocess.Popen]) -> None:
    """Print new events until interrupted; report a process that exits on its own."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415 - the demo's launcher runs without Django until here

    django.setup()
    from fleets.models import Event  # noqa: PLC0415 - needs the app registry set up above

    last = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
    reported: set[str] = set()
    folds = RetryFold()
    while True:
        for event in Event.objects.filter(id__gt=last).select_related("domain").order_by("id"):
            last = event.id
            line = folds.line(event)
            if line is not None:
                say(line)
            if event.kind == "fleet.route.switched" and event.domain:
                say(
                    f"    {event.domain.slug} is active now: `crash active` takes it down; "
                    "`restore standby` brings the other host back"
                )
        for name, proc in procs.items():
            if proc.poll() is not None and name not in reported:
                reported.add(name)
                say(f"--- {name} exited (status {proc.returncode}); see {demo_dir()}/{name}.log")
        time.sleep(0.3)


def _ask_adapter(client: httpx.Client, n: int) -> str:
    """Ask the adapter once (the n-th prompt); what answered: its version, or the failure."""
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": TRAFFIC_PROMPTS[n % len(TRAFFIC_PROMPTS)]}],
        "max_tokens": 16,
    }
    url = f"http://127.0.0.1:{SERVER_PORT}/v1/chat/completions"
    try:
        r = client.post(url, json=body, headers={"X-Haru-Fleet": FLEET})
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if r.status_code == 200:
        return r.headers.get("x-haru-adapter-version", "?")
    return f"HTTP {r.status_code} {_error_message(r)[:60]}"


def background_users(stop: threading.Event, rate: float = BACKGROUND_RPS) -> threading.Thread:
    """Send the demo's own requests for the adapter until `stop` is set, printing nothing
    (the event stream says what the loop does with them)."""

    def run() -> None:
        n = 0
        with httpx.Client(timeout=TRAFFIC_TIMEOUT_S, trust_env=False) as client:
            while not stop.wait(1 / rate):
                _ask_adapter(client, n)
                n += 1

    thread = threading.Thread(target=run, name="demo-users", daemon=True)
    thread.start()
    return thread


def traffic(rate: float, seconds: float | None = None) -> int:
    """Ask for the adapter, one request after another, at most `rate` a second, and print once
    a second which versions answered (and any failure): what users get. No API key: the open
    local API, so each request draws its version on its own during a canary."""
    period = 1 / rate
    end = None if seconds is None else time.monotonic() + seconds
    n = 0
    with httpx.Client(timeout=TRAFFIC_TIMEOUT_S, trust_env=False) as client:
        while end is None or time.monotonic() < end:
            second_end = time.monotonic() + 1
            seen: dict[str, int] = {}
            while time.monotonic() < second_end:
                key = _ask_adapter(client, n)
                n += 1
                seen[key] = seen.get(key, 0) + 1
                time.sleep(max(0.0, period - 0.001))
            summary = ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))
            say(f"{time.strftime('%H:%M:%S')} {ADAPTER}: {summary}")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(fresh: bool) -> None:
    # Ctrl-C, a closed terminal or a plain `kill` all end in the same orderly shutdown (and a
    # shell that started us in the background must not leave SIGINT ignored).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    preflight()
    if fresh:
        for suffix in ("", "-wal", "-shm"):
            (var_dir() / f"haru.sqlite3{suffix}").unlink(missing_ok=True)
    state: dict = {"run": secrets.token_hex(8), "masterKey": secrets.token_urlsafe(32)}
    save_state(state)
    env = control_env(state)
    env.update(
        {
            "HARU_RECONCILE_INTERVAL_MS": "1000",
            "HARU_DEFAULT_FLEET": FLEET,
        }
    )
    say("demo: migrating the embedded database and seeding the two-domain fleet")
    seed(env)
    state["hostTokens"] = host_tokens(env)
    save_state(state)
    ensure_operator(env)

    procs: dict[str, subprocess.Popen] = {}
    users_stop = threading.Event()
    try:
        for name in HOSTS:
            procs[name] = start_supervisor(name, state)
        say("demo: starting the supervisors (each starts two simulated model servers)")
        for name in HOSTS:
            wait_until(partial(supervisor_ready, name, host_token(state, name)), 60, name)
        server = Server(env, demo_dir() / "server.log", port=SERVER_PORT)
        procs["server"] = server.spawn("--host", "127.0.0.1")
        record_started("server", procs["server"])
        wait_until(server.healthy, 30, "the server")
        say("demo: putting the standby in standby posture (models asleep, trainer running)")
        prepare_standbys(state)
        print_instructions(current_fleet())
        os.environ.update(env)
        background_users(users_stop)
        follow_events(procs)
    except KeyboardInterrupt:
        say("\ndemo: stopping")
    finally:
        users_stop.set()
        shutdown(procs)


def shutdown(procs: dict[str, subprocess.Popen]) -> None:
    """Stop the server, then the supervisors (they stop their children), then anything left.

    The supervisors are found by their pid files, so one that `restore` started in another
    terminal gets the same orderly SIGTERM as the ones this run started.
    """
    stamps = [stamp for name in ("server", *HOSTS) if (stamp := started(name)) is not None]
    stop_stamps(stamps, procs.values(), grace_s=15)
    killed = kill_stamps(demo_processes())
    say(f"demo: stopped ({len(procs)} started, {killed} killed at the end)")


def restore(ref: str) -> None:
    """Bring a host back: start its supervisor if it is down, then demote it if not active."""
    state = load_state()
    fleet = current_fleet()
    host = resolve_host(ref, fleet)
    if started(host) is None:
        if not port_free(HOSTS[host]["port"]):
            raise SystemExit(
                f"demo: port {HOSTS[host]['port']} is taken by a process this demo did not "
                "start; find it with `ss -ltnp`"
            )
        proc = start_supervisor(host, state)
        say(f"demo: {host} supervisor started (pid {proc.pid}); waiting until it is ready")
        wait_until(lambda: supervisor_ready(host, host_token(state, host)), 60, host)
    if fleet is None:
        say("demo: the server is not running, so nothing was demoted")
        return
    role = next((d["role"] for d in fleet["domains"] if d["slug"] == host), None)
    if role == "active":
        say(f"demo: {host} is the active domain; it keeps serving")
        return
    # A host that was failed comes back through its heartbeat (failed -> degraded -> ready),
    # and a promotion away from it may still be putting it to sleep: a demote asked before
    # either settles is refused, so wait for both (bounded) before asking.
    say(f"demo: waiting for {host}'s heartbeat and any operation in flight")
    wait_until(lambda: _demotable(host), 60, host)
    r = api(state, "POST", f"/fleets/{FLEET}/demote", {"targetDomainId": host})
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    outcome = body.get("status") or body.get("error", {}).get("message") or r.text[:200]
    say(f"demo: {host} demote to standby posture: {outcome}")


# How long `drill` follows the drill it started: a check drill on the simulator takes seconds,
# a round trip under a minute; the demo's step budgets bound either well inside this.
DRILL_FOLLOW_S = 180.0


def _error_message(r: httpx.Response) -> str:
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    return (body.get("error") or {}).get("message") or r.text[:200]


def drill(mode: str) -> int:
    """Ask for a drill of the standby now and print its steps as they pass; 0 if it passed."""
    try:
        r = api({}, "POST", f"/fleets/{FLEET}/drill", {"mode": mode})
    except httpx.HTTPError as exc:
        raise SystemExit(
            f"demo: the server on :{SERVER_PORT} is not answering ({exc}); is the demo running?"
        ) from None
    if r.status_code != 202:
        say(f"demo: {mode} drill refused (HTTP {r.status_code}): {_error_message(r)}")
        return 1
    op = r.json()["operation"]
    say(f"demo: {mode} drill of {op['targetDomainSlug']} started (operation {op['id'][:8]})")
    # The steps come from the drill's plan, in order: a poll every 0.3 s misses the steps that
    # take milliseconds (verify_gpu, start_training, a round trip's switch_route), and a step
    # the operation is past has run, so each one up to the current step is printed.
    plan = [str(step) for step in steps_for(OperationKind.DRILL, op.get("drillMode") or mode)]
    printed = 0

    def print_up_to(step: str, *, including: bool) -> None:
        nonlocal printed
        if step not in plan:
            return
        end = plan.index(step) + (1 if including else 0)
        for name in plan[printed:end]:
            say(f"  {name}")
        printed = max(printed, end)

    deadline = time.monotonic() + DRILL_FOLLOW_S
    while op["state"] in ("pending", "running"):
        if time.monotonic() > deadline:
            say(f"demo: the drill is still {op['state']} after {DRILL_FOLLOW_S:.0f}s; see the logs")
            return 1
        print_up_to(op.get("currentStep") or "", including=True)
        time.sleep(0.3)
        op = api({}, "GET", f"/operations/{op['id']}").json()
    shown = plan[printed - 1] if printed else ""
    if op["state"] == "succeeded":
        print_up_to(plan[-1], including=True)
    else:
        error = op.get("error") or {}
        # The failed step is named below; the ones before it ran.
        print_up_to(error.get("step") or "", including=False)
        say(
            f"demo: the drill {op['state']} at {error.get('step') or shown}: "
            f"{error.get('code', '')}: {error.get('message', '')}"
        )
        say("      (every failure path puts the standby back to sleep with its trainer running)")
        return 1
    report = api({}, "GET", f"/fleets/{FLEET}/recovery").json()
    drills = report.get("drill") or {}
    routing = "moved there and back" if mode == "round_trip" else "never moved"
    say(
        f"demo: the drill passed; routing {routing}. "
        f"Drill recovery time over the last {drills.get('count', 0)}: "
        f"p50 {_seconds(drills.get('p50Ms'))}, p95 {_seconds(drills.get('p95Ms'))} "
        f"(objective {_seconds(report.get('objectiveMs'))})"
    )
    return 0


def _seconds(ms: object) -> str:
    return f"{ms / 1000:.1f}s" if isinstance(ms, int | float) else "-"


def drill_schedule(every: int, mode: str) -> None:
    """Schedule a drill every `every` minutes, any time of day (0: no schedule), as an
    operator does in Django admin (Fleets, "Failover drills")."""
    problems = schedule_problems(DrillSchedule(every or None))
    if problems:
        raise SystemExit(f"demo: {'; '.join(problems)}")
    script = (
        "import os\n"
        "from fleets.models import Fleet\n"
        "every = int(os.environ['DEMO_DRILL_EVERY']) or None\n"
        "Fleet.objects.filter(slug=os.environ['DEMO_FLEET']).update(\n"
        "    drill_interval_minutes=every, drill_window_start=None, drill_window_end=None,\n"
        "    drill_mode=os.environ['DEMO_DRILL_MODE'])\n"
    )
    env = {
        **control_env(load_state()),
        "DEMO_DRILL_EVERY": str(every),
        "DEMO_DRILL_MODE": mode,
        "DEMO_FLEET": FLEET,
    }
    subprocess.run([PYTHON, "manage.py", "shell", "-c", script], cwd=REPO, env=env, check=True)
    if every:
        say(
            f"demo: a {mode} drill every {every} minute(s), any time of day; the reconciler "
            "starts the first one within seconds (watch the fleet page)"
        )
    else:
        say("demo: no drill schedule; drills run only when asked for")


def _demotable(host: str) -> bool:
    """True once `host` is back (ready or degraded) and no operation is in flight."""
    fleet = current_fleet()
    if fleet is None or fleet.get("operation") is not None:
        return False
    domain = next((d for d in fleet["domains"] if d["slug"] == host), None)
    return domain is not None and domain["state"] in ("ready", "degraded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m haru.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--fresh", action="store_true", help="start from an empty database")
    sub = parser.add_subparsers(dest="command")
    targets = ["active", "standby", *sorted(HOSTS)]
    crash = sub.add_parser("crash", help="take a host down: its supervisor and every child")
    crash.add_argument("host", choices=targets)
    back = sub.add_parser("restore", help="bring a host back and demote it to standby posture")
    back.add_argument("host", choices=targets)
    # The name the walk-through used before `restore`; kept so old notes still work.
    start = sub.add_parser("start-host", help="same as restore")
    start.add_argument("host", choices=targets)
    run_drill = sub.add_parser(
        "drill", help="run a failover drill of the standby now, or schedule one (--every)"
    )
    run_drill.add_argument("mode", nargs="?", choices=["check", "round_trip"], default="check")
    run_drill.add_argument(
        "--every",
        type=int,
        metavar="MINUTES",
        help="instead, schedule a drill every MINUTES minutes (0: no schedule)",
    )
    sub.add_parser("stop", help="kill every process this demo started that is still running")
    users = sub.add_parser("traffic", help=f"ask for the {ADAPTER} adapter, printing who answers")
    users.add_argument("--rate", type=float, default=4.0, help="requests per second")
    args = parser.parse_args(argv)
    os.chdir(REPO)
    if args.command == "crash":
        host = resolve_host(args.host, current_fleet())
        killed = kill_stamps(host_processes(host))
        say(f"demo: {host} is down ({killed} processes killed)")
    elif args.command in ("restore", "start-host"):
        restore(args.host)
    elif args.command == "drill" and args.every is not None:
        drill_schedule(args.every, args.mode)
    elif args.command == "drill":
        return drill(args.mode)
    elif args.command == "traffic":
        if not 0 < args.rate <= TRAFFIC_MAX_RPS:
            parser.error(f"--rate must be above 0 and at most {TRAFFIC_MAX_RPS}")
        with contextlib.suppress(KeyboardInterrupt):
            return traffic(args.rate)
    elif args.command == "stop":
        killed = kill_stamps(demo_processes())
        say(f"demo: killed {killed} leftover process(es)")
    else:
        run(args.fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
