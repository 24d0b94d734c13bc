# Sourced by dev/run and dev/test: make this checkout runnable on a fresh Debian machine.
#   ensure_debian_packages PKG...   install missing Debian packages (only when run as root)
#   ensure_venv EXTRAS              create .venv and install the project (editable) into it
set -euo pipefail

ensure_debian_packages() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "dev: not root, so not installing Debian packages: ${missing[*]} (tests that need them skip)" >&2
        return 0
    fi
    echo "dev: installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Packages whose maintainer scripts start services (prometheus): none is started here,
    # the tests start what they need themselves.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_venv() {
    local extras="${1:-}"
    local python="${PYTHON:-python3}"
    if [ ! -x .venv/bin/python ]; then
        if ! "$python" -m venv .venv >/dev/null 2>&1; then
            rm -rf .venv
            ensure_debian_packages python3-venv
            "$python" -m venv .venv
        fi
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
}
