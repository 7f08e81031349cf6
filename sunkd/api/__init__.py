"""HTTP surface: metrics, health, read API, scheduler extender, status page."""
