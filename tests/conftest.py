"""The suite never reads or writes the running user's ``~/.agora``.

Clients given no keys look for the user's CURVE key and HTTP token under ``$AGORA_HOME/keys``
(``~/.agora/keys`` by default, written by ``agora local``). A developer who ran ``agora local``
would otherwise have every test client try CURVE against the tests' own keyless daemons. Tests
that want a home of their own still set ``AGORA_HOME`` for what they start.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

_HOME = tempfile.mkdtemp(prefix="agora-test-home-")
os.environ["AGORA_HOME"] = _HOME  # before any test module imports the SDK


@pytest.fixture(scope="session", autouse=True)
def _private_agora_home() -> Iterator[None]:
    yield
    shutil.rmtree(_HOME, ignore_errors=True)
