"""The wire schemas are published as plain JSON Schema (another implementation reads them as
they are), so they write the shared limits as numbers; these pin each to common/limits.py."""

from __future__ import annotations

from common import limits
from common.wire import contract


def test_the_probe_request_schema_writes_the_shared_probe_limits():
    fields = contract.load("probe.request")["properties"]
    assert fields["prompt"]["maxLength"] == limits.MAX_PROBE_PROMPT_CHARS
    assert fields["maxTokens"]["maximum"] == limits.MAX_PROBE_TOKENS
    assert fields["timeoutMs"]["maximum"] == limits.MAX_MS
    assert fields["seed"]["maximum"] == limits.MAX_MS
    assert fields["adapters"]["additionalProperties"]["maxItems"] == limits.MAX_PROBE_ADAPTERS


def test_the_training_stop_schema_writes_the_shared_millisecond_limit():
    fields = contract.load("training-stop.request")["properties"]
    assert fields["graceMs"]["maximum"] == limits.MAX_MS
