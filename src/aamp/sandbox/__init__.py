"""Sandboxes: the driver contract and its two drivers, guest images, the guest channel, and the
manager that owns every live sandbox on this host.

- `SandboxManager` with `CreateRequest` — create (cold or from the warm pool), use, destroy,
  reap (`manager.py`);
- `Driver` and `SandboxSpec` — the isolation contract (`driver.py`), `GVisorDriver`,
  `FirecrackerDriver`, and which of them work here (`drivers.py`);
- `ImageStore` — guest images by content hash (`images.py`, recipes in `image_recipes.py`),
  and their derived layers with a policy's packages from the offline `Wheelhouse`
  (`wheelhouse.py`);
- `GuestChannel` — exec and files inside a running sandbox, and its errors (`channel.py`);
  `workspace_path`, the one rule for paths a caller may name.

Names load on first use (`aamp.surface`): building an image loads no driver or proxy.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    {
        "channel": (
            "ChannelError",
            "FileTooLargeError",
            "GuestChannel",
            "GuestError",
            "GuestProtocolError",
            "GuestTimeout",
            "GuestUnavailable",
            "PathEscapeError",
            "workspace_path",
        ),
        "driver": (
            "SANDBOX_ID_RE",
            "Driver",
            "DriverError",
            "DriverStatus",
            "SandboxHandle",
            "SandboxSpec",
            "SnapshotUnsupported",
        ),
        "drivers": ("available_drivers", "choose_default_driver", "probe_all"),
        "firecracker": ("FirecrackerDriver",),
        "gvisor": ("GVisorDriver",),
        "image_recipes": ("ImageBuildError",),
        "images": ("BuiltImage", "ImageNotBuilt", "ImageStore", "UnknownImage"),
        "manager": (
            "DEFAULT_IDLE_SECONDS",
            "DEFAULT_TTL_SECONDS",
            "CreateRequest",
            "InvalidRequest",
            "SandboxError",
            "SandboxManager",
            "SandboxStopped",
            "SandboxUnavailable",
            "UnknownSandbox",
        ),
        "wheelhouse": ("MAX_WHEEL_BYTES", "Wheel", "Wheelhouse", "WheelhouseError"),
    },
)
