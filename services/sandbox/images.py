"""Which images a sandbox host may pull and start: the ones the session service allowed.

The session service sends the images its profiles declare (AllowImages); the
host refuses every other name, so a caller that reaches the host directly
cannot make it pull or run an arbitrary image. Until the first AllowImages
(a fresh or restarted host) every image is refused with ABORTED, which tells
the session service to send the set and retry.
"""

from __future__ import annotations

import grpc

from services.sandbox.driver import SandboxFailure

# Bounds on one AllowImages request: more images than any deployment declares, names as long as
# a registry reference can reasonably be.
MAX_IMAGES = 4096
MAX_IMAGE_CHARS = 512


class ImageAllowlist:
    def __init__(self) -> None:
        self._images: frozenset[str] | None = None

    def replace(self, images: list[str]) -> None:
        if len(images) > MAX_IMAGES:
            raise SandboxFailure(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_IMAGES} images may be allowed")
        if any(len(image) > MAX_IMAGE_CHARS for image in images):
            raise SandboxFailure(
                grpc.StatusCode.INVALID_ARGUMENT, f"an image name is longer than {MAX_IMAGE_CHARS} characters"
            )
        self._images = frozenset(images)

    def check(self, image: str) -> None:
        """Raises SandboxFailure unless `image` may be pulled and started here."""
        if self._images is None:
            raise SandboxFailure(
                grpc.StatusCode.ABORTED, "this sandbox host has not been told which images are allowed yet"
            )
        if image not in self._images:
            raise SandboxFailure(
                grpc.StatusCode.PERMISSION_DENIED,
                f'image "{image[:MAX_IMAGE_CHARS]}" is not allowed on this sandbox host: no profile declares it',
            )
