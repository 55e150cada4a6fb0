"""Write docs/configuration.md from the declared settings.

    PYTHONPATH=$PWD .venv/bin/python -m haru.setting_docs > docs/configuration.md

The page is generated, never edited: tests/settings/test_settings_docs.py fails when the
committed file differs from what this prints.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from common.setting import Setting, declared
from fleets.base.setting_table import DemoSettings, HaruSettings, SetByHaru
from supervisor.settings import ChildEnvironment, SupervisorSettings

COMMAND = "PYTHONPATH=$PWD .venv/bin/python -m haru.setting_docs > docs/configuration.md"

# (heading, what it covers, the tables it lists).
PARTS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    (
        "Control plane",
        "Read by every control-plane process (`manage.py serve`, the Celery worker and beat, "
        "the `manage.py` commands) when it loads the settings (`haru/settings.py`), so a "
        'malformed value stops any of them at start-up, naming the variable. "Read by" says '
        "which processes use the value.",
        (HaruSettings,),
    ),
    (
        "Supervisor",
        "Read by `python -m supervisor` on each GPU host (`supervisor/settings.py`); a malformed "
        "value stops it with exit code 2 and a message naming the variable and its range.",
        (SupervisorSettings,),
    ),
    ("Demo", "Read by `python -m haru.demo` (`make demo`).", (DemoSettings,)),
    (
        "Set by Haru, not by operators",
        "Haru sets these for the processes it starts. A training command reads the first ones "
        "(the trainer contract); the rest are listed so that every `HARU_` name is accounted "
        "for.",
        (ChildEnvironment, SetByHaru),
    ),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(setting: Setting[Any]) -> str:
    cells = (
        f"`{setting.env}`",
        setting.default_text(),
        setting.accepts(),
        ", ".join(setting.reads) or "– (a mark only)",
        setting.doc,
    )
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _areas(tables: tuple[type, ...]) -> dict[str, list[Setting[Any]]]:
    """The tables' settings by area, areas in the order they first appear."""
    areas: dict[str, list[Setting[Any]]] = {}
    for table in tables:
        for setting in declared(table):
            areas.setdefault(setting.area, []).append(setting)
    return areas


def render() -> Iterator[str]:
    """Yield the page's lines."""
    yield "# Configuration"
    yield ""
    yield "Generated from the declarations in `fleets/base/setting_table.py` and"
    yield "`supervisor/settings.py`; do not edit it by hand. After changing a declaration, run"
    yield ""
    yield f"    {COMMAND}"
    yield ""
    yield "(`tests/settings/test_settings_docs.py` fails while this page and the declarations"
    yield "disagree.)"
    yield ""
    yield "Everything is read from environment variables, once, at start-up. A blank value"
    yield "counts as unset."
    for heading, about, tables in PARTS:
        yield ""
        yield f"## {heading}"
        yield ""
        yield about
        for area, settings in _areas(tables).items():
            yield ""
            yield f"### {area}"
            yield ""
            yield "| variable | default | accepts | read by | meaning |"
            yield "|---|---|---|---|---|"
            yield from (_row(s) for s in settings)


def main() -> None:
    sys.stdout.write("\n".join(render()) + "\n")


if __name__ == "__main__":
    main()
