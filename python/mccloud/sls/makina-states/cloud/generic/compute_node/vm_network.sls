{#- The VM network of a compute node, shared by the drivers whose guests sit
    on the node's bridge (lxc, kvm): the bridge carrying the gateway
    address, its boot stanza, IP forwarding and NAT of the VM network
    towards the outside. Data: pillar mccloud (the node's settings from the
    registry: network). Commands and scripts are static: they read the
    bridge, the address and the network from their environment. The state
    ids are those the lxc install always had (drift and operators name
    them). The including SLS makes mccloud-lxc-nat require its packages
    (iptables). #}
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
      - file: mccloud-lxc-nat-script
