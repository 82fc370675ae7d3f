#!/usr/bin/env bash
# Install, upgrade or remove the gpuguard agent on a systemd host (idempotent).
#
#   sudo bash packaging/install.sh                 # install or upgrade from this checkout
#   sudo bash packaging/install.sh --enable        # ... and enable + (re)start the service
#   sudo bash packaging/install.sh --enforce       # ... with enforce mode's capabilities (drop-in)
#   sudo bash packaging/install.sh --uninstall     # remove program, unit, logrotate; keep config and logs
#   sudo bash packaging/install.sh --uninstall --purge   # ... and /etc/gpuguard, /var/log/gpuguard too
#   bash packaging/install.sh --destdir DIR --no-venv    # lay the files out under DIR (packaging, tests)
#
# Layout:
#   /opt/gpuguard                 virtual environment with gpuguard (sees Debian's bcc), docs, dashboard,
#                                 Sigma rules and log-shipping examples under share/
#   /usr/local/sbin/gpuguard      -> /opt/gpuguard/bin/gpuguard
#   /etc/gpuguard/agent.yaml      config, 0600 root; never overwritten: a newer default lands beside
#                                 it as agent.yaml.dist
#   /etc/systemd/system/gpuguard.service, /etc/logrotate.d/gpuguard
#   /etc/systemd/system/gpuguard.service.d/enforce.conf   with --enforce: CAP_KILL, CAP_NET_ADMIN
#   /var/log/gpuguard             the agent's log (0750)
#   /var/cache/gpuguard/probes    the probes compiled for this kernel (made by the preflight,
#                                 `gpuguard doctor`, which an install runs once; removed with gpuguard)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG="$ROOT/packaging"
DESTDIR=${DESTDIR:-}
PREFIX=/opt/gpuguard
action=install
venv=1
enable=0
purge=0
enforce=0

