"""BAE, the Better Agent Engine: the small package shared by every service."""

__version__ = "0.1.0"
API_VERSIONS = ("v1",)
