"""The REST API's JSON parser: DRF's, with the bounded parse every edge of Haru uses.

DRF's own parser calls `json.load`, which lets RecursionError through (a plain 500 for
`'[' * 100000`) and keeps the last of two repeated keys. Refusals here are ParseErrors, which
the envelope handler renders as 400 `invalid_request`.
"""

from __future__ import annotations

import codecs
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from common.wire import bounded_json
from fleets.base.conf import haru_settings


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
            return bounded_json.loads(text, max_depth=haru_settings().json_max_depth)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
