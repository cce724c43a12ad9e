"""BAE, the Better Agent Engine.

`bae.client` is the client library, `bae.ctl` the admin CLI (`baectl`), `bae.launcher` the
`bae` command, and `bae.common` what the services share.
"""

__version__ = "0.1.0"
API_VERSIONS = ("v1",)
