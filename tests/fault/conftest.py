"""The fault suite's deployment: one PostgreSQL cluster and one Redis for the session, a fresh
database, supervisors, server, workers and beat for each test."""

from __future__ import annotations

import pytest

from tests.fault.cluster import Deployment, OwnPostgres, OwnRedis, prepare_template, require_tools


@pytest.fixture(scope="session")
def backing(tmp_path_factory):
    """(PostgreSQL cluster, Redis, template database) of the suite's own."""
    require_tools()
    workdir = tmp_path_factory.mktemp("fault-backing")
    pg = OwnPostgres().init()
    redis = OwnRedis(workdir).start()
    try:
        template = prepare_template(pg, workdir)
        yield pg, redis, template
    finally:
        redis.stop()
        pg.destroy()


@pytest.fixture
def deploy(backing, tmp_path):
    """Return `deploy(policy, env, relay=False)`: a running deployment of the fleet `e2e` (with
    `relay`, east's supervisor behind a relay the test can cut); torn down after."""
    pg, redis, template = backing
    made: list[Deployment] = []

    def make(
        policy: dict | None = None,
        env: dict[str, str | None] | None = None,
        *,
        relay: bool = False,
    ) -> Deployment:
        if not redis.up():
            redis.start()
        deployment = Deployment(tmp_path, pg, redis, template, policy or {}, env, relay=relay)
        made.append(deployment)
        return deployment

    yield make
    for deployment in made:
        deployment.teardown()


def figure(name: str, value: float, unit: str = "s") -> None:
    """Print one figure for the closing note (run with -s, as `make test-fault` does).

    A count (an int) is printed as one; anything else with two decimals.
    """
    shown = str(value) if isinstance(value, int) else f"{value:.2f}"
    print(f"\nFAULT FIGURE {name}: {shown} {unit}", flush=True)
