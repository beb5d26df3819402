"""Backends the frontend language runs programs on."""
