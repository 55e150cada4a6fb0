"""Whether a secret is fit to guard the network: one rule for the control plane and supervisor.

A bearer token or key is the only thing between the network and promote/demote, so a secret an
operator forgot to replace must stop the process, not start it with a warning. The rule:

- none of the PLACEHOLDER_WORDS, compared lower-case with everything but letters and digits
  removed (`change-me`, `CHANGE_ME` and `changeme` are one word);
- at least MIN_SECRET_CHARS characters (32 characters of `secrets.token_urlsafe` are ~190 bits);
- at least MIN_DISTINCT_CHARS different characters (`xxxx…`, `tttt…`, `abababab…`).

The words are long enough that a random token holds one by chance about once in 10^10, and a
random 32-character hex or URL-safe token has far more than 8 distinct characters (the chance it
has fewer is below 10^-12), so a generated secret never trips it. The reason never repeats the
secret: callers print it next to the variable's name.
"""

from __future__ import annotations

MIN_SECRET_CHARS = 32
MIN_DISTINCT_CHARS = 8
PLACEHOLDER_WORDS = ("changeme", "replaceme", "placeholder", "example")
HOW_TO_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def secret_weakness(secret: str) -> str | None:
    """Why `secret` is unfit ("is 9 characters; use at least 32"), or None when it is fit."""
    # A placeholder word first: "is a placeholder" says more about `change-me` than its length.
    folded = "".join(c for c in secret.lower() if c.isalnum())
    for word in PLACEHOLDER_WORDS:
        if word in folded:
            return f"is a placeholder (it contains {word!r}); replace it with a generated secret"
    if len(secret) < MIN_SECRET_CHARS:
        return f"is {len(secret)} characters; use at least {MIN_SECRET_CHARS}"
    distinct = len(set(secret))
    if distinct < MIN_DISTINCT_CHARS:
        return (
            f"is a placeholder ({distinct} distinct characters; a generated secret has at "
            f"least {MIN_DISTINCT_CHARS})"
        )
    return None
