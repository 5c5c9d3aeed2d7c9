#!/bin/sh
# pip install "$@" inside the image build (Dockerfile). The `ca_bundle` build secret, when
# given, is trusted beside the system bundle for this command only: the combined file lives in
# a temporary directory that is removed before the layer is written. With wheels in
# /wheelhouse (docker/wheelhouse, bound for the step), pip reads them and never an index.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -s /run/secrets/ca_bundle ]; then
  cat /etc/ssl/certs/ca-certificates.crt /run/secrets/ca_bundle > "$tmp/ca.pem"
  export PIP_CERT="$tmp/ca.pem"
fi
if ls /wheelhouse/*.whl >/dev/null 2>&1; then
  echo "attnsweep-pip-install: $(ls /wheelhouse/*.whl | wc -l) wheels in docker/wheelhouse, no index"
  set -- --no-index --find-links /wheelhouse "$@"
fi
pip install -q "$@"
