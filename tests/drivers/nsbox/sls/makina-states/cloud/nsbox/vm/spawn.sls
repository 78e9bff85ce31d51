{#- Spawn an nsbox guest: a network namespace with one veth on the node's
    bridge (the VM's MAC and IP from the registry, the gateway as default
    route), a root directory, and the guest service started inside the
    namespace. Data: the job's (job.jinja) (vm, rootfs, netns, veth, bridge). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set v = d.vm %}
mccloud-nsbox-root:
  file.directory:
    - name: {{ d.rootfs | tojson }}
    - makedirs: true

mccloud-nsbox-netns:
  cmd.run:
    - name: |
        set -e
        ip netns add "$NS"
        ip link add "$VETH" type veth peer name "$VETH"g
        ip link set "$VETH"g netns "$NS"
        ip link set "$VETH" master "$BRIDGE" up
        ip -n "$NS" link set "$VETH"g name eth0
        ip -n "$NS" link set eth0 address "$MAC"
        ip -n "$NS" addr add "$ADDRESS" dev eth0
        ip -n "$NS" link set lo up
        ip -n "$NS" link set eth0 up
        ip -n "$NS" route add default via "$GATEWAY"
    - unless: test -e "/run/netns/$NS"
    - env:
        NS: {{ d.netns | tojson }}
        VETH: {{ d.veth | tojson }}
        BRIDGE: {{ d.bridge | string | tojson }}
        MAC: {{ v.mac | string | tojson }}
        ADDRESS: {{ (v.ip ~ '/' ~ v.netmask) | tojson }}
        GATEWAY: {{ v.gateway | string | tojson }}

mccloud-nsbox-service:
  cmd.run:
    - name: >-
        start-stop-daemon --start --background --make-pidfile --pidfile "$PIDFILE"
        --startas /usr/bin/env -- ip netns exec "$NS" python3 /etc/mccloud/nsbox-guest.py
    - unless: start-stop-daemon --status --pidfile "$PIDFILE"
    - env:
        NS: {{ d.netns | tojson }}
        PIDFILE: {{ (d.rootfs ~ '/service.pid') | tojson }}
        NSBOX_NAME: {{ v.name | string | tojson }}
    - require:
      - cmd: mccloud-nsbox-netns
      - file: mccloud-nsbox-root
