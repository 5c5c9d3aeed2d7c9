"""Attacks on the service (docs/security.md): `python -m drills.security`."""
