"""``bench/soak.py`` without running the soak: its ``--help``, its argument defaults, its
fallback when network namespaces cannot be made, the forwarder's address pairs and the
outbox's delivery check (the soak itself is run by hand: bench/README.md, "Chaos soak")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import soak  # noqa: E402
from soakkit.forward import parse_pair  # noqa: E402
from soakkit.netns import netns_unavailable_reason  # noqa: E402
from soakkit.outbox import check_deliveries, outbox_unavailable_reason  # noqa: E402


def test_soak_help() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for option in ("--tasks", "--quick", "--json", "--no-netns", "--pg"):
        assert option in done.stdout


def test_soak_defaults_and_quick() -> None:
    full = soak.parse_args([])
    assert (full.tasks, full.feed_s, full.workers, full.pg) == (10_000, 150.0, 4, "private")
    quick = soak.parse_args(["--quick", "--seed", "7"])
    assert (quick.tasks, quick.feed_s, quick.seed) == (500, 30.0, 7)
    assert soak.parse_args(["--quick", "--tasks", "50"]).tasks == 50
    with pytest.raises(SystemExit):
        soak.parse_args(["--tasks", "0"])


def test_netns_fallback_reasons() -> None:
    assert "not root" in (netns_unavailable_reason(euid=1000) or "")
    assert "ip(8)" in (netns_unavailable_reason(euid=0, ip_path=None) or "")
    assert netns_unavailable_reason(euid=0, ip_path="/usr/sbin/ip") is None
    args = soak.parse_args(["--quick", "--no-netns"])
    assert soak.decide_netns(args, probe=lambda: None) == "--no-netns given"
    args = soak.parse_args(["--quick"])
    assert soak.decide_netns(args, probe=lambda: "not root (euid 1000)") == "not root (euid 1000)"
    assert soak.decide_netns(args, probe=lambda: None) is None


def test_forward_pairs() -> None:
    assert parse_pair("10.23.10.1:5432=127.0.0.1:25432") == (
        ("10.23.10.1", 5432), ("127.0.0.1", 25432))
    with pytest.raises(ValueError):
        parse_pair("10.23.10.1:5432")


def test_outbox_reason_and_delivery_check() -> None:
    assert "emit" in (outbox_unavailable_reason(has_emit=False) or "")
    assert "relay" in (outbox_unavailable_reason(has_emit=True, has_relay=False) or "")
    assert outbox_unavailable_reason(has_emit=True, has_relay=True, has_pika=True) is None
    outbox = [("m1", "a"), ("m2", "b"), ("m3", "a")]
    good = check_deliveries(outbox, [("m2", "b"), ("m1", "a"), ("m1", "a"), ("m3", "a")])
    assert good.ok and good.deliveries == 4 and good.delivered_distinct == 3
    late = check_deliveries(outbox, [("m3", "a"), ("m1", "a"), ("m2", "b")])
    assert late.out_of_order_keys == ["a"] and not late.missing
    lost = check_deliveries(outbox, [("m1", "a"), ("m3", "a")])
    assert lost.missing == ["m2"] and not lost.ok
