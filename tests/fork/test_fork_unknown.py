"""A fork whose copied history holds an effect nobody could settle (its reply was lost,
the operator gave up on it): the fork settles it by lookup first and never sends it again
(DESIGN §5, §8 fork), on both ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ratchet import App, Control, State, TaskContext
from ratchet.testing import start_counting_service, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)


def test_an_effect_given_up_before_the_fork_point_is_looked_up_not_sent(
        ledger_url: str, tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "svc.db") as svc, \
            svc.client(timeout_s=10.0) as client:
        app = App(ledger_url)

        @app.task(name="fork.pay", version=1)
        def pay_v1(ctx: TaskContext, order: str) -> Any:
            # No lookup, a target not known to honour keys: a lost reply is UNKNOWN.
            return ctx.effect("charge", lambda k: client.execute(k, {"n": 1}),
                              key=f"charge:{order}")

        @app.task(name="fork.pay", version=2)
        def pay_v2(ctx: TaskContext, order: str) -> Any:
            charge = ctx.effect("charge", lambda k: client.execute(k, {"n": 1}),
                                key=f"charge:{order}", lookup=client.lookup)
            return {"charge": charge["id"]}

        try:
            client.set_faults(reply_lost_next=1)
            handle = app.submit("fork.pay", {"order": "o-9"}, version=1)
            with running_worker(app, concurrency=1):
                wait_for("UNKNOWN", lambda: handle.get().state is State.UNKNOWN, 60, 0.05)
            with Control(ledger_url) as control:
                control.resolve(handle.task_id, "give-up", reason="cannot tell", by="ops")
                assert control.get(handle.task_id).state is State.FAILED
                # The effect is the task's only checkpoint: fork after it, with the
                # version that can look it up.
                fork_id = control.fork(handle.task_id, "ratchet:end", version=2,
                                       reason="v2 has a lookup", by="ops")
                [copied] = control.inspect(fork_id).effects
                assert copied.state == "given_up"
            with running_worker(app, concurrency=1):
                done = app.wait(fork_id, timeout_s=60)
            assert done.state is State.SUCCEEDED, done
            assert svc.executions() == {"charge:o-9": 1}
            with Control(ledger_url) as control:
                [settled] = control.inspect(fork_id).effects
            assert settled.state == "done" and settled.via_lookup
            assert client.stats()["lookups_found"] == 1
        finally:
            app.close()
