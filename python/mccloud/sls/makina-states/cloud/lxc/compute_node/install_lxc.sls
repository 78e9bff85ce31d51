{#- LXC on a compute node: Debian packages, the VM bridge carrying the
    gateway address, IP forwarding and NAT of the VM network towards the
    outside. Data: pillar mccloud (the node's settings from the registry). #}
{%- set d = pillar['mccloud'] %}
{%- set n = d.network %}
{%- set br = n.bridge %}
{%- set cidr = n.network ~ '/' ~ n.netmask %}
mccloud-lxc-pkgs:
  pkg.{{ 'latest' if d.get('upgrade') else 'installed' }}:
    - pkgs:
      - lxc
      - iptables
      - rsync

mccloud-lxc-path:
  file.directory:
    - name: {{ d.lxc_path }}
    - makedirs: true
    - mode: '0755'

mccloud-lxc-bridge:
  cmd.run:
    - name: |
        ip link show {{ br }} >/dev/null 2>&1 || ip link add {{ br }} type bridge
        ip -o addr show dev {{ br }} | grep -q " {{ n.gateway }}/{{ n.netmask }} " || ip addr add {{ n.gateway }}/{{ n.netmask }} dev {{ br }}
        ip link set {{ br }} up
    - unless: >-
        ip -o addr show dev {{ br }} 2>/dev/null | grep -q " {{ n.gateway }}/{{ n.netmask }} "
        && ip -o link show {{ br }} | grep -q ",UP"

mccloud-lxc-bridge-boot:
  file.managed:
    - name: /etc/network/interfaces.d/mccloud-{{ br }}
    - makedirs: true
    - contents: |
        # Managed by mccloud: the VM bridge of this compute node.
        auto {{ br }}
        iface {{ br }} inet static
            address {{ n.gateway }}/{{ n.netmask }}
            bridge_ports none
            bridge_fd 0
            post-up iptables -t nat -C POSTROUTING -s {{ cidr }} ! -d {{ cidr }} -j MASQUERADE 2>/dev/null || iptables -t nat -A POSTROUTING -s {{ cidr }} ! -d {{ cidr }} -j MASQUERADE

mccloud-lxc-ip-forward:
  sysctl.present:
    - name: net.ipv4.ip_forward
    - value: 1
    - config: /etc/sysctl.d/60-mccloud-lxc.conf

mccloud-lxc-nat:
  cmd.run:
    - name: iptables -t nat -A POSTROUTING -s {{ cidr }} ! -d {{ cidr }} -j MASQUERADE
    - unless: iptables -t nat -C POSTROUTING -s {{ cidr }} ! -d {{ cidr }} -j MASQUERADE
    - require:
      - pkg: mccloud-lxc-pkgs
