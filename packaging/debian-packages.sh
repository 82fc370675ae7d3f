# Sourced by setup-host.sh and build-image.sh: install the Debian packages that are missing.
# The caller defines say and die (each prints its own script's prefix).

# need_debs PKG...: apt-get install those of PKG not installed yet (nothing when all are).
need_debs() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed (fix: check the network / apt sources)"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed (fix: run it by hand to see why)"
}
