#!/usr/bin/env bash
# Makes a Docker engine answer for the compose smoke test: on a Debian host, as root, installs
# what is missing (docker.io, debootstrap, docker-compose) and starts dockerd in the background
# when none is running, trying the storage drivers and network options that commonly fail in
# containers and VMs. Exit 0: `docker info` answers. Exit 3: no engine can run here (not root,
# no apt, or dockerd will not start); callers that may skip print why and do.
set -uo pipefail
LOG=${ATTNSWEEP_DOCKERD_LOG:-/var/log/attnsweep-dockerd.log}

engine_up() { timeout 20 docker info >/dev/null 2>&1; }

missing=()
command -v docker >/dev/null || missing+=(docker.io)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-docker: missing ${missing[*]} and cannot install them (needs root and apt-get)" >&2
    exit 3
  fi
  echo "ensure-docker: installing ${missing[*]}"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null || { echo "ensure-docker: apt-get failed" >&2; exit 3; }
fi

engine_up && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "ensure-docker: no Docker engine answers and only root can start dockerd here" >&2
  exit 3
fi
# The first set that starts wins: the defaults, then without iptables, then the vfs driver
# (no overlay mounts inside some containers).
for opts in "" "--iptables=false" "--iptables=false --storage-driver=vfs"; do
  echo "ensure-docker: starting dockerd ${opts:-(defaults)}; log $LOG"
  # shellcheck disable=SC2086
  nohup dockerd $opts >>"$LOG" 2>&1 &
  pid=$!
  for _ in $(seq 1 30); do
    engine_up && { echo "ensure-docker: dockerd $pid answers"; exit 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  rm -f /var/run/docker.pid
done
echo "ensure-docker: dockerd did not start; last lines of $LOG:" >&2
tail -n 15 "$LOG" >&2
exit 3
