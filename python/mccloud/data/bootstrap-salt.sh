#!/bin/sh
# mccloud's Salt bootstrap: makes this host a minion of the controller.
#
# Run as root on the target (inside a VM, or on a bare-metal server over
# ssh), after the controller placed, for the minion's configuration
# directory (/etc/salt, or /etc/mastersalt with --mastersalt-minion):
#   minion.d/mccloud.conf    id, master, master_port (and the directories)
#   pki/minion/minion.pem    the minion's private key (generated and
#   pki/minion/minion.pub    accepted by the master beforehand)
#   pki/minion/minion_master.pub   the master's public key
#
# Salt itself: kept when already installed in $MCCLOUD_SALT_PREFIX (images
# built by mccloud carry it); otherwise installed into that virtualenv from
# the wheelhouse the controller prepared ($MCCLOUD_WHEELHOUSE: the wheels,
# SALT_VERSION, SHA256SUMS), with no network access.
#
# Arguments keep makina-states' boot-salt.sh meaning where they apply:
#   --mastersalt-minion   mastersalt mode: a minion in /etc/mastersalt
#                         (service mastersalt-minion), and a plain Salt for
#                         masterless `salt-call --local`, its daemons off
#   --install-only        install Salt, configure and start nothing (images)
#   -C, --from-salt-cloud, -no-M, -n, -b <branch>, -g <url>
#                         accepted and ignored (no prompt, no master is ever
#                         installed, the version is the wheelhouse's)
# Exit codes: 0 done, 2 bad arguments, 3 Salt cannot be installed here,
# 4 the minion's configuration or keys are missing, 5 the service failed.
set -eu

PREFIX=${MCCLOUD_SALT_PREFIX:-/opt/mccloud/salt}
WHEELHOUSE=${MCCLOUD_WHEELHOUSE:-/var/cache/mccloud/wheelhouse}
MODE=salt
INSTALL_ONLY=0

say() { echo "mccloud-bootstrap: $*" >&2; }
die() { code=$1; shift; say "$*"; exit "$code"; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --mastersalt-minion|--mastersalt) MODE=mastersalt ;;
        --install-only) INSTALL_ONLY=1 ;;
        -C|--from-salt-cloud|-no-M|--no-M|-n|--no-colors) ;;
        -b|--branch|-g|--url)
            [ "$#" -ge 2 ] || die 2 "$1 needs a value"
            shift ;;
        -*) say "unknown option $1, ignored" ;;
        *) die 2 "unexpected argument $1" ;;
    esac
    shift
done

