"""The offline wheelhouse and a policy's `packages:`: wheels are kept with their SHA-256 and
only if the guest's Python can use them; `policy put` refuses a package, version or missing
dependency the wheelhouse cannot provide, naming it; a sandbox whose policy lists a package
imports it (installed from the wheelhouse only, hashes checked, in a derived image layer that
two sandboxes share, built once), and one whose policy does not list it lacks it."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import shutil
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "api")]

from api_plane import plane_settings, running_plane  # noqa: E402
from wheel_files import linked_image_dir, make_wheel  # noqa: E402  (tests/wheel_files.py)

from aamp.sandbox.wheelhouse import Wheelhouse, WheelhouseError  # noqa: E402

TABULATE = "tabulate==0.9.0"


@pytest.fixture(scope="module")
def tabulate_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tabulate 0.9.0, downloaded once by `Wheelhouse.add` itself (pip, the host's index)."""
    home = tmp_path_factory.mktemp("download")
    settings = plane_settings(home)
    added = Wheelhouse(settings).add([TABULATE], by="test")
    assert [(w.name, w.version) for w in added] == [("tabulate", "0.9.0")]
    return Wheelhouse(settings).path(added[0])


def test_add_refuses_what_is_not_a_plain_requirement(tmp_path: Path) -> None:
    """Nothing but a requirement reaches pip: no options, no URL or file references."""
    house = Wheelhouse(plane_settings(tmp_path))
    for text, why in (
        ("--index-url=http://127.0.0.1:9/simple", "is not a requirement"),
        ("-r/etc/passwd", "is not a requirement"),
        ("x @ http://127.0.0.1:9/x-1.0-py3-none-any.whl", "a URL requirement is refused"),
        ("x @ file:///etc/passwd", "a URL requirement is refused"),
        ("tabulate; rm -rf /", "is not a requirement"),
    ):
        with pytest.raises(WheelhouseError, match=re.escape(why)):
            house.add([text], by="alice")
    assert house.list() == []


