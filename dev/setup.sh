# Sourced by dev/run and dev/test: make this checkout runnable on a fresh Debian machine.
#   ensure_debian_packages PKG...   install missing Debian packages (only when run as root);
#                                   their services are neither started nor enabled
#   ensure_venv EXTRAS              create .venv and install the project (editable) into it,
#                                   skipped when nothing it depends on changed since the last time
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
    # Packages whose maintainer scripts start and enable services (prometheus, node_exporter,
    # alertmanager, munge, slurmctld, slurmd): on a systemd machine they would run from now on and
    # at every boot.  The tests start what they need themselves, each in a temporary directory on
    # free ports.  So: a policy-rc.d that refuses every start during the install (unless the
    # machine has its own), then the units the new packages enabled are disabled again.
    local policy=/usr/sbin/policy-rc.d own_policy=""
    if [ ! -e "$policy" ]; then
        own_policy=1
        printf '#!/bin/sh\n# dev/setup.sh: no service starts while it installs test packages\nexit 101\n' >"$policy"
        chmod 755 "$policy"
    fi
    local enabled_before
    enabled_before="$(enabled_units)"
    local status=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
    [ -n "$own_policy" ] && rm -f "$policy"
    [ "$status" -eq 0 ] || return "$status"
    # The units the install enabled, its dependencies' too (slurm-wlm's slurmctld and slurmd).
    local units=()
    mapfile -t units < <(comm -13 <(echo "$enabled_before") <(enabled_units))
    if [ ${#units[@]} -gt 0 ]; then
        echo "dev: disabling the services the packages enabled: ${units[*]}" >&2
        systemctl disable --quiet "${units[@]}" 2>/dev/null || true
        # Started anyway (a machine whose own policy-rc.d allowed it): stopped again.
        if [ -d /run/systemd/system ]; then
            systemctl stop "${units[@]}" 2>/dev/null || true
        fi
    fi
}

enabled_units() {
    command -v systemctl >/dev/null || return 0
    systemctl list-unit-files --state=enabled --no-legend 2>/dev/null | awk '{print $1}' | sort
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
    # What the install depends on: pyproject.toml (dependencies, extras, entry points, package-dir)
    # and the Python.  The install is editable, so a source change needs no reinstall.  One stamp
    # per set of extras (.venv/.installed-test for `test`); the base install is within any.
    local want stamp=".venv/.installed-${extras:-base}" current
    want="$({ cat pyproject.toml; .venv/bin/python --version; } | sha256sum | cut -d' ' -f1)"
    if [ -x .venv/bin/lockstep ]; then
        for current in .venv/.installed-*; do
            if [ -f "$current" ] && [ "$(cat "$current")" = "$want" ] \
                && { [ "$current" = "$stamp" ] || [ -z "$extras" ]; }; then
                return 0
            fi
        done
    fi
    rm -f .venv/.installed-*
    .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
    echo "$want" >"$stamp"
}
