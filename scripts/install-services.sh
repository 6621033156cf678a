#!/usr/bin/env bash
# Debian's prometheus and nginx for the `services` tests (tests/e2e/test_monitoring.py, tests/e2e/test_scale_out.py).
# The tests run their own instances (a temp dir, a free port) and never use the packages' system services, so
# those are kept from starting while the packages install: a policy-rc.d that says "no" (exit 101), put in place
# for the install only when the machine has none (container images usually do).
set -euo pipefail
missing=()
[ -x /usr/bin/prometheus ] || missing+=(prometheus)
[ -x /usr/sbin/nginx ] || missing+=(nginx)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
  trap '$SUDO rm -f "$POLICY"' EXIT
fi
echo "installing Debian's ${missing[*]} for the services tests" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
