"""Both HTTP edges declare their bounds through one family (common/edge/limits.py)."""

from __future__ import annotations

import pytest

from common.edge.limits import EDGE_RANGES, EdgeLimit, edge_settings
from common.setting import Section
from fleets.base.setting_table import HaruSettings
from supervisor.settings import SupervisorSettings


@pytest.mark.parametrize(
    ("table", "attribute_prefix", "env_prefix"),
    [(HaruSettings, "http_", "HARU_HTTP_"), (SupervisorSettings, "", "HARU_SUPERVISOR_HTTP_")],
)
def test_each_edge_bound_lands_on_the_attribute_named_for_it(
    table: type, attribute_prefix: str, env_prefix: str
) -> None:
    # The tables unpack the family by position: a name out of order would read another bound.
    for key, (suffix, low, high) in EDGE_RANGES.items():
        setting = getattr(table, attribute_prefix + key)
        assert setting.key == attribute_prefix + key
        assert setting.env == env_prefix + suffix
        if low is not None:
            assert (setting.minimum, setting.maximum) == (low, high)


def test_an_edge_family_refuses_a_missing_bound_or_a_body_cap_without_a_range() -> None:
    limits = {key: EdgeLimit(100, "doc") for key in EDGE_RANGES}
    with pytest.raises(ValueError, match="HARU_X_MAX_BODY_BYTES needs its own range"):
        edge_settings("HARU_X_", limits, Section("a", ()))
    del limits["max_headers"]
    with pytest.raises(ValueError, match="an edge declares exactly"):
        edge_settings("HARU_X_", limits, Section("a", ()))
