"""Which images a sandbox host may pull and start: the ones the session service allowed.

The session service sends the images its profiles declare (AllowImages); the
host refuses every other name, so a caller that reaches the host directly
cannot make it pull or run an arbitrary image. Until the first AllowImages
(a fresh or restarted host) every image is refused with ABORTED, which tells
the session service to send the set and retry.
"""

from __future__ import annotations

from bae.common.errors import Conflict, Forbidden, InvalidInput

# Bounds on one AllowImages request: more images than any deployment declares, names as long as
# a registry reference can reasonably be.
MAX_IMAGES = 4096
MAX_IMAGE_CHARS = 512
# Why a host refuses an image before it was told the allowed ones: it restarted since, and the
# session service tells it again and retries.
IMAGES_UNKNOWN = "images_unknown"


class ImageAllowlist:
    def __init__(self) -> None:
        self._images: frozenset[str] | None = None

    def replace(self, images: list[str]) -> None:
        if len(images) > MAX_IMAGES:
            raise InvalidInput(f"at most {MAX_IMAGES} images may be allowed")
        if any(len(image) > MAX_IMAGE_CHARS for image in images):
            raise InvalidInput(f"an image name is longer than {MAX_IMAGE_CHARS} characters")
        self._images = frozenset(images)

    def check(self, image: str) -> None:
        """Raises Conflict (IMAGES_UNKNOWN) or Forbidden unless `image` may be pulled and started here."""
        if self._images is None:
            raise Conflict("this sandbox host has not been told which images are allowed yet", reason=IMAGES_UNKNOWN)
        if image not in self._images:
            raise Forbidden(
                f'image "{image[:MAX_IMAGE_CHARS]}" is not allowed on this sandbox host: no profile declares it'
            )
