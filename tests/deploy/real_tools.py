"""The real tools the deploy files are checked with (nginx, systemd-analyze, promtool, openssl).

A tool that is not installed skips its test, saying which Debian package gives it; where
HARU_DEPLOY_TOOLS_REQUIRED=1 (set by .ci/run, which installs them) it fails the test instead, so
CI cannot go green without having run the real checks.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED_ENV = "HARU_DEPLOY_TOOLS_REQUIRED"
# The Debian 12 package that installs each tool (.ci/run installs the same ones).
PACKAGES = {
    "nginx": "nginx-light",
    "systemd-analyze": "systemd",
    "promtool": "prometheus",
    "openssl": "openssl",
}


def require(tool: str) -> str:
    """The tool's path; a skip (or, where required, a failure) naming its package when absent."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if found is not None:
        return found
    why = f"{tool} is not installed (Debian: apt-get install {PACKAGES[tool]})"
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1, and {why}")
    pytest.skip(why)
