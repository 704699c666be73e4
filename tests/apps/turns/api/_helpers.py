"""Skipped: files starting with _ are not endpoints."""

VALUE = 1
