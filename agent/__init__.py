"""The agent daemon: config, collector registry and scheduler, exporter, HTTP server, events, CLI."""
