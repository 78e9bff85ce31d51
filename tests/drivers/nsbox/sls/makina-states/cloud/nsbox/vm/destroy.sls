{#- Destroy an nsbox guest: stop its service, delete its namespace (which
    deletes both ends of its veth) and its root directory. Data: pillar
    mccloud:destroy (rootfs, netns). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job['destroy'] %}
mccloud-nsbox-service-stop:
  cmd.run:
    - name: start-stop-daemon --stop --retry 5 --pidfile "$PIDFILE" --remove-pidfile
    - onlyif: start-stop-daemon --status --pidfile "$PIDFILE"
    - env:
        PIDFILE: {{ (d.rootfs ~ '/service.pid') | tojson }}

mccloud-nsbox-netns-del:
  cmd.run:
    - name: ip netns del "$NS"
    - onlyif: test -e "/run/netns/$NS"
    - env:
        NS: {{ d.netns | tojson }}
    - require:
      - cmd: mccloud-nsbox-service-stop

mccloud-nsbox-root-absent:
  file.absent:
    - name: {{ d.rootfs | tojson }}
    - require:
      - cmd: mccloud-nsbox-service-stop
