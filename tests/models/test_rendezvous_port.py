"""The colocated engine's rendezvous port: TRL's fixed first choice (29500) is shared by every train job
that starts on a node at once (one died with EADDRINUSE in the vLLM suite); each job claims its own."""

from __future__ import annotations

import os
import socket

import pytest
from trl.trainer.utils import ensure_master_addr_port

from workflow_scripts.models.vllm_engine import claim_rendezvous_port

TRL_FIXED_CHOICES = (29500, 23456, 12355, 12345)  # trl/trainer/utils.py _find_free_port, TRL 1.16


def test_trl_alone_gives_two_jobs_the_same_port(monkeypatch):
    """The defect: two jobs that look before either binds are both handed 29500 (when it is free)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 29500))
        except OSError:
            pytest.skip("port 29500 is in use on this machine")
    chosen = []
    for _ in range(2):
        monkeypatch.delenv("MASTER_PORT", raising=False)
        ensure_master_addr_port()
        chosen.append(int(os.environ["MASTER_PORT"]))
    assert chosen == [29500, 29500]


def test_a_job_without_a_port_claims_one_the_os_assigns_and_trl_keeps_it(monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    port = claim_rendezvous_port()
    assert port not in TRL_FIXED_CHOICES and 1024 <= port < 65536
    ensure_master_addr_port()  # what TRL calls before it builds the engine
    assert os.environ["MASTER_PORT"] == str(port)


@pytest.mark.parametrize("launcher", ["31337"])
def test_a_launchers_port_is_kept(monkeypatch, launcher):
    monkeypatch.setenv("MASTER_PORT", launcher)
    assert claim_rendezvous_port() == int(launcher)


@pytest.mark.parametrize("unresolved", ["0", "auto", ""])
def test_an_unresolved_port_is_claimed(monkeypatch, unresolved):
    monkeypatch.setenv("MASTER_PORT", unresolved)
    assert claim_rendezvous_port() not in TRL_FIXED_CHOICES
