"""What the fault suite refuses before starting anything, and how its proxy tells connections apart.

No server is started: the refusals come before the store, and the proxy's labels come
from the first bytes of a connection alone.
"""

from __future__ import annotations

import struct

import pytest

from faults.proxy import FaultProxy, ProxyHost, classify
from faults.run import refuse_unknown


@pytest.mark.parametrize(
    ("store", "fault"),
    [("postgres", "split-sentinels"), ("sentinel", "partition-bus"), ("sqlite", "partition-clients"),
     ("memory", "kill-primary"), ("postgres", "partition-bus")],
)  # fmt: skip
def test_a_fault_a_store_has_none_of_is_refused_naming_its_faults(store: str, fault: str) -> None:
    with pytest.raises(SystemExit, match=f"store {store} has no fault {fault}; its faults: kill-client"):
        refuse_unknown(store, ["clock", fault], "sync")


def test_the_new_kinds_are_known_where_they_apply() -> None:
    assert refuse_unknown("cluster", ["partition-bus", "isolate-primary", "partition-clients",
                                      "partition-replicas"], "sync")[0] == "partition_bus"  # fmt: skip
    assert refuse_unknown("sentinel", ["split-sentinels"], "sync") == ["split_sentinels"]
    assert refuse_unknown("postgres", ["kill-primary"], "async") == ["kill_primary"]


def test_an_async_standby_is_refused_for_a_store_without_one() -> None:
    with pytest.raises(SystemExit, match="--pg-standby async is a setting of the postgres store, not of"):
        refuse_unknown("cluster", [], "async")


def bus_message(sender: str) -> bytes:
    """A cluster bus header as Valkey sends it: signature, lengths, type, epochs, offset, sender id."""
    return b"RCmb" + struct.pack(">IHHHHQQQ", 2256, 1, 6379, 0, 1, 1, 1, 0) + sender.encode() + bytes(2200)


def test_connections_are_labelled_by_their_first_bytes() -> None:
    sender = "0fa46cca" + "1" * 32
    assert classify(bus_message(sender)) == f"bus-{sender}"
    assert classify(b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$21\r\nsentinel-8F8ED018-cmd\r\n") == (
        "sentinel-8f8ed018"
    )
    assert classify(b"*3\r\n$8\r\nREPLCONF\r\n") == "replication"
    assert classify(b"*1\r\n$4\r\nPING\r\n") is None  # undecided: a replica's link starts so too
    assert classify(b"*1\r\n$4\r\nPING\r\n" * 200) == "client"
    assert classify(b"RCmb" + bytes(20)) is None  # a bus header not yet whole


def test_a_mode_set_for_a_prefix_covers_its_labels_and_cut_beats_hold() -> None:
    host = ProxyHost()
    host.close()  # mode_of needs no loop
    proxy = FaultProxy(host, 1, "test")
    proxy.modes = {"sentinel": "hold", "sentinel-8f8ed018": "cut", "bus-0fa4": "hold"}
    assert proxy.mode_of("sentinel-8f8ed018") == "cut"
    assert proxy.mode_of("sentinel-0df5151e") == "hold"
    assert proxy.mode_of("bus-0fa46cca" + "1" * 32) == "hold"
    assert proxy.mode_of("client") == "pass" and proxy.mode_of("replication") == "pass"
