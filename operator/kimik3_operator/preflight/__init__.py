"""Checks that a spec can start before any GPU is claimed, and drafter pairing."""
