"""A sandbox host on another machine serves sandboxes with egress rules and services: real
processes (a replica on SQLite, `aamp host serve`), real gVisor, in a network namespace whose
loopback carries the fake upstreams (`remote_egress_probe.py`).

- the host's proxy enforces the policy's rules (allowed, refused) and injects the services'
  credential, asked for over the link for that sandbox; the guest never sees the value;
- an HTTPS service on the host: the guest, trusting only its image's CA store, is shown a
  leaf of the installation's egress CA which a replica signed for the host's key, for that
  sandbox and that service's host (`certificate.issued`, actor the host); the host holds no
  CA and no key on its disk, and the installation's CA certificate it was given;
- a hostile host asking for a leaf of another host's sandbox, for a name that is not its
  service's host, for a service not granted, for a sandbox destroyed: each refused and
  recorded (`certificate.refused`);
- the host's egress events are in the control plane's audit chain, naming the host; the
  credential's reveal names the host, the sandbox and the service; its use is recorded;
- nothing on the host's disk (home, runtime directory, log) holds the secret;
- a host asking for a sandbox it does not run, for a service its sandbox was not granted, or
  for no sandbox at all, is refused, and each refusal is recorded; an egress record it hands
  over for another host's sandbox is not written as that sandbox's (`host.report_refused`);
- the sandbox's rules changed over the link take effect in the guest at its next connection
  (the address it was allowed is refused, the one now allowed and its services reached),
  and its host's egress view, asked for over the link and checked, shows exactly those
  decisions after its mark;
- a screenshot of a browser sandbox on h1, through the replica's API: a page its rules
  refuse is 422 `egress_refused` naming the rule (told by h1's view), an allowed one a PNG;
- the audit chain verifies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("remote_egress_probe.py")


def test_remote_host_rules_services_and_audit(tmp_path: Path, base_image, shared_ca_dir) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("sandbox hosts need root and runsc here")
    from netns_probe_run import run_probe  # tests/netns_probe_run.py

    report = run_probe(PROBE, tmp_path / "home", [str(shared_ca_dir)], timeout=900)
    assert report["s1_host"] == "h1" and report["s2_host"] == "h2", report
    guest = report["guest"].splitlines()
    assert '"port": 8080' in guest[0] and '"port": 8081' in guest[1], guest
    assert report["secret_is"].split()[1] not in report["guest"]  # scrubbed from the answer
    assert guest[2] == "403", guest
    assert '"port": 8443' in guest[3], guest  # over TLS, the leaf trusted by the guest
    assert report["upstream_auth"]["8080"] == report["secret_is"], report["upstream_auth"]
    assert report["upstream_auth"]["8443"] == report["secret_is"], report["upstream_auth"]
    assert report["upstream_auth"]["8081"] is None
    assert "8082" not in report["upstream_auth"]
    egress = {e["resource"]: e for e in report["egress"]}
    assert all(e["host"] == "h1" for e in report["egress"]), report["egress"]
    call, ruled, refused, tls = (egress[f"host:10.77.0.5:{p}"] for p in (8080, 8081, 8082, 8443))
    assert (call["decision"], call["reason"], call["service"]) == ("allow", "service: crm", "crm")
    assert (ruled["decision"], ruled["reason"]) == ("allow", "allow[0] 10.77.0.5:8081")
    assert (refused["decision"], refused["reason"]) == ("deny", "ip-literal")
    assert (tls["decision"], tls["service"]) == ("allow", "crm-tls"), tls
    assert report["leaves"] == [
        {"actor": "host:h1", "decision": "allow", "resource": "service:crm-tls",
         "sandbox": report["s1"], "name": "10.77.0.5"}
    ], report["leaves"]  # fmt: skip
    assert report["keys_on_h1_disk"] == [] and report["h1_own_ca"] is False
    assert report["h1_given_ca"] is True
    reveals = report["reveals"]
    assert {r["actor"] for r in reveals} == {"host:h1"}, reveals
    # One secret for both services: held once by the sandbox's proxy, asked once or twice.
    assert all("sandbox sb-" in r["reason"] and "service crm" in r["reason"] for r in reveals)
    assert report["h1_sandbox_seen"] == [True, True]
    assert report["secret_on_h1_disk"] == [] and report["secret_on_h1_disk_after"] == []
    asks = report["h2_asks"]
    assert set(asks["other_host_sandbox"]) == {"refused"}, asks
    assert "not placed on host h2" in asks["other_host_sandbox"]["refused"]
    assert "not granted" in asks["not_granted"]["refused"], asks
    assert "not placed on host h2" in asks["no_such_sandbox"]["refused"], asks
    refusals = report["refusals"]
    assert len(refusals) == 3 and {r["actor"] for r in refusals} == {"host:h2"}, refusals
    assert {"actor": "host:h1", "sandbox": report["s1"]} in report["uses"], report["uses"]
    assert report["forged"] == {"written": [], "refused": [["host:h2", "deny"]]}, report["forged"]
    leaves = report["h2_leaves"]
    assert all(set(a) == {"refused"} for a in leaves.values()), leaves
    assert "not placed on host h2" in leaves["other_host_sandbox"]["refused"]
    assert "not HTTPS at bank.example" in leaves["name_not_granted"]["refused"]
    assert "service crm is not granted" in leaves["service_not_granted"]["refused"]
    assert "h2" in leaves["destroyed_sandbox"]["refused"], leaves
    leaf_refusals = report["leaf_refusals"]
    assert len(leaf_refusals) == 4, leaf_refusals
    assert {(r["actor"], r["decision"]) for r in leaf_refusals} == {("host:h2", "deny")}
    after = report["guest_after_update"].splitlines()
    assert after[0] == "403" and '"port": 8082' in after[1] and '"port": 8080' in after[2], after
    assert report["view_after_update"] == [
        {"port": 8081, "decision": "refused", "rule": "ip-literal", "service": None},
        {"port": 8082, "decision": "allowed", "rule": "allow[0] 10.77.0.5:8082", "service": None},
        {"port": 8080, "decision": "allowed", "rule": "service: crm", "service": "crm"},
    ], report["view_after_update"]
    assert report["view_nothing_after"] == []
    shots = report["shots"]
    assert report["s3_host"] == "h1"
    assert (shots["8082"]["status"], shots["8082"]["code"]) == (422, "egress_refused"), shots
    assert "ip-literal" in shots["8082"]["message"], shots
    assert shots["8081"]["status"] == 200 and shots["8081"]["png"], shots
    assert shots["8081"]["page_status"] == 200, shots
    assert report["verify"]["ok"], report["verify"]
