#!/bin/sh
# The official image builds Redis with protected mode off, so that other containers of the
# network may connect without a password; Debian's keeps it on. Turn it off the same way for
# redis-server started without a config file (the port is never published).
set -eu
if [ "${1:-}" = redis-server ] && [ "${2:-}" != "${2#-}" -o $# -eq 1 ]; then
  exec "$@" --protected-mode no
fi
exec "$@"
