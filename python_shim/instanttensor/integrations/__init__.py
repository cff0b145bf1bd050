"""Integrations with model servers."""
