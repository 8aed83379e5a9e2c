"""tests/helpers_dashboard.free_port: the port each test's server binds. Two pytest-xdist workers
start servers at once, so each hands out ports from a block of its own, never one in use."""
import socket

from tests import helpers_dashboard
from tests.helpers_dashboard import PORT_BASE, PORT_BLOCK, free_port


def test_ports_are_new_at_each_call_and_bindable():
    ports = [free_port() for _ in range(5)]
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_each_worker_has_a_block_of_its_own(monkeypatch):
    blocks = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        blocks[worker] = {(free_port() - PORT_BASE) // PORT_BLOCK for _ in range(3)}
    assert blocks == {"gw0": {0}, "gw1": {1}, "gw2": {2}}


def test_a_port_in_use_is_skipped(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(helpers_dashboard, "_ports_given", 0)
    taken = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        monkeypatch.setattr(helpers_dashboard, "_ports_given", 0)  # the same port comes up first again
        assert free_port() != taken
