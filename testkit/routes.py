"""The routes a gateway app factory serves, read from the router it builds (no services needed)."""

from __future__ import annotations

import inspect
from typing import Any, Iterator


class Anything:
    """Stands in for every argument of an app factory: calling it gives an endpoint (itself)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return self

    def __iter__(self) -> Iterator[Any]:
        """As a list of routes (the console's), it has none: those are not the API's."""
        return iter(())


def served_routes(factory: Any) -> set[tuple[str, str]]:
    """{(path template, METHOD)} of the port `factory` builds; HEAD (implied by GET) left out."""
    router = factory(*[Anything() for _ in inspect.signature(factory).parameters])
    return {(route.path, method) for route in router.routes for method in route.app.endpoints if method != "HEAD"}