install_salt() {
    if [ -x "$PREFIX/bin/salt-minion" ]; then
        # The version from pip's record, not from Python importing Salt
        # (a tenth of a second of CPU per VM, when many start at once).
        installed="an unknown version of Salt"
        for record in "$PREFIX"/lib/python3*/site-packages/salt-*.dist-info; do
            [ -d "$record" ] || continue
            record=${record##*/salt-}
            installed="Salt ${record%.dist-info}"
        done
        say "$installed already in $PREFIX"
        return 0
    fi
    [ -f "$WHEELHOUSE/SALT_VERSION" ] || die 3 "Salt is not installed in $PREFIX and there is no wheelhouse at $WHEELHOUSE (the controller's mc_cloud_controller.wheelhouse prepares it)"
    command -v python3 >/dev/null || die 3 "python3 is missing on this host: add it to the image (packages: python3, python3-venv)"
    python3 -c 'import ensurepip, venv' 2>/dev/null || die 3 "python3's venv module is missing on this host: install python3-venv"
    version=$(cat "$WHEELHOUSE/SALT_VERSION")
    (cd "$WHEELHOUSE" && sha256sum --quiet -c SHA256SUMS) || die 3 "the wheelhouse at $WHEELHOUSE does not match its SHA256SUMS"
    say "installing Salt $version into $PREFIX from $WHEELHOUSE"
    python3 -m venv "$PREFIX"
    "$PREFIX/bin/pip" install --quiet --no-index --find-links "$WHEELHOUSE" "salt==$version" \
        || die 3 "pip could not install salt==$version from $WHEELHOUSE (is the wheelhouse built for this host's Python and platform?)"
}

link_commands() {
    # Touch nothing that is already right: a copy-on-write clone keeps
    # sharing its template's files.
    mkdir -p /usr/local/bin
    for c in salt-call salt-minion; do
        if [ "$(readlink "/usr/local/bin/$c" 2>/dev/null)" != "$PREFIX/bin/$c" ]; then
            rm -f "/usr/local/bin/$c"
            ln -s "$PREFIX/bin/$c" "/usr/local/bin/$c"
        fi
    done
    wrapper=$(printf '#!/bin/sh\nexec %s/bin/salt-call -c /etc/mastersalt "$@"' "$PREFIX")
    if [ "$(cat /usr/local/bin/mastersalt-call 2>/dev/null)" != "$wrapper" ]; then
        printf '%s\n' "$wrapper" > /usr/local/bin/mastersalt-call
        chmod 755 /usr/local/bin/mastersalt-call
    fi
}

unit_text() {
    name=$1 conf=$2
    cat <<EOF
[Unit]
Description=Salt minion ($conf), installed by mccloud
After=network.target
# Starts once the controller placed the minion's key: an image carries the
# unit enabled, so its VMs start their minion at boot
ConditionPathExists=$conf/pki/minion/minion.pem

[Service]
Type=simple
ExecStart=$PREFIX/bin/salt-minion -c $conf
Restart=always
RestartSec=2
KillMode=process

[Install]
WantedBy=multi-user.target
EOF
}

# Writes the unit of service $1 (configuration $2) when it differs; prints
# "changed" when it did.
write_unit() {
    unit="/etc/systemd/system/$1.service"
    new=$(unit_text "$1" "$2")
    if [ "$(cat "$unit" 2>/dev/null)" = "$new" ]; then return 0; fi
    printf '%s\n' "$new" > "$unit.mccloud-new"
    mv -f "$unit.mccloud-new" "$unit"
    echo changed
}

# Images: both minions' units, enabled (the link systemctl enable makes,
# without a running systemd), each waiting for its key.
install_units() {
    [ -d /etc/systemd/system ] && [ -x /lib/systemd/systemd ] || return 0
    mkdir -p /etc/systemd/system/multi-user.target.wants
    for pair in salt-minion:/etc/salt mastersalt-minion:/etc/mastersalt; do
        write_unit "${pair%%:*}" "${pair#*:}" >/dev/null
        ln -sf "../${pair%%:*}.service" "/etc/systemd/system/multi-user.target.wants/${pair%%:*}.service"
    done
    say "minion units installed and enabled, each waiting for its key"
}

# Whether the running minion of service $1 (configuration $2) started after
# its configuration and keys were last written: then it has them.
current() {
    pid=$(systemctl show -p MainPID --value "$1" 2>/dev/null || echo 0)
    [ "${pid:-0}" != 0 ] && [ -d "/proc/$pid" ] || return 1
    [ -z "$(find "$2/minion" "$2/minion.d" "$2/pki/minion" -type f ! -empty -newer "/proc/$pid" 2>/dev/null \
        | head -n 1)" ]
}

service_up() {
    name=$1 conf=$2
    if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
        # a container that has just started: its systemd may not answer yet
        n=0
        until systemctl show -p Version >/dev/null 2>&1; do
            n=$((n + 1))
            [ "$n" -lt 300 ] || die 5 "systemd does not answer systemctl after 30 s"
            sleep 0.1
        done
        if [ -n "$(write_unit "$name" "$conf")" ]; then
            systemctl daemon-reload
            restart=1
        elif current "$name" "$conf"; then
            restart=0
        else
            restart=1
        fi
        systemctl enable "$name.service" >/dev/null 2>&1 || die 5 "systemctl enable $name failed"
        if [ "$restart" = 1 ]; then
            systemctl restart "$name.service" || die 5 "systemctl restart $name failed"
            say "$name started ($conf)"
        else
            # started at boot with its keys in place: it is already connecting
            systemctl start "$name.service" || die 5 "systemctl start $name failed"
            say "$name running ($conf)"
        fi
    else
        cat > "/etc/init.d/$name" <<EOF
PID=/run/$name.pid
case "\$1" in
    start) start-stop-daemon --start --quiet --background --make-pidfile --pidfile \$PID \\
               --startas $PREFIX/bin/salt-minion -- -c $conf ;;
    stop) start-stop-daemon --stop --quiet --oknodo --retry 10 --pidfile \$PID; rm -f \$PID ;;
    restart) "\$0" stop; "\$0" start ;;
    status) start-stop-daemon --status --pidfile \$PID ;;
    *) echo "usage: \$0 start|stop|restart|status" >&2; exit 2 ;;
esac
EOF
        chmod 755 "/etc/init.d/$name"
        if command -v update-rc.d >/dev/null; then update-rc.d "$name" defaults >/dev/null 2>&1 || true; fi
        "/etc/init.d/$name" restart || die 5 "/etc/init.d/$name restart failed"
        say "$name started ($conf)"
    fi
}

install_salt
link_commands
if [ "$INSTALL_ONLY" = 1 ]; then install_units; exit 0; fi

if [ "$MODE" = mastersalt ]; then conf=/etc/mastersalt name=mastersalt-minion; else conf=/etc/salt name=salt-minion; fi
for f in minion.d/mccloud.conf pki/minion/minion.pem pki/minion/minion.pub pki/minion/minion_master.pub; do
    [ -s "$conf/$f" ] || die 4 "$conf/$f is missing: the controller places the minion's configuration and keys before running this script"
done
[ -e "$conf/minion" ] || : > "$conf/minion"
chmod 700 "$conf/pki/minion"
chmod 400 "$conf/pki/minion/minion.pem"
service_up "$name" "$conf"
