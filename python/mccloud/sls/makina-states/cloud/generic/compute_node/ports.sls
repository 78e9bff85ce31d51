{#- The reverse-proxy port ranges are reserved from the kernel's ephemeral
    ports, so no outgoing connection can take a VM's port. Applied before
    the reverse proxy (see reverse_proxy.sls for ports taken earlier). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
mccloud-reserved-ports:
  sysctl.present:
    - failhard: true
    - name: net.ipv4.ip_local_reserved_ports
    - value: {{ d.reserved_ports | string | tojson }}
    - config: {{ d.conf.sysctl_file | tojson }}
