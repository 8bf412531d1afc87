"""User code type-checks against Ratchet's public types: a middleware subclass annotated
with ``Worker`` and ``TaskContext`` passes ``mypy --strict`` (the hook base class types
them loosely for that reason; see ``ratchet.worker.hooks.Middleware``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "typing_samples" / "user_middleware.py"


def test_a_middleware_annotated_with_worker_and_context_type_checks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(SAMPLE)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
