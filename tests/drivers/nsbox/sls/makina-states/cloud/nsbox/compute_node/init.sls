{#- nsbox on a compute node: the guests' bridge carrying the gateway
    address, and the guest service. Data: the job's (job.jinja) (node data). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set n = d.network %}
mccloud-nsbox-bridge:
  cmd.run:
    - name: |
        set -e
        ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
        ip -o addr show dev "$BRIDGE" | grep -qF -e " $ADDRESS " || ip addr add "$ADDRESS" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    - unless: ip -o addr show dev "$BRIDGE" 2>/dev/null | grep -qF -e " $ADDRESS " && ip -o link show "$BRIDGE" | grep -q ",UP"
    - env:
        BRIDGE: {{ n.bridge | string | tojson }}
        ADDRESS: {{ (n.gateway ~ '/' ~ n.netmask) | tojson }}

mccloud-nsbox-guest-service:
  file.managed:
    - name: /etc/mccloud/nsbox-guest.py
    - source: salt://makina-states/cloud/nsbox/guest.py
    - makedirs: true
