"""The outbox seen and kept tidy, on both ledgers: ``Ledger.outbox_stats`` /
``Control.outbox`` on an empty and a filled outbox, ``outbox_messages``, ``ratchet
status`` (text and --json), the ``ratchet_outbox_*`` metrics, and the retention prune
(only sent messages older than the age go; unsent ones never, whatever their age)."""

from __future__ import annotations

import json

import pytest
from outboxviewsupport import fill_outbox, sql_run
from typer.testing import CliRunner

from ratchet import App, Control, InvalidArguments
from ratchet.cli.main import cli
from ratchet.observe.ledger_metrics import render_ledger_metrics

pytestmark = pytest.mark.timeout(120)


def test_stats_of_an_empty_outbox(app: App) -> None:
    app.ledger.migrate()
    with Control(app=app) as control:
        stats = control.outbox()
        assert stats is not None
        assert (stats.unsent, stats.sent, stats.failing, stats.oldest_unsent_age_s) == (
            0, 0, 0, None)
        assert stats.topics == [] and stats.failures == [] and stats.relays == []
        assert stats.free_partitions == 32
        assert control.outbox_messages() == []
        seen = control.status().outbox
        assert seen is not None and (seen.unsent, seen.sent, seen.relays) == (0, 0, [])


def test_stats_of_a_filled_outbox(app: App) -> None:
    ids = fill_outbox(app)
    with Control(app=app) as control:
        stats = control.outbox()
        assert stats is not None
        assert (stats.unsent, stats.sent, stats.failing, stats.scanned) == (4, 2, 1, 4)
        assert stats.oldest_unsent_age_s is not None and 0 <= stats.oldest_unsent_age_s < 60
        assert [(t.topic, t.unsent, t.failing) for t in stats.topics] == [
            ("order.paid", 3, 1), ("order.shipped", 1, 0)]
        [failure] = stats.failures
        assert (failure.message_id, failure.attempts, failure.last_error, failure.state) == (
            ids["failing"], 3, "broker refused: no route", "failing")
        [relay] = stats.relays  # relay-old's lease expired: not listed
        assert (relay.holder, relay.partitions) == ("relay-a", (0, 1, 2, 3))
        assert relay.lease_until > stats.ledger_now
        assert stats.free_partitions == 28
        assert not stats.unsent_capped and not stats.sent_capped
        assert control.outbox(top=1).topics == [stats.topics[0]]  # type: ignore[union-attr]

        latest = control.outbox_messages(10)
        assert [m.message_id for m in latest] == [ids[k] for k in (
            "nokey", "new_sent", "failing", "unsent_k2", "unsent_k1", "old_sent")]
        assert [m.state for m in latest] == [
            "unsent", "sent", "failing", "unsent", "unsent", "sent"]
        assert latest[1].sent_by == "relay-a" and latest[1].sent_at is not None
        unsent = control.outbox_messages(10, unsent_only=True)
        assert [m.message_id for m in unsent] == [ids[k] for k in (
            "unsent_k1", "unsent_k2", "failing", "nokey")]
        assert [m.message_id for m in control.outbox_messages(
            10, unsent_only=True, key="k2")] == [ids["unsent_k2"], ids["failing"]]
        assert [m.message_id for m in control.outbox_messages(
            10, topic="order.shipped")] == [ids["nokey"], ids["new_sent"]]
        assert len(control.outbox_messages(2)) == 2
        with pytest.raises(InvalidArguments):
            control.outbox_messages(0)
        with pytest.raises(InvalidArguments):
            control.outbox(top=-1)


def test_oldest_unsent_age_is_the_oldest_head(app: App) -> None:
    first = app.emit("order.paid", {"n": 1}, key="a")
    app.emit("order.paid", {"n": 2}, key="b")
    sql_run(app.ledger_url or "", "UPDATE outbox SET created_at = created_at - 3600 "
                                  "WHERE message_id = {p}", (first,))
    stats = app.ledger.outbox_stats()
    assert stats.oldest_unsent_age_s is not None
    assert 3600 <= stats.oldest_unsent_age_s < 3660


