"""Per-domain supervisor tokens and the URL rules (pure)."""

from __future__ import annotations

import uuid

import pytest

from fleets.core.credentials import derive_supervisor_token
from fleets.core.urls import (
    HostPatternError,
    has_userinfo,
    host_allowed,
    parse_host_patterns,
    scrub_urls,
    supervisor_url_problem,
    without_userinfo,
)

KEY = "master-key-0123456789-abcdefghijklmnop"
A = uuid.UUID("0b6c1f4e-6a8f-4d55-9a0e-1b2c3d4e5f60")
B = uuid.UUID("7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")


def test_a_domain_token_is_stable_and_differs_per_domain_and_per_key():
    token = derive_supervisor_token(KEY, A)
    assert token == derive_supervisor_token(KEY, A)
    # The id however spelled: upper case, no hyphens, a string.
    assert token == derive_supervisor_token(KEY, str(A).upper())
    assert token == derive_supervisor_token(KEY, A.hex)
    assert token != derive_supervisor_token(KEY, B)
    assert token != derive_supervisor_token(KEY + "x", A)
    assert len(token) == 43 and KEY not in token
    # Pinned (computed with `openssl dgst -sha256 -hmac`): a change of derivation would lock
    # every deployed supervisor out.
    assert token == "cAQc2ajzDAGwwoePHL5X5ouomqpEVbdkerIl5gk9bmQ"


def test_no_token_without_a_key_or_from_a_bad_id():
    with pytest.raises(ValueError):
        derive_supervisor_token("", A)
    with pytest.raises(ValueError):
        derive_supervisor_token(KEY, "east")


@pytest.mark.parametrize(
    ("url", "stripped"),
    [
        ("http://user:pass@host:8701/x", "http://host:8701/x"),
        ("https://tok@host", "https://host"),
        ("http://a:b@c@host/p@q", "http://host/p@q"),  # userinfo ends at the last @ before /
        ("http://[::1]:8701", "http://[::1]:8701"),
        ("http://host/path@x", "http://host/path@x"),  # an @ in the path is no credential
        ("http://u:p@[bad", "http://[bad"),  # stripped even where urlsplit would refuse it
        ("", ""),
    ],
)
def test_credentials_are_stripped_from_urls(url, stripped):
    assert without_userinfo(url) == stripped
    assert has_userinfo(url) == (url != stripped)


def test_credentials_are_scrubbed_from_text():
    text = "GET http://u:secret@h:1/v1/status failed; see https://x@y/z and mailto:a@b"
    assert scrub_urls(text) == "GET http://h:1/v1/status failed; see https://y/z and mailto:a@b"


def test_host_patterns():
    patterns = parse_host_patterns(["gpu-*.internal", "10.0.0.0/8", " ", "FD00::/8", "sup.example"])
    assert patterns == ("gpu-*.internal", "10.0.0.0/8", "fd00::/8", "sup.example")
    assert host_allowed("http://GPU-7.internal:8701", patterns)
    assert host_allowed("http://10.2.3.4:8701", patterns)
    assert host_allowed("http://[fd00::1]:8701", patterns)
    assert host_allowed("http://sup.example", patterns)
    assert not host_allowed("http://sup.example.evil.com", patterns)
    assert not host_allowed("http://11.0.0.1:8701", patterns)
    assert not host_allowed("http://gpu-7.internal.evil:8701", patterns)
    assert not host_allowed("http://", patterns)
    assert host_allowed("http://anything", ())  # opt-in: no list, every host
    for bad in ("10.0.0.0/33", "host name", "a/b"):
        with pytest.raises(HostPatternError):
            parse_host_patterns([bad])


def test_supervisor_url_problems_name_the_rule():
    assert supervisor_url_problem("http://h:1", ()) is None
    assert "credentials" in (supervisor_url_problem("http://u:p@h:1", ()) or "")
    refused = supervisor_url_problem("http://u:p@evil:1", ("good",)) or ""
    assert "credentials" in refused
    refused = supervisor_url_problem("http://evil:1", ("good",)) or ""
    assert "'evil' is not in HARU_SUPERVISOR_HOSTS" in refused
