{#- One managed block in the hosts file: `<vm ip> <domain>` for every domain
    of every VM of the node. Rewritten whole, so removed VMs disappear. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set lines = [] %}
{%- for vm, v in d.vms | dictsort %}
{%- for dom in v.domains %}
{%- do lines.append(v.ip ~ ' ' ~ dom) %}
{%- endfor %}
{%- endfor %}
mccloud-hosts:
  file.blockreplace:
    - failhard: true
    - name: {{ d.conf.hosts_file | tojson }}
    - marker_start: {{ ('# mccloud: VMs of ' ~ d.target ~ ' -- managed, do not edit') | tojson }}
    - marker_end: {{ ('# mccloud: end of VMs of ' ~ d.target) | tojson }}
    - content: {{ (lines | join('\n') ~ ('\n' if lines else '')) | tojson }}
    - append_if_not_found: true
    - show_changes: true
