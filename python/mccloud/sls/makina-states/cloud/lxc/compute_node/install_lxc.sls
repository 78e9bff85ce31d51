{#- LXC on a compute node: Debian packages, the VM bridge carrying the
    gateway address, IP forwarding and NAT of the VM network towards the
    outside. Data: pillar mccloud (the node's settings from the registry).
    Commands and scripts are static: they read the bridge, the address and
    the network from their environment. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set n = d.network %}
{%- set br = n.bridge | string %}
{%- set address = n.gateway ~ '/' ~ n.netmask %}
{%- set cidr = n.network ~ '/' ~ n.netmask %}
{#- ifupdown runs its methods through a shell with the stanza's values
    substituted: the boot stanza is written only for plain values. #}
{%- set ipv4 = '(?:[0-9]{1,3}[.]){3}[0-9]{1,3}' %}
{%- set mask = '(?:[0-9]{1,2}|' ~ ipv4 ~ ')' %}
{%- set plain = (br | regex_match('([A-Za-z0-9_.-]{1,15})\\Z'))
                and (address | regex_match('(' ~ ipv4 ~ '/' ~ mask ~ ')\\Z'))
                and (cidr | regex_match('(' ~ ipv4 ~ '/' ~ mask ~ ')\\Z')) and true or false %}
mccloud-lxc-pkgs:
  pkg.{{ 'latest' if d.get('upgrade') else 'installed' }}:
    - failhard: true
    - pkgs:
      - lxc
      - iptables
      - rsync

{#- Unprivileged containers: root may map the blocks of host ids the
    registry hands out (lxc uses newuidmap and newgidmap, which read these
    files, when the uidmap package is installed). root's line covers what
    the node needs (count, from the core: its unprivileged VMs or its
    capacity); it is checked first against the other owners' lines and
    useradd's subordinate ids (/etc/login.defs), and the deploy fails,
    naming the owner and the range, before anything is written. The line
    starting at the range start is root's (replaced when the node grows);
    an operator's other lines are kept. #}
{%- set ids = d.get('idmap_range') or {} %}
{%- if ids %}
{%- for f in ['subuid', 'subgid'] %}

mccloud-lxc-{{ f }}:
  mccloud_subids.root_range:
    - failhard: true
    - name: /etc/{{ f }}
    - start: {{ ids.start | int }}
    - count: {{ ids.get('count', 0) | int }}
    - allow_login_defs_range: {{ ids.get('allow_login_defs_range') is sameas true }}
{%- endfor %}
{%- endif %}

mccloud-lxc-path:
  file.directory:
    - failhard: true
    - name: {{ d.lxc_path | tojson }}
    - makedirs: true
    - mode: '0755'

mccloud-lxc-bridge:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if ip -o addr show dev "$MCCLOUD_BRIDGE" 2>/dev/null | grep -qF -e " $MCCLOUD_ADDRESS " &&
                ip -o link show "$MCCLOUD_BRIDGE" | grep -q ",UP"; then
            echo "changed=no comment='bridge $MCCLOUD_BRIDGE is up with $MCCLOUD_ADDRESS'"; exit 0
        fi
        set -e
        ip link show "$MCCLOUD_BRIDGE" >/dev/null 2>&1 || ip link add "$MCCLOUD_BRIDGE" type bridge
        ip -o addr show dev "$MCCLOUD_BRIDGE" | grep -qF -e " $MCCLOUD_ADDRESS " || ip addr add "$MCCLOUD_ADDRESS" dev "$MCCLOUD_BRIDGE"
        ip link set "$MCCLOUD_BRIDGE" up
        echo "changed=yes comment='bridge $MCCLOUD_BRIDGE brought up with $MCCLOUD_ADDRESS'"
    - env:
        MCCLOUD_BRIDGE: {{ br | tojson }}
        MCCLOUD_ADDRESS: {{ address | tojson }}

mccloud-lxc-nat-script:
  file.managed:
    - failhard: true
    - name: /etc/mccloud/lxc-nat.sh
    - makedirs: true
    - mode: '0755'
    - contents: |
        #!/bin/sh
        # Managed by mccloud: NAT of the VM network towards the outside. The
        # network (CIDR) comes from MCCLOUD_NAT_CIDR, or from the bridge
        # stanza's mccloud-nat-cidr option (ifupdown exports it as
        # IF_MCCLOUD_NAT_CIDR). "lxc-nat.sh check" only tells whether the
        # rule is in place.
        set -eu
        cidr=${MCCLOUD_NAT_CIDR:-${IF_MCCLOUD_NAT_CIDR:-}}
        if [ -z "$cidr" ]; then echo "lxc-nat.sh: no network given" >&2; exit 2; fi
        mode=${1:-apply}
        set -- POSTROUTING -s "$cidr" ! -d "$cidr" -j MASQUERADE
        if iptables -t nat -C "$@" 2>/dev/null; then exit 0; fi
        if [ "$mode" = check ]; then exit 1; fi
        iptables -t nat -A "$@"

mccloud-lxc-bridge-boot-values:
  test.configurable_test_state:
    - failhard: true
    - name: the bridge's boot stanza holds plain values
    - changes: false
    - result: {{ plain }}
    - allow_test_mode_failure: true
    - comment: {{ ('the bridge name, gateway, netmask and network are plain values' if plain else
                   'not writing the boot stanza of the VM bridge: its name must be an interface name and the gateway, netmask and network IPv4 values (ifupdown passes them to a shell)') | tojson }}

mccloud-lxc-bridge-boot:
  file.managed:
    - failhard: true
    - name: {{ ('/etc/network/interfaces.d/mccloud-' ~ br) | tojson }}
    - makedirs: true
    - contents: {{ ('# Managed by mccloud: the VM bridge of this compute node.\n'
                    ~ 'auto ' ~ br ~ '\n'
                    ~ 'iface ' ~ br ~ ' inet static\n'
                    ~ '    address ' ~ address ~ '\n'
                    ~ '    bridge_ports none\n'
                    ~ '    bridge_fd 0\n'
                    ~ '    mccloud-nat-cidr ' ~ cidr ~ '\n'
                    ~ '    post-up /etc/mccloud/lxc-nat.sh\n') | tojson }}
    - require:
      - test: mccloud-lxc-bridge-boot-values
      - file: mccloud-lxc-nat-script

mccloud-lxc-ip-forward:
  sysctl.present:
    - failhard: true
    - name: net.ipv4.ip_forward
    - value: 1
    - config: /etc/sysctl.d/60-mccloud-lxc.conf

mccloud-lxc-nat:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if /etc/mccloud/lxc-nat.sh check; then echo "changed=no comment='NAT rule in place'"; exit 0; fi
        /etc/mccloud/lxc-nat.sh || exit $?
        echo "changed=yes comment='NAT rule added'"
    - env:
        MCCLOUD_NAT_CIDR: {{ cidr | tojson }}
    - require:
      - pkg: mccloud-lxc-pkgs
      - file: mccloud-lxc-nat-script
