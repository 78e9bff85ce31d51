{#- The VM's resolvers, written into its root filesystem from the compute
    node. A guest's resolv.conf is often a symlink (resolvconf,
    systemd-resolved): mccloud_rootfs replaces it with a file of its own,
    never writing through it. Data: the job's (vm, rootfs). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set lines = ['# Managed by mccloud'] %}
{%- for ns in d.vm.dnsservers %}{% do lines.append('nameserver ' ~ ns) %}{% endfor %}

mccloud-vm-resolv{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /etc/resolv.conf
    - root: {{ d.rootfs | string | tojson }}
    - contents: {{ (lines | join('\n') ~ '\n') | tojson }}
{%- endfor %}
