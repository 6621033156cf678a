#!/usr/bin/env bash
# Debian's headless Chromium for the browser tests (Playwright drives it; it never downloads a browser), and
# Debian's Noto CJK fonts: without a Chinese, Japanese or Korean font Chromium draws those answers as empty boxes.
set -euo pipefail
missing=()
if [ ! -x /usr/bin/chromium ]; then
  missing+=(chromium)
fi
if ! dpkg-query -W -f='${Status}' fonts-noto-cjk 2>/dev/null | grep -q "ok installed"; then
  missing+=(fonts-noto-cjk)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "installing Debian's ${missing[*]} for the browser tests" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
