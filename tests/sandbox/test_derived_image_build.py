"""Building a policy's packages layer runs no code of the wheels on the host: the build runs
the image's Python as root in a chroot (to byte-compile the read-only tree), and a root chroot
is no boundary, so a wheel's `.pth` file — which `site` executes at every start-up — must not
be read then. The hostile wheel here writes a marker inside the tree and one outside it after
breaking out of the chroot; neither may appear, and the wheel is still installed and compiled
(what it does in a sandbox is the sandbox's business)."""

from __future__ import annotations

import hashlib
import secrets
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from wheel_files import make_wheel  # noqa: E402  (tests/wheel_files.py)

from aamp.sandbox.image_derive import derive_tree  # noqa: E402

BREAK_OUT = (
    "import os\n"
    "open('/pth-ran-in-the-tree', 'w').write('ran')\n"
    "d = os.open('/', os.O_RDONLY); os.makedirs('/.x', exist_ok=True); os.chroot('/.x')\n"
    "os.fchdir(d)\n"
    "for _ in range(64): os.chdir('..')\n"
    "os.chroot('.'); open({outside!r}, 'w').write('uid=%d' % os.getuid())\n"
)


def test_a_wheels_pth_file_does_not_run_while_its_layer_is_built(
    tmp_path: Path, base_image
) -> None:
    outside = f"/tmp/aamp-pth-ran-{secrets.token_hex(4)}"
    pth = f"import os; exec({BREAK_OUT.format(outside=outside)!r})\n"
    wheel = make_wheel(tmp_path, "pthwheel", "1.0", "X = 1\n", extra={"zz_pthwheel.pth": pth})
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    out = tmp_path / "derived"
    out.mkdir()
    try:
        derive_tree(base_image.root, out, [(wheel, digest)], "0" * 64, lambda line: None)
        assert not Path(outside).exists(), Path(outside).read_text()
    finally:
        Path(outside).unlink(missing_ok=True)
    tree = out / "rootfs"
    assert not (tree / "pth-ran-in-the-tree").exists()
    site = tree / "usr/local/lib/python3.11/dist-packages"
    assert (site / "zz_pthwheel.pth").read_text() == pth  # installed, for the guest
    assert list((site / "__pycache__").glob("pthwheel.cpython-311.pyc"))  # and compiled
