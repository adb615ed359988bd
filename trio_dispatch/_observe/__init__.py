"""Seeing it run: events, log lines, Prometheus and OpenTelemetry.

The event hub, the translation of the rules' outcomes into events and log
lines, and the exporters built on them (their public faces are
``trio_dispatch.events``, ``trio_dispatch.metrics`` and
``trio_dispatch.otel``).
"""
