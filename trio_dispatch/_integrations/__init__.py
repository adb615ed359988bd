"""Slots for calls the dispatcher does not make itself.

The httpx2 transport for the official SDKs, ``wrap_provider``, the kept
place of a call answered 429, and the metering every integration shares.
"""
