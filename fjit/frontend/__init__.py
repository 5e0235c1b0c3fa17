"""Tracing: the user's function run on proxies, each torch call it makes recorded into a Trace
(tracer.py is the entry point; dispatch.py what happens at each call)."""