say() { printf 'gpuguard-install: %s\n' "$*" >&2; }
die() { printf 'gpuguard-install: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --uninstall) action=uninstall ;;
        --purge) purge=1 ;;
        --enable) enable=1 ;;
        --enforce) enforce=1 ;;
        --no-venv) venv=0 ;;
        --destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; DESTDIR=$2; shift ;;
        --destdir=*) DESTDIR=${1#--destdir=} ;;
        -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown option $1 (fix: see --help)" ;;
    esac
    shift
done

if [ -n "$DESTDIR" ]; then
    mkdir -p "$DESTDIR"
    DESTDIR=$(cd "$DESTDIR" && pwd)
    live=0          # a staged tree: never touch the running system
else
    [ "$(id -u)" -eq 0 ] || die "must run as root (fix: sudo bash packaging/install.sh $*)"
    live=1
fi
systemd_running() { [ "$live" -eq 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

# Copy src to dst with mode only when the content or mode differs (keeps mtimes stable on re-runs).
put() {
    local mode=$1 src=$2 dst=$3
    mkdir -p "$(dirname "$dst")"
    if [ -f "$dst" ] && cmp -s "$src" "$dst" && [ "$(stat -c %a "$dst")" = "$mode" ]; then
        return 0
    fi
    install -m "$mode" "$src" "$dst"
    say "installed $dst"
}

install_files() {
    local etc="$DESTDIR/etc" opt="$DESTDIR$PREFIX"
    if [ "$venv" -eq 1 ]; then
        [ -x "$opt/bin/python" ] || python3 -m venv --system-site-packages "$opt" \
            || die "could not create $opt (fix: apt-get install python3-venv)"
        "$opt/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$ROOT" \
            || die "pip install failed (fix: check access to PyPI, then run this again)"
        say "gpuguard installed in $opt"
    fi
    mkdir -p "$opt/share/doc" "$opt/share/sigma" "$opt/share/shipping" "$DESTDIR/usr/local/sbin"
    for doc in deploy.md siem.md; do put 644 "$ROOT/docs/$doc" "$opt/share/doc/$doc"; done
    put 644 "$PKG/grafana-dashboard.json" "$opt/share/grafana-dashboard.json"
    # Kustomize base and overlays, Prometheus alerting rules, Grafana provisioning: the tree as is.
    local f rel
    while IFS= read -r f; do
        rel=${f#"$PKG/"}
        put 644 "$f" "$opt/share/$rel"
    done < <(find "$PKG/kubernetes" "$PKG/prometheus" "$PKG/grafana" -type f 2>/dev/null | sort)
    for f in "$PKG"/sigma/*.yml; do put 644 "$f" "$opt/share/sigma/$(basename "$f")"; done
    for f in "$PKG"/shipping/*; do put 644 "$f" "$opt/share/shipping/$(basename "$f")"; done
    ln -sfn "$PREFIX/bin/gpuguard" "$DESTDIR/usr/local/sbin/gpuguard"

    install -d -m 755 "$etc/gpuguard"
    if [ ! -e "$etc/gpuguard/agent.yaml" ]; then
        put 600 "$PKG/agent.yaml" "$etc/gpuguard/agent.yaml"
        rm -f "$etc/gpuguard/agent.yaml.dist"
    elif ! cmp -s "$PKG/agent.yaml" "$etc/gpuguard/agent.yaml"; then
        # The operator's file wins; the new default sits beside it for a diff.
        put 600 "$PKG/agent.yaml" "$etc/gpuguard/agent.yaml.dist"
    fi
    put 644 "$PKG/gpuguard.service" "$etc/systemd/system/gpuguard.service"
    put 644 "$PKG/gpuguard-enforce.conf" "$opt/share/gpuguard-enforce.conf"
    if [ "$enforce" -eq 1 ]; then
        put 644 "$PKG/gpuguard-enforce.conf" "$etc/systemd/system/gpuguard.service.d/enforce.conf"
    fi
    put 644 "$PKG/gpuguard.logrotate" "$etc/logrotate.d/gpuguard"
    install -d -m 750 "$DESTDIR/var/log/gpuguard"

    if [ "$live" -eq 1 ] && [ -x "$opt/bin/gpuguard" ]; then
        # The preflight, once per install: it names what this node lacks, and its probe load
        # leaves the probes compiled for this kernel in /var/cache/gpuguard/probes, so the
        # service's first start loads them instead of compiling (docs/agent.md, "The probe cache").
        if "$opt/bin/gpuguard" doctor >/dev/null 2>&1; then
            say "preflight passed (gpuguard doctor): the full eBPF sensor loads; probes compiled for $(uname -r)"
        else
            say "gpuguard doctor found something missing (run it to see what): the agent may start in reduced mode"
        fi
    fi

    if systemd_running; then
        systemctl daemon-reload
        if [ "$enable" -eq 1 ]; then
            systemctl enable gpuguard.service
            systemctl restart gpuguard.service
            say "gpuguard.service enabled and (re)started; check it with: gpuguard status"
        elif systemctl is-active -q gpuguard.service; then
            systemctl restart gpuguard.service
            say "gpuguard.service restarted on the new version"
        else
            say "next: gpuguard selftest --own-agent, then systemctl enable --now gpuguard"
        fi
    fi
}

uninstall_files() {
    local etc="$DESTDIR/etc" opt="$DESTDIR$PREFIX"
    if systemd_running; then
        systemctl disable --now gpuguard.service 2>/dev/null || true
    fi
    if [ "$live" -eq 1 ] && [ -x "$opt/bin/gpuguard" ] && "$opt/bin/gpuguard" unblock --help >/dev/null 2>&1; then
        # Blocks are pinned in the kernel to outlive the agent; lift them before the program goes.
        "$opt/bin/gpuguard" unblock --all || say "could not lift every block (see: gpuguard blocks)"
    fi
    rm -f "$etc/systemd/system/gpuguard.service" "$etc/logrotate.d/gpuguard"
    rm -f "$etc/systemd/system/gpuguard.service.d/enforce.conf"
    rmdir "$etc/systemd/system/gpuguard.service.d" 2>/dev/null || true
    if [ -L "$DESTDIR/usr/local/sbin/gpuguard" ]; then rm -f "$DESTDIR/usr/local/sbin/gpuguard"; fi
    rm -rf "$opt" "$DESTDIR/var/cache/gpuguard"  # compiled probes, YARA verdicts: made again
    if [ "$purge" -eq 1 ]; then
        rm -rf "$etc/gpuguard" "$DESTDIR/var/log/gpuguard"
        say "removed gpuguard with its config and logs"
    else
        say "removed gpuguard; kept /etc/gpuguard and /var/log/gpuguard (--purge removes them)"
    fi
    if systemd_running; then systemctl daemon-reload; fi
}

case $action in
    install) install_files ;;
    uninstall) uninstall_files ;;
esac
