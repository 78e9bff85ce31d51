{#- kvm on a compute node: QEMU (qemu-system-x86, qemu-utils), genisoimage
    (seed ISOs), iptables and rsync; the VM network shared with lxc
    (makina-states.cloud.generic.compute_node.vm_network: bridge, NAT,
    forwarding); the kvm paths; and the boot service mccloud-kvm, which
    starts every VM directory holding an `autostart` file when the node
    boots and powers the guests down when it stops (an init.d script and a
    systemd unit of the same name: whichever init the node runs uses its
    own). No libvirt: QEMU runs each guest itself (-daemonize), the node's
    SLS start and stop it.

    Packages are installed only when missing: an installed qemu-system-x86
    is never touched (upgrade: true upgrades them). A qemu-utils newer than
    the release's qemu-system-x86 (Debian 12 with backports' qemu-utils)
    breaks its qemu-system-common: qemu-utils is then installed from the
    release alongside (a downgrade). Data: pillar mccloud (the node's
    settings: network, kvm_path, kvm_paths; upgrade). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- from "makina-states/cloud/kvm/vm/qemu.jinja" import IS_GUEST with context %}
{%- set d = job %}
include:
  - makina-states.cloud.generic.compute_node.vm_network

mccloud-kvm-pkgs:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        export DEBIAN_FRONTEND=noninteractive
        installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
        if [ "$MCCLOUD_UPGRADE" = 1 ]; then
            apt-get install -y -q --only-upgrade --no-install-recommends qemu-system-x86 genisoimage iptables rsync \
                >/dev/null || exit $?
            echo "changed=yes comment='kvm packages upgraded'"; exit 0
        fi
        set --
        for p in genisoimage iptables rsync; do installed "$p" || set -- "$@" "$p"; done
        extra=
        if ! installed qemu-system-x86; then
            set -- "$@" qemu-system-x86
            . /etc/os-release
            cand=$(apt-cache policy qemu-system-x86 | sed -n 's/^ *Candidate: //p')
            have=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null)
            if [ -n "$have" ] && [ -n "$cand" ] && dpkg --compare-versions "$have" gt "$cand"; then
                set -- "$@" "qemu-utils/$VERSION_CODENAME"
                extra=--allow-downgrades
            fi
        fi
        installed qemu-utils || set -- "$@" qemu-utils
        if [ "$#" = 0 ]; then echo "changed=no comment='QEMU, qemu-utils and genisoimage are installed'"; exit 0; fi
        apt-get install -y -q --no-install-recommends $extra "$@" >/dev/null || exit $?
        echo "changed=yes comment='installed: $*'"
    - env:
        MCCLOUD_UPGRADE: {{ ('1' if d.get('upgrade') else '') | tojson }}
    - require_in:
      - cmd: mccloud-lxc-nat

mccloud-kvm-path:
  file.directory:
    - failhard: true
    - names:
{%- for p in d.get('kvm_paths') or [d.kvm_path] %}
      - {{ (p ~ '/vms') | string | tojson }}
{%- endfor %}
    - makedirs: true
    - mode: '0700'

mccloud-kvm-paths:
  file.managed:
    - failhard: true
    - name: /etc/mccloud/kvm-paths
    - makedirs: true
    - contents: {{ ((d.get('kvm_paths') or [d.kvm_path]) | map('string') | join('\n') ~ '\n') | tojson }}

