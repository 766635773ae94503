#!/usr/bin/env bash
# Install latencyd as a system service (`make install-system`), after `make install`
# (or any `pip install .`) has put the latencyd command on PATH:
#
#   /etc/systemd/system/latencyd.service   the unit, ExecStart= the installed latencyd
#   /etc/dbus-1/system.d/org.latencyd.Daemon1.conf   who may own and call the bus name
#   /etc/tmpfiles.d/latencyd.conf          /run/latencyd (the journal of originals)
#   /etc/latencyd/latencyd.conf            the config (kept if it exists), profiles/ beside
#
# then reloads systemd and the system bus's policy and enables the service (it starts at
# the next boot, or now with `systemctl start latencyd`).
#
# LATENCYD=PATH uses that latencyd instead of the one on PATH. DESTDIR=DIR stages the
# files under DIR (a package build, a container image): the enable symlink is made there
# (systemctl --root) and nothing running is reloaded.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DESTDIR=${DESTDIR:-}
LATENCYD=${LATENCYD:-}

die() {
    echo "install-system: $*" >&2
    exit 1
}
# The latencyd to run: LATENCYD, else the one on PATH, else where `make install` puts it
# (looked up under DESTDIR when staging).
if [[ -z $LATENCYD && -z $DESTDIR ]]; then
    LATENCYD=$(command -v latencyd || true)
fi
for candidate in /usr/local/bin/latencyd /usr/bin/latencyd; do
    [[ -z $LATENCYD && -x $DESTDIR$candidate ]] && LATENCYD=$candidate
done
[[ -n $LATENCYD ]] ||
    die "no latencyd command (run 'make install' first, or set LATENCYD=/path/to/latencyd)"
[[ $LATENCYD == /* ]] || die "LATENCYD must be an absolute path: $LATENCYD"
[[ -x $DESTDIR$LATENCYD || -x $LATENCYD ]] || die "$LATENCYD is not an executable"
[[ -n $DESTDIR || $EUID -eq 0 ]] || die "run as root (or stage with DESTDIR=)"

unit=$DESTDIR/etc/systemd/system/latencyd.service
install -d -m 0755 "$(dirname "$unit")" "$DESTDIR/etc/dbus-1/system.d" \
    "$DESTDIR/etc/tmpfiles.d" "$DESTDIR/etc/latencyd/profiles"
# ExecStart= is the only line that depends on where latencyd was installed.
sed "s|^ExecStart=.*|ExecStart=$LATENCYD|" systemd/latencyd.service >"$unit.new"
chmod 0644 "$unit.new"
mv "$unit.new" "$unit"
install -m 0644 systemd/org.latencyd.Daemon1.conf "$DESTDIR/etc/dbus-1/system.d/"
install -m 0644 systemd/latencyd.tmpfiles.conf "$DESTDIR/etc/tmpfiles.d/latencyd.conf"
conf=$DESTDIR/etc/latencyd/latencyd.conf
[[ -e $conf ]] || install -m 0644 systemd/latencyd.conf "$conf"

if [[ -n $DESTDIR ]]; then
    systemctl --root="$DESTDIR" enable latencyd.service
    echo "install-system: staged under $DESTDIR (ExecStart=$LATENCYD)"
    exit 0
fi
if [[ -d /run/systemd/system ]]; then
    systemctl daemon-reload
    systemd-tmpfiles --create latencyd.conf
    # The bus reads its policy at start and on ReloadConfig.
    busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ReloadConfig ||
        echo "install-system: could not reload the system bus's policy: restart dbus" >&2
    systemctl enable latencyd.service
    echo "install-system: enabled (ExecStart=$LATENCYD); start it: systemctl start latencyd"
else
    systemctl --root=/ enable latencyd.service
    echo "install-system: installed and enabled; systemd is not running here, so nothing started"
fi