def test_status_text_and_json(app: App) -> None:
    fill_outbox(app)
    url = app.ledger_url or ""
    out = CliRunner().invoke(cli, ["status", "--ledger", url])
    assert out.exit_code == 0, out.output
    assert "outbox: 4 unsent (oldest" in out.output
    assert "1 failing, 2 sent kept; 1 relay(s) hold 4 partition(s), 28 free" in out.output
    assert "relay-a" in out.output and "relay-old" not in out.output
    assert "broker refused: no route" in out.output
    out = CliRunner().invoke(cli, ["status", "--json", "--ledger", url])
    assert out.exit_code == 0, out.output
    outbox = json.loads(out.output)["outbox"]
    assert (outbox["unsent"], outbox["sent"], outbox["failing"]) == (4, 2, 1)
    assert outbox["relays"] == [{"holder": "relay-a", "partitions": [0, 1, 2, 3],
                                 "lease_until": outbox["relays"][0]["lease_until"]}]
    assert outbox["failures"][0]["last_error"] == "broker refused: no route"


def test_status_says_no_relay_runs(app: App) -> None:
    app.emit("order.paid", {"n": 1})
    out = CliRunner().invoke(cli, ["status", "--ledger", app.ledger_url or ""])
    assert out.exit_code == 0, out.output
    assert "no relay holds an outbox partition" in out.output


def test_metrics_have_the_outbox_gauges(app: App) -> None:
    fill_outbox(app)
    with Control(app=app) as control:
        body, _ = render_ledger_metrics(control)
    text = body.decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1])
               for line in text.splitlines() if line.startswith("ratchet_outbox_")}
    assert samples["ratchet_outbox_unsent_messages"] == 4
    assert 0 <= samples["ratchet_outbox_oldest_unsent_age_seconds"] < 60
    assert samples["ratchet_outbox_failing_messages"] == 1
    assert samples["ratchet_outbox_sent_messages"] == 2
    assert samples["ratchet_outbox_free_partitions"] == 28
    assert samples['ratchet_outbox_relay_partitions{holder="relay-a"}'] == 4
    assert "relay-old" not in text


def test_prune_deletes_only_old_sent_messages(app: App) -> None:
    ids = fill_outbox(app)
    url = app.ledger_url or ""
    # An unsent message far older than the age is kept whatever its age.
    sql_run(url, "UPDATE outbox SET created_at = created_at - 864000 WHERE message_id = {p}",
            (ids["unsent_k1"],))
    with Control(app=app) as control:
        dry = control.prune(86400.0, dry_run=True, by="test")
        assert dry.outbox == 1
        assert len(control.outbox_messages(10)) == 6
        report = control.prune(86400.0, by="test")
        assert report.outbox == 1
        left = {m.message_id for m in control.outbox_messages(10)}
        assert left == set(ids.values()) - {ids["old_sent"]}
        stats = control.outbox()
        assert stats is not None and (stats.unsent, stats.sent) == (4, 1)
        again = control.prune(86400.0, by="test")
        assert again.outbox == 0
    # The pruned message's key lock row went with it; a later emit to the key re-creates it.
    keys = {r[0] for r in sql_run(url, "SELECT key FROM outbox_keys")}
    assert "k1" not in keys and {"k2", "k3"} <= keys
    app.emit("order.paid", {"n": 7}, key="k1")
    assert "k1" in {r[0] for r in sql_run(url, "SELECT key FROM outbox_keys")}
    out = CliRunner().invoke(cli, ["prune", "--older-than", "1s", "--ledger", url])
    assert out.exit_code == 0, out.output
    assert "0 sent outbox message(s)" in out.output or "1 sent outbox message(s)" in out.output


def test_prune_cli_reports_outbox(app: App) -> None:
    fill_outbox(app)
    url = app.ledger_url or ""
    out = CliRunner().invoke(cli, ["prune", "--older-than", "1d", "--json", "--ledger", url])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["outbox"] == 1
    out = CliRunner().invoke(cli, ["prune", "--older-than", "1d", "--ledger", url])
    assert out.exit_code == 0, out.output
    assert "0 sent outbox message(s)" in out.output
