"""What this process learned about each supervisor: the features it accepts, and whether it
still takes only the shared token. Learned from answers, forgotten with the transport."""

from __future__ import annotations

import threading

# What each supervisor (by base URL) accepts beyond the original contract, learned from its
# `GET /v1/status` (`features`) or from one refused probe. Absent: not learned yet.
_features_lock = threading.Lock()
_features: dict[str, frozenset[str]] = {}

# Supervisors (by domain) that, during the migration from the shared token, refused their own
# token and accepted the shared one: sent the shared one first until they accept their own.
_tokens_lock = threading.Lock()
_on_shared_token: set[str] = set()


def learned_features(base_url: str) -> frozenset[str] | None:
    with _features_lock:
        return _features.get(base_url.rstrip("/"))


def learn_features(base_url: str, features: frozenset[str]) -> None:
    with _features_lock:
        _features[base_url.rstrip("/")] = features


def forget_features() -> None:
    """Forget every feature learned (tests, and a supervisor replaced by another version)."""
    with _features_lock:
        _features.clear()


def on_shared_token(key: str) -> bool:
    with _tokens_lock:
        return key in _on_shared_token


def learn_shared_token(key: str, shared: bool) -> None:
    with _tokens_lock:
        if shared:
            _on_shared_token.add(key)
        else:
            _on_shared_token.discard(key)


def forget_tokens() -> None:
    """Forget which supervisors still take the shared token (tests)."""
    with _tokens_lock:
        _on_shared_token.clear()


def forget() -> None:
    """Forget everything learned about every supervisor."""
    forget_features()
    forget_tokens()
