{#- One managed block in the hosts file: `<vm ip> <domain>` for every domain
    of every VM of the node. Rewritten whole, so removed VMs disappear. #}
{%- set d = pillar['mccloud'] %}
mccloud-hosts:
  file.blockreplace:
    - name: {{ d.conf.hosts_file }}
    - marker_start: "# mccloud: VMs of {{ d.target }} -- managed, do not edit"
    - marker_end: "# mccloud: end of VMs of {{ d.target }}"
    - content: |
        {%- for vm, v in d.vms | dictsort %}
        {%- for dom in v.domains %}
        {{ v.ip }} {{ dom }}
        {%- endfor %}
        {%- endfor %}
    - append_if_not_found: true
    - show_changes: true
