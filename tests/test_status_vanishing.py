"""``ratchet status --watch`` on a SQLite ledger whose file is removed while it watches:
a clear error and exit status 2, never frames of the deleted file's last contents."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from ratchet import App, Control, TaskContext
from ratchet.testing.processes import clean_env, wait_for


def test_watch_stops_when_the_ledger_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    app = App(url)

    @app.task(name="v.echo")
    def echo(ctx: TaskContext) -> None:
        return None

    Control(url).migrate()
    app.submit("v.echo")
    app.close()
    frames: list[dict[str, object]] = []
    with subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli.main", "status", "--watch", "0.2", "--json",
             "--ledger", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env()) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        reader = threading.Thread(target=lambda: frames.extend(
            json.loads(line) for line in proc.stdout or ()), daemon=True)
        reader.start()
        try:
            wait_for("a first frame", lambda: len(frames) >= 1 or proc.poll() is not None)
            assert frames and frames[0]["counts"] == {"v.echo": {"PENDING": 1}}, frames
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            assert proc.wait(30) == 2
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        reader.join(10)
    assert "was removed while open" in err, err
    assert all(f["schema_version"] != 0 for f in frames), "a frame of a vanished ledger"
