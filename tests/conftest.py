from __future__ import annotations

import shutil

import pytest

if shutil.which("redis-server") is None:
    pytest.exit("redis-server is not on PATH; install it (apt-get install redis-server)", 3)
