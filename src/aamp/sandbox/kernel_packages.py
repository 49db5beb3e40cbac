"""The Debian packages the Firecracker guest kernel and its initramfs come from (what
`firecracker_kernel.py` unpacks, and what an offline bundle must carry). No imports, so the
bundle maker reads it before anything is installed."""

KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_PACKAGE = "busybox-static"
