"""A self-hosted model server's own load: what it runs, and what it queues.

``_load`` holds the value (``ServerLoad``), ``_formats`` the servers'
gauges and their parser (``parse_server_load``, and ``metrics_text``, its
reverse, for fake servers), ``_probe`` where a load comes from
(``ServerMetrics``, or an async callable) and the one way it is read
(``read_server_load``). Imports point that way: the probe on the formats,
the formats on the value.
"""
