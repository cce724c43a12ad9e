"""BAE, the Better Agent Engine.

`bae.ctl` is the admin CLI (`baectl`), `bae.launcher` the `bae` command, `bae.services` the four
services and `bae.common` what they share. The client library is a distribution of its own,
`bae-client` (clients/python, package `bae_client`).
"""

__version__ = "0.1.0"
API_VERSIONS = ("v1",)
