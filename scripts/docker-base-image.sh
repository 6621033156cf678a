#!/usr/bin/env bash
# The Dockerfile's base image (its first FROM, python:3.11-slim), pulled or, where the image registry cannot be
# reached, a stand-in built from Debian's packages and imported under the same name.
#
#   scripts/docker-base-image.sh [IMAGE]     prints "present", "pulled" or "built" (the last line, on stdout)
#
# The stand-in: `debootstrap --variant=minbase bookworm` with python3 (3.11), python3-pip, python3-venv and
# ca-certificates; a virtualenv at /usr/local gives `python` and `pip` on PATH as in the real image (the real one
# has its interpreter at /usr/local/bin/python), and pip installs there without Debian's externally-managed
# refusal. The machine's CA bundle and its package-index settings are copied in, so pip inside `docker build`
# reaches the package index the way this machine does (through a mirror or an intercepting proxy). Build with
# host networking (`docker build --network host`): the index is then reached as from this machine.
# An image of that name that already exists is kept: delete it (`docker image rm python:3.11-slim`) to rebuild.
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${1:-$(awk 'toupper($1) == "FROM" { print $2; exit }' Dockerfile)}
SUITE=bookworm
PACKAGES=python3,python3-pip,python3-venv,ca-certificates
LOG=${TYPEWRITER_BASE_IMAGE_LOG:-/var/log/typewriter-base-image.log}

say() { echo "docker-base-image: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo present
    exit 0
fi
if timeout 120 docker pull "$IMAGE" >&2; then
    echo pulled
    exit 0
fi
say "cannot pull $IMAGE: building a stand-in from Debian's $SUITE packages (log: $LOG)"

if ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >>"$LOG" 2>&1
fi

# The Debian mirror this machine's apt uses (deb822 or one-line sources), so debootstrap goes where apt goes.
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$1 == "URIs:" { print $2; exit }')
if [[ -z $mirror ]]; then
    mirror=$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

root=$(mktemp -d /var/tmp/typewriter-base.XXXXXX)
trap 'rm -rf --one-file-system "$root"' EXIT
say "debootstrap $SUITE from $mirror"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >>"$LOG" 2>&1 || {
    say "debootstrap failed; the end of $LOG:"
    tail -n 20 "$LOG" >&2
    exit 1
}

# python and pip on PATH, as in the real image: a virtualenv rooted at /usr/local.
chroot "$root" python3 -m venv /usr/local
# The machine's CA bundle (it may trust an intercepting proxy's certificate), kept by update-ca-certificates too.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$root/usr/local/share/ca-certificates"
cp -L /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true

# pip's settings from this machine's config files and PIP_INDEX_URL / PIP_EXTRA_INDEX_URL: the index URLs and
# trusted hosts. Local paths (file:// indexes, find-links folders) do not exist inside a build and are left out.
python3 - "$root/etc/pip.conf" <<'EOF' >&2
import configparser, os, sys

files = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
         os.path.expanduser("~/.config/pip/pip.conf")]
found = {}
for path in files:
    parser = configparser.ConfigParser()
    parser.read(path)
    for section in ("global", "install"):
        if parser.has_section(section):
            for key in ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout"):
                if parser.has_option(section, key):
                    found[key] = parser.get(section, key)
for key in ("index-url", "extra-index-url", "trusted-host", "default-timeout"):
    value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if value:
        found[key] = value
lines = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt"]
for key, value in found.items():
    kept = [v for v in value.split() if not v.startswith("file:") and not v.startswith("/")]
    if kept:
        lines.append(f"{key} = {' '.join(kept)}")
    if kept != value.split():
        print(f"docker-base-image: pip {key}: left out local paths {value!r}")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
print("docker-base-image: pip.conf in the stand-in:", "; ".join(lines[1:]))
EOF

# Smaller: no downloaded packages or package lists (as in the real slim image), no documentation.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old

say "importing it as $IMAGE"
tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'LABEL org.typewriter.stand-in="debootstrap bookworm + python3 venv at /usr/local"' \
    --change 'CMD ["python3"]' \
    - "$IMAGE" >&2
echo built