def test_add_keeps_wheels_with_their_hash_and_refuses_what_the_guest_cannot_use(
    tmp_path: Path, tabulate_wheel: Path
) -> None:
    house = Wheelhouse(plane_settings(tmp_path))
    [kept] = house.add_files([tabulate_wheel], by="alice")
    assert kept.sha256 == hashlib.sha256(tabulate_wheel.read_bytes()).hexdigest()
    assert kept.added_by == "alice" and house.path(kept).read_bytes() == tabulate_wheel.read_bytes()
    index = json.loads((house.root / "index.json").read_text())
    assert index[tabulate_wheel.name]["sha256"] == kept.sha256
    # A wheel for another Python, or another platform, never enters; nothing else does then.
    media = tmp_path / "media"
    media.mkdir()
    for wrong in ("numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl",
                  "lxml-5.0.0-cp311-cp311-macosx_11_0_arm64.whl",
                  "musl-1.0-cp311-cp311-musllinux_1_1_x86_64.whl",
                  "new-1.0-cp311-cp311-manylinux_2_39_x86_64.whl"):  # fmt: skip
        shutil.copyfile(tabulate_wheel, media / wrong)
        good = make_wheel(media, "fine", "1.0", "X = 1\n")
        with pytest.raises(WheelhouseError, match=re.escape(wrong) + ".*cannot use"):
            house.add_files([good, media / wrong], by="alice")
        assert [w.filename for w in house.list()] == [tabulate_wheel.name]
    # Not a wheel at all, and the same name with other bytes.
    (media / "junk-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    junk = re.escape("junk-1.0-py3-none-any.whl: not a readable wheel")
    with pytest.raises(WheelhouseError, match=junk):
        house.add_files([media / "junk-1.0-py3-none-any.whl"], by="alice")
    other = media / tabulate_wheel.name
    other.write_bytes(make_wheel(media, "x", "1", "").read_bytes())
    with pytest.raises(WheelhouseError, match="already in the wheelhouse with another SHA-256"):
        house.add_files([other], by="alice")
    assert house.remove("Tabulate", "0.9.0")[0].filename == tabulate_wheel.name
    assert house.list() == [] and not (house.root / tabulate_wheel.name).exists()
    with pytest.raises(WheelhouseError, match="tabulate is not in the wheelhouse"):
        house.remove("tabulate")


async def test_policy_put_refuses_packages_the_wheelhouse_cannot_provide(
    tmp_path: Path, tabulate_wheel: Path
) -> None:
    needy = make_wheel(tmp_path, "needy", "1.0", "import tabulate\n", ["tabulate==0.9.0"])
    async with (
        running_plane(plane_settings(tmp_path)) as plane,
        plane.client(plane.admin_token) as c,
    ):
        for wheel in (tabulate_wheel, needy):
            got = await c.put(f"/v1/wheelhouse/wheels/{wheel.name}", content=wheel.read_bytes())
            assert got.status_code == 201, got.text
        assert {w["name"] for w in (await c.get("/v1/wheelhouse")).json()} == {"tabulate", "needy"}

        async def put(packages: list[str]) -> tuple[int, str]:
            body = {"name": "p", "image": "base", "packages": packages}
            got = await c.put("/v1/policies/p", json=body)
            return got.status_code, got.text

        assert (await put([TABULATE]))[0] == 200
        assert (await put(["needy==1.0", TABULATE]))[0] == 200
        status, text = await put(["tabulate==0.8.10"])
        assert status == 400 and "tabulate==0.8.10 is not in the wheelhouse" in text
        assert "versions there: 0.9.0" in text
        status, text = await put(["requests==2.32.3"])
        assert status == 400 and "requests==2.32.3 is not in the wheelhouse" in text
        status, text = await put(["needy==1.0"])
        assert status == 400 and "needy==1.0 needs tabulate==0.9.0; list it too" in text
        # The refused versions changed nothing: the policy is the last one accepted.
        stored = (await c.get("/v1/policies/p")).json()
        assert stored["packages"] == ["needy==1.0", TABULATE]
        audit = (await c.get("/v1/audit", params={"action": "wheelhouse.added"})).json()
    added = {r["resource"]: r["details"]["sha256"] for r in _records(audit)}
    assert added["wheel:tabulate==0.9.0"] == hashlib.sha256(tabulate_wheel.read_bytes()).hexdigest()
    assert "wheel:needy==1.0" in added


def _records(answer: object) -> list[dict]:
    items = answer.get("records", answer) if isinstance(answer, dict) else answer
    return [r for r in items if r["action"] == "wheelhouse.added"]


def _output(ndjson: str) -> str:
    """stdout and stderr of an exec answer (ndjson lines of base64 data)."""
    lines = [json.loads(line) for line in ndjson.splitlines() if line.strip()]
    return "".join(base64.b64decode(x["data"]).decode() for x in lines if "stream" in x)


async def test_packages_are_in_the_sandbox_from_one_derived_layer(
    tmp_path: Path, base_image, tabulate_wheel: Path
) -> None:
    tag = secrets.token_hex(4)  # a version no earlier run built a layer for
    hello = make_wheel(tmp_path, "aamphello", f"1.0+t{tag}", "def hi():\n    return 'hi'\n")
    images = linked_image_dir(tmp_path, base_image)
    settings = plane_settings(
        tmp_path,
        AAMP_RUNTIME_DIR=f"/run/aamp-t{secrets.token_hex(4)}",
        AAMP_IMAGE_DIR=str(images),
        AAMP_DRIVER="gvisor",
    )
    packages = f"[{TABULATE}, aamphello==1.0+t{tag}]"
    with_packages = f"name: p\nimage: base\npackages: {packages}\n"
    probe = (
        "import tabulate, aamphello; print(tabulate.__version__, aamphello.hi(), tabulate.__file__)"
    )
    async with running_plane(settings) as plane, plane.client(plane.admin_token) as c:
        for wheel in (tabulate_wheel, hello):
            got = await c.put(f"/v1/wheelhouse/wheels/{wheel.name}", content=wheel.read_bytes())
            assert got.status_code == 201, got.text
        seen = []
        for document in (with_packages, with_packages, "name: plain\nimage: base\n"):
            made = await c.post("/v1/sandboxes", json={"policy_document": document})
            assert made.status_code in (200, 201), made.text
            sandbox = made.json()
            ran = await c.post(
                f"/v1/sandboxes/{sandbox['id']}/exec", json={"argv": ["python3", "-c", probe]}
            )
            seen.append((sandbox, _output(ran.text)))
            assert (await c.delete(f"/v1/sandboxes/{sandbox['id']}")).status_code == 204
    (first, out1), (second, out2), (plain, out3) = seen
    assert "0.9.0 hi /usr/local/lib/python3.11/dist-packages/tabulate" in out1, out1
    assert "0.9.0 hi" in out2, out2
    assert "ModuleNotFoundError: No module named 'tabulate'" in out3, out3
    assert first["image_hash"] == second["image_hash"] != plain["image_hash"]
    assert first["packages"] == [TABULATE, f"aamphello==1.0+t{tag}"] and plain["packages"] == []
    derived = [
        d for d in (images / "base").iterdir() if (d / "image.json").is_file()
        and "derived_from" in json.loads((d / "image.json").read_text())
    ]  # fmt: skip
    assert [d.name for d in derived] == [first["image_hash"]]  # built once, for both
    meta = json.loads((derived[0] / "image.json").read_text())
    assert meta["derived_from"] == base_image.content_hash
    assert (
        meta["wheels"][tabulate_wheel.name]
        == hashlib.sha256(tabulate_wheel.read_bytes()).hexdigest()
    )
    # The shared base tree was never written through the hard links.
    assert not (base_image.root / "usr/local/lib/python3.11/dist-packages/tabulate").exists()
