"""The conversation layer: conversation actors and what their turns use.

A conversation runs turns of calls and tools on a provider, with its
history, compaction, retries and results.
"""
