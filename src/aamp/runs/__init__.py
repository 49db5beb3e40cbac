"""Runs: one task of one agent version in a fresh sandbox — state, steps, artifacts, approvals."""