mccloud-kvm-boot-script:
  file.managed:
    - failhard: true
    - name: /usr/local/sbin/mccloud-kvm
    - mode: '0755'
    - contents: |
        #!/bin/sh
        # Managed by mccloud: the kvm guests of this node at its boot and
        # shutdown. "start" starts every VM directory <kvm_path>/vms/<vm>
        # holding an autostart file (its taps made again first), "stop"
        # powers every running guest down (ACPI through QMP, 60 s, then
        # SIGTERM), for each kvm path of /etc/mccloud/kvm-paths.
        PATHS=/etc/mccloud/kvm-paths
        {{ IS_GUEST | indent(8) }}
        running() {
            pid=$(cat "$1/qemu.pid" 2>/dev/null) && is_guest "$pid" "$2" "$1/qemu.pid"
        }
        start_one() {
            running "$1" "$2" && return 0
            bridge=$(cat "$1/bridge") || return 1
            while read -r tap; do
                [ -n "$tap" ] || continue
                ip link show "$tap" >/dev/null 2>&1 || ip tuntap add dev "$tap" mode tap || return 1
                ip link set "$tap" master "$bridge" up || return 1
            done < "$1/taps"
            rm -f "$1/qemu.pid"
            xargs -0 -x -a "$1/qemu.argv" sh -c 'exec "$@"' sh
        }
        stop_one() {
            running "$1" "$2" || return 0
            if command -v python3 >/dev/null; then
                python3 - "$1/qmp.sock" <<'PY' 2>/dev/null
        import json, socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(sys.argv[1])
        f = s.makefile("rwb")
        f.readline()
        for c in ("qmp_capabilities", "system_powerdown"):
            f.write(json.dumps({"execute": c}).encode() + b"\n")
            f.flush()
            f.readline()
        PY
            fi
            n=0
            while running "$1" "$2" && [ "$n" -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
            if running "$1" "$2"; then kill -TERM "$pid"; fi
        }
        rc=0
        for path in $(cat "$PATHS" 2>/dev/null); do
            for dir in "$path"/vms/*; do
                [ -f "$dir/domain.json" ] || continue
                name=${dir##*/}
                case "$1" in
                    start) [ -e "$dir/autostart" ] || continue
                           start_one "$dir" "$name" || { echo "mccloud-kvm: $name did not start" >&2; rc=1; } ;;
                    stop) stop_one "$dir" "$name" & ;;
                    status) running "$dir" "$name" && echo "$name running" || echo "$name stopped" ;;
                    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
                esac
            done
        done
        wait
        exit "$rc"

mccloud-kvm-initd:
  file.managed:
    - failhard: true
    - name: /etc/init.d/mccloud-kvm
    - mode: '0755'
    - contents: |
        #!/bin/sh
        ### BEGIN INIT INFO
        # Provides:          mccloud-kvm
        # Required-Start:    $network $remote_fs
        # Required-Stop:     $network $remote_fs
        # Default-Start:     2 3 4 5
        # Default-Stop:      0 1 6
        # Short-Description: mccloud kvm guests
        ### END INIT INFO
        # Managed by mccloud.
        case "$1" in
            start|stop|status) exec /usr/local/sbin/mccloud-kvm "$1" ;;
            restart|force-reload) /usr/local/sbin/mccloud-kvm stop; exec /usr/local/sbin/mccloud-kvm start ;;
            *) echo "usage: $0 start|stop|restart|status" >&2; exit 2 ;;
        esac
    - require:
      - file: mccloud-kvm-boot-script

mccloud-kvm-initd-enabled:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if ! command -v update-rc.d >/dev/null; then echo "changed=no comment='no update-rc.d on this node'"; exit 0; fi
        if ls /etc/rc2.d/S*mccloud-kvm >/dev/null 2>&1; then echo "changed=no comment='mccloud-kvm starts at boot'"; exit 0; fi
        update-rc.d mccloud-kvm defaults >/dev/null 2>&1 || exit $?
        echo "changed=yes comment='mccloud-kvm enabled at boot (init.d)'"
    - require:
      - file: mccloud-kvm-initd

mccloud-kvm-unit:
  file.managed:
    - failhard: true
    - name: /etc/systemd/system/mccloud-kvm.service
    - makedirs: true
    - contents: |
        # Managed by mccloud: the kvm guests of this node at its boot and shutdown.
        [Unit]
        Description=mccloud kvm guests (every VM directory holding an autostart file)
        Wants=network-online.target
        After=network-online.target networking.service

        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=/usr/local/sbin/mccloud-kvm start
        ExecStop=/usr/local/sbin/mccloud-kvm stop
        TimeoutStopSec=90

        [Install]
        WantedBy=multi-user.target
    - require:
      - file: mccloud-kvm-boot-script

mccloud-kvm-unit-enabled:
  file.symlink:
    - failhard: true
    - name: /etc/systemd/system/multi-user.target.wants/mccloud-kvm.service
    - target: /etc/systemd/system/mccloud-kvm.service
    - makedirs: true
    - require:
      - file: mccloud-kvm-unit
