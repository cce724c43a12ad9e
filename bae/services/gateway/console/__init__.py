"""The web console on the admin port (docs/console.md): static pages that call the admin API.

The pages are plain files (static/): an HTML shell, a style sheet and ES modules, with uPlot
vendored for charts. Nothing is fetched from another origin and no script is inline, so the
content security policy allows only the server's own files.
"""
