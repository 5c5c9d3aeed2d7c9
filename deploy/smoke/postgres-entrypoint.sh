#!/bin/sh
# First start on an empty data directory: initdb with POSTGRES_USER as the superuser and its
# password, password (scram) authentication over TCP, then POSTGRES_DB. The set-up server
# listens on a private socket only, so a healthcheck never sees it as the real server.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  setup=$(mktemp -d)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$setup/pw"
  initdb -D "$PGDATA" -U "$user" --pwfile="$setup/pw" --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$setup/pw"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=$setup" -w start >/dev/null
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -h "$setup" -U "$user" -d postgres -q -c "CREATE DATABASE \"$db\" OWNER \"$user\""
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  rmdir "$setup"
  echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
