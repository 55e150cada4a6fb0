"""Admin test helpers: read an HTML form the way a browser submits it; a logged-in superuser."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest


class _FormParser(HTMLParser):
    def __init__(self, form_id: str | None) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.in_form = form_id is None
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None
        self._select_first: str | None = None
        self._select_chosen = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form" and self.form_id is not None and a.get("id") == self.form_id:
            self.in_form = True
        if not self.in_form:
            return
        name = a.get("name")
        if tag == "input" and name:
            kind = (a.get("type") or "text").lower()
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.data[name] = a.get("value") or "on"
            elif kind not in ("submit", "button", "image", "file"):
                self.data[name] = a.get("value") or ""
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""
        elif tag == "select" and name:
            self._select, self._select_first, self._select_chosen = name, None, False
        elif tag == "option" and self._select:
            value = a.get("value", "")
            if self._select_first is None:
                self._select_first = value
            if "selected" in a:
                self.data[self._select] = value
                self._select_chosen = True

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select" and self._select:
            if not self._select_chosen and self._select_first is not None:
                self.data[self._select] = self._select_first
            self._select = None
        elif tag == "form" and self.in_form and self.form_id is not None:
            self.in_form = False

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data


def form_data(html: str, form_id: str | None = None) -> dict[str, str]:
    """Return name -> value for every submittable field of the form (textarea text included)."""
    parser = _FormParser(form_id)
    parser.feed(html)
    # A textarea's first newline is not part of its value (HTML parsing rule).
    return {k: v[1:] if v.startswith("\n") else v for k, v in parser.data.items()}


@pytest.fixture
def admin_form():
    """Return `read(html, form_id=None) -> dict`: a form's fields as a browser submits them."""
    return form_data


@pytest.fixture
def superuser_client(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(user)
    return client
